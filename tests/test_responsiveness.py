"""Thread mode keeps the event loop free: during a whole run (job creation, start, epochs,
validation, checkpoints, the end of the run with its results, reports and trackers) the
loop's thread is never found running ``core`` code for long.

Two email-sequence trainings (the example, on the CPU; in threads, then each in a training
process of its own) run beside the stall detector of
``tests/stalls.py``: one an ``async with`` resource, built in a worker thread, the other
made by the synchronous seed factory, which builds its parts on the calling thread (here
the loop's: the one legitimate stretch of ``core`` on it, a few milliseconds for this
model). The assertion is about where work runs, not about timings: the longest stretch of
consecutive stack samples that found the loop thread inside ``core`` stays under 50 ms.
Lateness of the heartbeat depends on the machine and is only shown when the test fails.
``python -m benchmarks.responsiveness --trace-stalls`` measures the same with timings.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
import torch
from torch.utils.data import DataLoader

from core import (
    OptimConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
    create_optimized_training_optimizer,
)
from core.checkpointing.config import CheckpointConfig
from core.checkpointing.manifest import hash_file
from core.trackers import CSVLogger
from core.trainer.state.results import TrainingResults
from examples.email_sequence import EmailSequenceDataset, EmailSequenceModel
from tests.stalls import watch_loop

pytestmark = pytest.mark.anyio

LONGEST_IN_CORE_S = 0.05
EPOCHS = 3


def _config(index: int, log_dir: Path, isolation: str) -> TrainingConfig:
    return TrainingConfig(
        run=RunConfig(
            experiment_name=f"loop-{index}",
            max_epochs=EPOCHS,
            log_dir=log_dir,
            seed=index,
            val_every_n_steps=6,
            isolation=isolation,
        ),
        optim=OptimConfig(learning_rate=3e-3, max_grad_norm=1.0),
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=5, save_best=True),
    )


async def _train(index: int, log_dir: Path, results: list[TrainingResults], isolation: str) -> None:
    train_set, val_set = EmailSequenceDataset(384, seed=0), EmailSequenceDataset(128, seed=1)
    torch.manual_seed(index)
    model = EmailSequenceModel(
        vocab_size=train_set.vocab_size,
        max_emails=train_set.max_emails,
        subject_len=train_set.subject_len,
    )
    train = DataLoader(train_set, batch_size=32, shuffle=True)
    val = DataLoader(val_set, batch_size=128)
    config, callbacks = _config(index, log_dir, isolation), [CSVLogger()]
    if index == 0:
        async with OptimizedTrainingOptimizer(
            config, model=model, train_loader=train, val_loader=val, callbacks=callbacks
        ) as run:
            results.append(await run.train())
        return
    job = create_optimized_training_optimizer(
        model=model, train_loader=train, val_loader=val, config=config, callbacks=callbacks
    )
    try:
        results.append(await job.train())
    finally:
        await job.aclose()


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_two_trainings_never_hold_the_loop_thread_in_core(
    log_dir: Path, isolation: str
) -> None:
    results: list[TrainingResults] = []
    async with watch_loop() as watch, anyio.create_task_group() as tg:
        for index in range(2):
            tg.start_soon(_train, index, log_dir, results, isolation)
    assert [r.epochs_completed for r in results] == [EPOCHS, EPOCHS]
    assert len(watch.samples) > 100, watch.summary()  # the sampler saw the whole run
    # Starting a run leaves the loop thread almost nothing of core's to run: the sampler may
    # find none at all (test_the_sampler_finds_core_code_on_the_loop_thread checks it can).
    longest = watch.longest_in_core()
    assert longest is None or longest.duration_s < LONGEST_IN_CORE_S, watch.summary()


async def test_the_sampler_finds_core_code_on_the_loop_thread(tmp_path: Path) -> None:
    """The stall detector's own check: core code running on the loop thread is found there
    and named."""
    data = tmp_path / "data"
    data.write_bytes(bytes(64 << 20))
    async with watch_loop() as watch:
        await anyio.sleep(0.02)
        started = time.perf_counter()
        hash_file(data)  # one call of core code, on the loop thread
        took_s = time.perf_counter() - started
        await anyio.sleep(0.02)
    longest = watch.longest_in_core()
    assert longest is not None, watch.summary()
    assert any("hash_file" in where for where in longest.where), (took_s, watch.summary())
