"""Scenarios run by real torchrun jobs (2 gloo processes) for tests/test_multi_gpu_training.py.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/distributed_jobs.py \
        --out DIR ddp_fp32 ddp_bf16 ...

Each scenario writes ``DIR/<scenario>.rank<R>.pt`` (final full weights, the sample indices the
model saw per epoch, the results); the tests compare them with single-process runs built by
the same functions below.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core import GradientAccumulationConfig, MultiGPUConfig, create_optimized_training_optimizer  # noqa: E402
from core.errors import (  # noqa: E402
    CoreError,
    SignalReceived,
    UnevenLoadersError,
)
from core.loop.recovery import ErrorHandlerConfig  # noqa: E402
from core.multi_gpu_training import MultiGPUTrainer, setup_distributed_environment  # noqa: E402
from tests.helpers import TokenModel, padded_sequences  # noqa: E402
from tests.moe_jobs import MOE_SCENARIOS  # noqa: E402

FEATURES = 8


class IndexedData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Features with the sample index appended as a last column, so a model can record it."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = (self.x[:, 0] - self.x[:, 2] > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([self.x[i], torch.tensor([float(i)])]), self.y[i]


class Recorder(nn.Module):
    """An MLP in a ModuleList (FSDP2 shards each block) that records the indices it trains on."""

    def __init__(self, seed: int = 3) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh()), nn.Linear(16, 2)]
        )
        self.seen: list[int] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.extend(int(i) for i in inputs[:, -1])
        x = inputs[:, :-1]
        for block in self.blocks:
            x = block(x)
        return x


def interleaved(n: int, world_size: int, per_rank_batch: int) -> list[int]:
    """The order in which one process must see samples so that its batch k, split into
    ``world_size`` micro-batches, holds exactly the ranks' batches k (DistributedSampler
    without shuffle gives rank r the indices r, r + W, r + 2W, ...)."""
    shards = [list(range(r, n, world_size)) for r in range(world_size)]
    order: list[int] = []
    for start in range(0, len(shards[0]), per_rank_batch):
        for shard in shards:
            order.extend(shard[start : start + per_rank_batch])
    return order


def run_job(
    *,
    batch_size: int,
    n: int = 96,
    val_n: int = 37,
    epochs: int = 2,
    mode: str = "auto",
    shuffle: bool = False,
    order: list[int] | None = None,
    log_dir: Path,
    **kwargs: Any,
) -> tuple[Recorder, Any, Any]:
    """One training job; the same call runs under torchrun (per-rank batch) or alone."""
    model = Recorder()
    data = IndexedData(n)
    loader = (
        DataLoader(data, batch_size=batch_size, sampler=order)
        if order is not None
        else DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    )
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=loader,
        val_loader=DataLoader(IndexedData(val_n, seed=1), batch_size=8),
        max_epochs=epochs,
        learning_rate=1e-2,
        log_dir=log_dir,
        experiment_name=kwargs.pop("experiment_name", "dist"),
        multi_gpu_config=kwargs.pop("multi_gpu_config", None) or MultiGPUConfig(training_mode=mode),  # type: ignore[arg-type]
        seed=0,
        **kwargs,
    )
    results = anyio.run(optimizer.train)
    weights = optimizer._built.strategy.model_state_dict(optimizer.model)
    optimizer.close()
    return model, results, weights


def _save(out: Path, name: str, rank: int, model: Recorder, results: Any, weights: Any) -> None:
    torch.save(
        {"weights": weights, "seen": model.seen, "results": results.to_dict()},
        out / f"{name}.rank{rank}.pt",
    )


def scenario(fn: Callable[[Path, int], None]) -> Callable[[Path, int], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


SCENARIOS: dict[str, Callable[[Path, int], None]] = {}


@scenario
def ddp_fp32(out: Path, rank: int) -> None:
    _save(out, "ddp_fp32", rank, *run_job(batch_size=8, log_dir=out / "logs"))


@scenario
def seed004_train(out: Path, rank: int) -> None:
    """Seed 004's own path: setup_dataloader + initialize_training + await trainer.train()."""
    trainer = MultiGPUTrainer(MultiGPUConfig(training_mode="auto"))
    trainer.setup_dataloader(IndexedData(96), batch_size=8, shuffle=False, num_workers=0)
    model = Recorder()
    trainer.initialize_training(model)

    async def train() -> Any:
        return await trainer.train(
            max_epochs=2,
            learning_rate=1e-2,
            seed=0,
            log_dir=out / "logs",
            experiment_name="seed004",
            progress=False,
        )

    results = anyio.run(train)
    summary = trainer.get_performance_summary()
    torch.save(
        {
            "weights": model.state_dict(),
            "seen": model.seen,
            "results": results.to_dict(),
            "mode": trainer.training_mode,
            "samples": summary["samples"],
        },
        out / f"seed004_train.rank{rank}.pt",
    )
    trainer.cleanup()


@scenario
def ddp_bf16(out: Path, rank: int) -> None:
    _save(out, "ddp_bf16", rank, *run_job(batch_size=8, amp_dtype="bf16", log_dir=out / "logs"))


@scenario
def ddp_accum(out: Path, rank: int) -> None:
    # 100 samples: 50 per rank in batches 8x6 + 2, windows of 3, 3 and a short 1.
    job = run_job(
        batch_size=8,
        n=100,
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=3),
        log_dir=out / "logs",
    )
    _save(out, "ddp_accum", rank, *job)


@scenario
def ddp_shuffle(out: Path, rank: int) -> None:
    # 97 samples over 2 ranks: the sampler pads one duplicate; the order changes per epoch.
    _save(
        out, "ddp_shuffle", rank, *run_job(batch_size=8, n=97, shuffle=True, log_dir=out / "logs")
    )


@scenario
def fsdp_fp32(out: Path, rank: int) -> None:
    _save(out, "fsdp_fp32", rank, *run_job(batch_size=8, mode="fsdp", log_dir=out / "logs"))


@scenario
def fsdp_bf16_policy(out: Path, rank: int) -> None:
    # FSDP2 with a MixedPrecisionPolicy in bf16: trains (no equality claim: bf16 params).
    config = MultiGPUConfig(training_mode="fsdp", fsdp_mixed_precision=True)
    model, results, weights = run_job(
        batch_size=8, epochs=3, amp_dtype="bf16", log_dir=out / "logs", multi_gpu_config=config
    )
    _save(out, "fsdp_bf16_policy", rank, model, results, weights)


@scenario
def fsdp_resume(out: Path, rank: int) -> None:
    # One epoch, a torch.distributed.checkpoint at its end, then a new job resumes for the
    # second: the weights must equal fsdp_fp32's two uninterrupted epochs.
    common: dict[str, Any] = {"batch_size": 8, "mode": "fsdp", "log_dir": out / "resume_logs"}
    run_job(epochs=1, experiment_name="fsdp_resume", **common)
    _save(
        out,
        "fsdp_resume",
        rank,
        *run_job(epochs=2, resume="auto", experiment_name="fsdp_resume", **common),
    )


@scenario
def ddp_sync_bn(out: Path, rank: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES + 1, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)
    )
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(IndexedData(96), batch_size=8),
        max_epochs=1,
        log_dir=out / "logs",
        experiment_name="sync_bn",
        multi_gpu_config=MultiGPUConfig(training_mode="distributed", sync_bn=True),
    )
    anyio.run(optimizer.train)
    inner = optimizer._built.strategy.unwrap(optimizer.model)
    norms = [m for m in inner.modules() if isinstance(m, nn.SyncBatchNorm)]
    torch.save(
        {"sync_bn": len(norms), "running_mean": norms[0].running_mean.clone() if norms else None},
        out / f"ddp_sync_bn.rank{rank}.pt",
    )
    optimizer.close()


@scenario
def early_stop(out: Path, rank: int) -> None:
    # A zero learning rate keeps the metric flat. Rank 0 has patience 1, rank 1 patience 50:
    # rank 0's decision must stop both ranks after 2 epochs.
    job = run_job(
        batch_size=8,
        epochs=6,
        early_stopping_patience=1 if rank == 0 else 50,
        early_stopping_min_delta=1e-3,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
        log_dir=out / "logs",
    )
    _save(out, "early_stop", rank, *job)


@scenario
def cancel_rank1(out: Path, rank: int) -> None:
    # Rank 1 cancels its own train() after step 5; rank 0 is not cancelled. Both must stop
    # at the same step boundary, and neither may hang in a collective.
    model = Recorder()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(IndexedData(8000), batch_size=8),
        max_epochs=1,
        log_dir=out / "logs",
        experiment_name="cancel",
    )
    outcome: dict[str, Any] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def cancel_after_step_5() -> None:
                while optimizer.global_step < 5:
                    await anyio.sleep(0.001)
                if rank == 1:
                    tg.cancel_scope.cancel()

            tg.start_soon(cancel_after_step_5)
            results = await optimizer.train()
            outcome["interrupted"] = results.interrupted
            tg.cancel_scope.cancel()

    anyio.run(main)
    optimizer.close()
    outcome["global_step"] = optimizer.global_step
    outcome["cancelled"] = "interrupted" not in outcome
    torch.save(outcome, out / f"cancel_rank1.rank{rank}.pt")


class CancelsOnFirstRead(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A validation set whose first read cancels ``task`` (natively, as ``task.cancel()`` from
    the event loop does): the cancellation lands while the step thread validates at an
    epoch's end, between two stop votes."""

    def __init__(self, data: IndexedData, loop: asyncio.AbstractEventLoop, task: Any) -> None:
        self.data, self.loop, self.task = data, loop, task

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
            self.task = None
            time.sleep(0.2)  # the cancellation is delivered while this epoch's end runs
        return self.data[i]


def _cancel_rank0(out: Path, rank: int, name: str, *, in_validation: bool) -> None:
    """Rank 0's train() cancelled (task.cancel() under asyncio.run) on its first read of the
    validation set or of the training set; rank 1 is never cancelled. Rank 0 must not leave
    alone (rank 1 would wait for it in its next collective): both stop at one later boundary."""
    outcome: dict[str, Any] = {}

    async def main() -> None:
        task = asyncio.current_task() if rank == 0 else None
        loop = asyncio.get_running_loop()
        train, validation = IndexedData(96), IndexedData(16, seed=1)
        optimizer = create_optimized_training_optimizer(
            model=Recorder(),
            train_loader=DataLoader(
                train if in_validation else CancelsOnFirstRead(train, loop, task), batch_size=8
            ),
            val_loader=DataLoader(
                CancelsOnFirstRead(validation, loop, task) if in_validation else validation,
                batch_size=8,
            ),
            max_epochs=50,
            num_sanity_val_steps=0,  # the first validation read is the epoch's end's
            log_dir=out / "logs",
            experiment_name=name,
        )
        outcome["optimizer"] = optimizer
        results = await optimizer.train()
        outcome["interrupted"] = results.interrupted

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(main())
    optimizer = outcome.pop("optimizer")
    optimizer.close()
    outcome["cancelled"] = "interrupted" not in outcome
    outcome["global_step"] = optimizer.global_step
    outcome["last_checkpoint"] = optimizer.last_checkpoint
    torch.save(outcome, out / f"{name}.rank{rank}.pt")


@scenario
def cancel_rank0_at_epoch_end(out: Path, rank: int) -> None:
    # Cancelled while it validates at the end of epoch 0, a job with no stop vote inside.
    _cancel_rank0(out, rank, "cancel_rank0_at_epoch_end", in_validation=True)


@scenario
def cancel_rank0_in_an_epoch(out: Path, rank: int) -> None:
    # Cancelled in epoch 0's first step: the epoch (6 steps) ends before the first vote (16).
    _cancel_rank0(out, rank, "cancel_rank0_in_an_epoch", in_validation=False)


class Stream:
    """A re-iterable loader without ``len()``, like a stream or an IterableDataset."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


@scenario
def uneven_stream(out: Path, rank: int) -> None:
    # No len() and use_distributed_sampler=False: rank 0 streams 10 batches, rank 1 only 7,
    # in windows of 2 (rank 1's 4th is short); validation streams 5 and 3 batches. Every
    # epoch must end on both ranks where rank 1 runs out, and the run must complete.
    def stream(n: int, seed: int = 0) -> Stream:
        return Stream(DataLoader(IndexedData(n, seed), batch_size=8))

    optimizer = create_optimized_training_optimizer(
        model=Recorder(),
        train_loader=stream(80 if rank == 0 else 56),
        val_loader=stream(40 if rank == 0 else 24, seed=1),
        max_epochs=2,
        log_dir=out / "logs",
        experiment_name="uneven_stream",
        use_distributed_sampler=False,
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=2),
    )
    results = anyio.run(optimizer.train)
    optimizer.close()
    assert optimizer.run_dir is not None
    torch.save(
        {"results": results.to_dict(), "run_dir": str(optimizer.run_dir)},
        out / f"uneven_stream.rank{rank}.pt",
    )


@scenario
def uneven_len(out: Path, rank: int) -> None:
    # use_distributed_sampler=False with loaders of 10 and 6 batches: every rank must raise
    # UnevenLoadersError (val_loader when the optimizer is built, train_loader when the
    # first epoch starts), not crash gloo. Each rank writes its messages and exits non-zero.
    messages: list[str] = []
    common: dict[str, Any] = {"use_distributed_sampler": False, "log_dir": out / "logs"}
    try:
        create_optimized_training_optimizer(
            model=Recorder(),
            train_loader=DataLoader(IndexedData(48), batch_size=8),
            val_loader=DataLoader(IndexedData(80 if rank == 0 else 48), batch_size=8),
            **common,
        )
    except UnevenLoadersError as exc:
        messages.append(str(exc))
    try:
        run_job(batch_size=8, n=80 if rank == 0 else 48, experiment_name="uneven_len", **common)
    except UnevenLoadersError as exc:
        messages.append(str(exc))
        (out / f"uneven_len.rank{rank}.txt").write_text("\n".join(messages))
        torch.distributed.barrier()  # the group survived: both ranks wrote before either exits
        raise


class FaultOnRank1(Recorder):
    """Rank 1's ``at``-th training forward and every later one return NaN (``nan``), or
    the ``at``-th sends its own process SIGTERM (``sigterm``); rank 0 never does."""

    def __init__(self, rank: int, fault: str, at: int = 5) -> None:
        super().__init__()
        self.rank, self.fault, self.at, self.calls = rank, fault, at, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = super().forward(inputs)
        if self.training and self.rank == 1:
            self.calls += 1
            if self.fault == "nan" and self.calls >= self.at:
                out = out * float("nan")
            if self.fault == "sigterm" and self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return out


def fault_job(out: Path, rank: int, fault: str) -> None:
    """Trains with a fault on rank 1; each rank writes what its ``train()`` raised to
    ``<fault>_rank1.rank<R>.json``, then re-raises it (no barrier: nothing holds the ranks
    together here but core)."""
    optimizer = create_optimized_training_optimizer(
        model=FaultOnRank1(rank, fault),
        train_loader=DataLoader(IndexedData(192), batch_size=4),
        max_epochs=2,
        learning_rate=1e-2,
        log_dir=out / "logs",
        experiment_name=f"{fault}_rank1",
        checkpoint_every_n_steps=2,
        seed=0,
        handle_signals=fault == "sigterm",
    )
    try:
        anyio.run(optimizer.train)
    except CoreError as exc:
        said = {
            "type": type(exc).__name__,
            "message": str(exc),
            "rank": exc.rank,
            "ranks": list(getattr(exc, "ranks", ())),
            "exit_code": getattr(exc, "exit_code", None),
            "checkpoint": getattr(exc, "checkpoint", None),
        }
        (out / f"{fault}_rank1.rank{rank}.json").write_text(json.dumps(said))
        raise
    finally:
        optimizer.close()


@scenario
def sigterm_rank1(out: Path, rank: int) -> None:
    with contextlib.suppress(SignalReceived):  # the next scenario runs in these processes
        fault_job(out, rank, "sigterm")


@scenario
def nan_rank1(out: Path, rank: int) -> None:
    fault_job(out, rank, "nan")  # raises NonFiniteLossError on every rank


class LateAtEpochEnd(torch.optim.lr_scheduler.LambdaLR):
    """A constant schedule whose step for an epoch's last optimizer step sleeps: that step is
    settled at the epoch's end, after the last gradient collective, so a rank using it
    reaches the epoch-end collectives ``delay_s`` late."""

    def __init__(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int, delay_s: float):
        self.steps_per_epoch, self.delay_s, self.calls = steps_per_epoch, delay_s, -1
        super().__init__(optimizer, lambda _: 1.0)  # calls step() once itself

    def step(self, epoch: int | None = None) -> None:
        super().step()
        self.calls += 1
        if self.calls and self.calls % self.steps_per_epoch == 0:
            time.sleep(self.delay_s)


@scenario
def slow_rank_heartbeat(out: Path, rank: int) -> None:
    # Rank 1 reaches every epoch end 0.3 s late, so rank 0 waits in the epoch-edge
    # collectives. Those run on the step thread: rank 0's event loop must keep beating.
    delay_s = 0.3 if rank == 1 else 0.0
    optimizer = create_optimized_training_optimizer(
        model=Recorder(),
        train_loader=DataLoader(IndexedData(256), batch_size=8),
        val_loader=DataLoader(IndexedData(64, seed=1), batch_size=16),
        scheduler=lambda opt: LateAtEpochEnd(opt, steps_per_epoch=16, delay_s=delay_s),
        max_epochs=3,
        log_dir=out / "logs",
        experiment_name="heartbeat",
    )
    gaps: list[float] = []

    async def main() -> None:
        async def heartbeat() -> None:
            last = time.perf_counter()
            while True:
                await anyio.sleep(0.005)
                now = time.perf_counter()
                if optimizer.global_step > 0:  # across the epochs and their ends
                    gaps.append(now - last)
                last = now

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            started = time.perf_counter()
            await optimizer.train()
            outcome["train_s"] = time.perf_counter() - started
            tg.cancel_scope.cancel()

    outcome: dict[str, Any] = {}
    anyio.run(main)
    optimizer.close()
    outcome["worst_gap_s"] = max(gaps)
    outcome["beats"] = len(gaps)
    torch.save(outcome, out / f"slow_rank_heartbeat.rank{rank}.pt")


class OOMOnRank1(Recorder):
    """Rank 1 runs out of memory (injected) on micro-batches above ``limit`` samples; rank 0
    never."""

    def __init__(self, rank: int, limit: int = 4) -> None:
        super().__init__()
        self.rank, self.limit = rank, limit

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training and self.rank == 1 and inputs.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(inputs)


@scenario
def ddp_oom_rank1(out: Path, rank: int) -> None:
    model = OOMOnRank1(rank)
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(IndexedData(96), batch_size=8),
        max_epochs=2,
        learning_rate=1e-2,
        log_dir=out / "logs",
        experiment_name="oom",
        seed=0,
        multi_gpu_config=MultiGPUConfig(training_mode="distributed"),
        error_handler_config=ErrorHandlerConfig(oom_recovery="on"),
    )
    results = anyio.run(optimizer.train)
    weights = optimizer._built.strategy.model_state_dict(optimizer.model)
    micro = optimizer.describe()["gradient_accumulation"]["micro_batch_size"]
    optimizer.close()
    torch.save(
        {"weights": weights, "results": results.to_dict(), "micro_batch_size": micro},
        out / f"ddp_oom_rank1.rank{rank}.pt",
    )


@scenario
def ddp_auto_batch(out: Path, rank: int) -> None:
    # Rank 1 fits 12 samples, rank 0 up to max_batch_size: both must take 12.
    optimizer = create_optimized_training_optimizer(
        model=OOMOnRank1(rank, limit=12),
        train_loader=DataLoader(IndexedData(96), batch_size=16),
        max_epochs=1,
        log_dir=out / "logs",
        experiment_name="auto_batch",
        seed=0,
        multi_gpu_config=MultiGPUConfig(training_mode="distributed"),
        auto_batch_size=True,
        target_memory_gb=1.0,
        max_batch_size=64,
    )
    anyio.run(optimizer.train)
    search = optimizer.describe()["model_setup"]["batch_size_search"]
    micro = optimizer.describe()["gradient_accumulation"]["micro_batch_size"]
    optimizer.close()
    torch.save({"search": search, "micro": micro}, out / f"ddp_auto_batch.rank{rank}.pt")


def token_job(world: str, log_dir: Path) -> dict[str, torch.Tensor]:
    """One SGD step (lr 1) over a window of 2 batches per rank of padded sequences: under
    DDP each rank holds 2 of the 4 sequences (1+5 and 6+4 real tokens)."""
    model = TokenModel()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(padded_sequences(4), batch_size=1),
        loss_fn=nn.CrossEntropyLoss(),
        max_epochs=1,
        log_dir=log_dir,
        experiment_name="tok",
        gradient_accumulation_config=GradientAccumulationConfig(2, normalize_by="tokens"),
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        multi_gpu_config=MultiGPUConfig(training_mode=world),  # type: ignore[arg-type]
    )
    anyio.run(optimizer.train)
    weights: dict[str, torch.Tensor] = optimizer._built.strategy.model_state_dict(optimizer.model)
    optimizer.close()
    return weights


@scenario
def ddp_tokens(out: Path, rank: int) -> None:
    weights = token_job("distributed", out / "logs")
    torch.save({"weights": weights}, out / f"ddp_tokens.rank{rank}.pt")


SCENARIOS.update(MOE_SCENARIOS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = setup_distributed_environment()  # the jobs reuse one group they did not create
    for name in args.scenarios:
        SCENARIOS[name](args.out, info["rank"])
        if not torch.distributed.is_initialized():
            raise SystemExit(f"{name}: close() destroyed a process group core did not create")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
