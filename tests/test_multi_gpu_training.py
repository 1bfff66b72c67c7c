"""Distribution: mode resolution and config errors in-process; DDP, FSDP2, samplers,
validation, early stopping, stop agreement, uneven loaders and two "nodes" with real torchrun
jobs."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from core import (
    ConfigError,
    GradientAccumulationConfig,
    MultiGPUConfig,
    create_optimized_training_optimizer,
)
from core.checkpointing.dcp_metadata import check_metadata
from core.checkpointing.manifest import hash_file
from core.checkpointing.store import CheckpointStore
from core.distributed.environment import DistributedEnvironment
from core.errors import UnsafeCheckpointError
from core.multi_gpu_training import (
    Machine,
    MultiGPUTrainer,
    create_multi_gpu_trainer,
    get_free_port,
    launch_distributed_training,
    optimize_model_for_multi_gpu,
)
from tests.distributed_jobs import IndexedData, interleaved, run_job
from tests.helpers import TokenModel, loaders, make_model, padded_sequences, pythonpath
from tests.torchrun import JOBS, assert_same_weights, load, torchrun

TORCHRUN_ENV = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "1",
}


def machine(cuda: int = 0, env: dict[str, str] | None = None) -> Machine:
    """A machine with ``cuda`` GPUs and environment ``env`` (no real GPU needed)."""
    env = env or {}
    master = (env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    return Machine(DistributedEnvironment.from_environ(env), cuda, master)


# -- resolution (no processes) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("cuda", "env", "config", "mode"),
    [
        (0, None, {}, "cpu"),
        (1, None, {}, "single_gpu"),
        (4, None, {}, "data_parallel"),
        (4, None, {"enable_data_parallel": False}, "single_gpu"),
        (0, TORCHRUN_ENV, {}, "distributed"),
        (0, TORCHRUN_ENV, {"training_mode": "fsdp"}, "fsdp"),
    ],
)
def test_auto_mode(
    cuda: int, env: dict[str, str] | None, config: dict[str, Any], mode: str
) -> None:
    trainer = MultiGPUTrainer(MultiGPUConfig(**config), machine=machine(cuda, env))
    assert trainer.training_mode == mode
    assert trainer.get_training_info()["training_mode"] == mode


def test_several_gpus_without_data_parallel_say_how_to_launch_ddp() -> None:
    trainer = MultiGPUTrainer(MultiGPUConfig(enable_data_parallel=False), machine=machine(4))
    assert any("torchrun --standalone --nproc_per_node=4" in note for note in trainer.notes)


def test_ddp_under_torchrun_takes_rank_and_world_size_from_the_environment() -> None:
    env = TORCHRUN_ENV | {"RANK": "1", "LOCAL_RANK": "1"}
    strategy = MultiGPUTrainer(machine=machine(0, env)).strategy
    assert (strategy.rank, strategy.world_size, strategy.local_rank) == (1, 2, 1)
    assert strategy.describe()["backend"] == "gloo"


@pytest.mark.parametrize(
    ("config", "cuda", "env", "pattern"),
    [
        (
            {"training_mode": "distributed", "backend": "nccl", "world_size": 2, "rank": 0},
            0,
            {"MASTER_ADDR": "h", "MASTER_PORT": "1"},
            r"backend='nccl' is invalid; allowed: 'gloo' on a machine without CUDA",
        ),
        (
            {"training_mode": "distributed"},
            0,
            None,
            r"needs a world size and a rank, and this process is not under torchrun",
        ),
        (
            {"training_mode": "fsdp", "world_size": 2, "rank": 0},
            0,
            None,
            r"needs MASTER_ADDR and MASTER_PORT",
        ),
        ({"training_mode": "single_gpu"}, 0, None, r"training_mode='single_gpu' needs a CUDA GPU"),
        (
            {"training_mode": "data_parallel", "device_ids": [0, 3]},
            2,
            None,
            r"device_ids=\[0, 3\] is invalid; allowed: indices below the 2 CUDA devices",
        ),
        (
            {"enable_distributed": False},
            0,
            TORCHRUN_ENV,
            r"runs under torchrun .* but enable_distributed=False",
        ),
    ],
)
def test_bad_placement_fails_before_training(
    config: dict[str, Any], cuda: int, env: dict[str, str] | None, pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        MultiGPUTrainer(MultiGPUConfig(**config), machine=machine(cuda, env))


def test_half_set_torchrun_environment_is_named() -> None:
    with pytest.raises(ConfigError, match=r"half set: RANK set but LOCAL_RANK, WORLD_SIZE missing"):
        DistributedEnvironment.from_environ({"RANK": "0"})


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        (
            "training_mode",
            "multi_gpu",
            r"training_mode='multi_gpu' is invalid; allowed: 'auto', 'cpu'",
        ),
        ("backend", "mpi", r"backend='mpi' is invalid"),
        ("device_ids", [0, 0], r"device_ids=\[0, 0\] is invalid"),
        ("timeout_s", 0, r"timeout_s=0 is invalid"),
        ("world_size", -2, r"world_size=-2 is invalid"),
    ],
)
def test_config_fields_are_validated(field: str, value: object, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        MultiGPUConfig(**{field: value})  # type: ignore[arg-type]


def test_distributed_outside_torchrun_fails_in_the_factory(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    train, _ = loaders()
    with pytest.raises(ConfigError, match="not under torchrun"):
        create_optimized_training_optimizer(
            model=make_model(),
            train_loader=train,
            log_dir=log_dir,
            multi_gpu_config=MultiGPUConfig(training_mode="distributed"),
        )


def test_seed_helpers_on_cpu() -> None:
    model, trainer = optimize_model_for_multi_gpu(make_model(), training_mode="cpu")
    assert trainer.training_mode == "cpu" and next(model.parameters()).device.type == "cpu"
    loader = trainer.setup_dataloader(IndexedData(10), batch_size=4)
    assert len(loader) == 3
    sample = trainer.record_gpu_metrics()  # no GPU here: the host, through psutil
    assert sample is not None and sample["source"] == "psutil"
    assert sample["devices"][0]["mem_used_bytes"] > 0
    trainer.record_epoch(samples=100, seconds=2.0)
    assert trainer.get_performance_summary()["samples_per_s"] == 50.0
    trainer.cleanup()
    assert create_multi_gpu_trainer(training_mode="cpu").training_mode == "cpu"
    port = get_free_port()
    assert 0 < port < 65536


@pytest.mark.distributed  # two torchrun launches
def test_launch_helper_reports_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    assert launch_distributed_training(script, world_size=2, env={"OMP_NUM_THREADS": "1"}) != 0
    script.write_text("import os\nassert os.environ['WORLD_SIZE'] == '2'\n")
    assert launch_distributed_training(script, world_size=2) == 0


# -- real 2-process gloo jobs -------------------------------------------------------------


@pytest.mark.distributed
def test_ddp_two_ranks_equal_one_process_with_the_global_batch(jobs: Path, tmp_path: Path) -> None:
    _, results, weights = run_job(batch_size=16, mode="cpu", log_dir=tmp_path)
    ddp = load(jobs, "ddp_fp32")
    assert ddp["results"]["global_step"] == results.global_step == 12
    assert_same_weights(ddp["weights"], weights)
    for key, value in load(jobs, "ddp_fp32", rank=1)["weights"].items():
        assert torch.equal(value, ddp["weights"][key])  # replicas stay identical


@pytest.mark.distributed
def test_seed_004s_trainer_trains_under_torchrun_as_the_factory_does(jobs: Path) -> None:
    ddp = load(jobs, "ddp_fp32")
    for rank in (0, 1):
        own = load(jobs, "seed004_train", rank)
        assert own["mode"] == "distributed" and own["samples"] == 96  # this rank's 48 x 2
        assert own["results"]["global_step"] == 12
        assert sorted(own["seen"]) == sorted(load(jobs, "ddp_fp32", rank)["seen"])
        assert_same_weights(ddp["weights"], own["weights"])


@pytest.mark.distributed
def test_ddp_bf16_equals_one_process_on_the_same_micro_batches(jobs: Path, tmp_path: Path) -> None:
    """bf16 autocast rounds each weight gradient to bf16 before it is summed, so equality
    needs the single process to see the ranks' batches as its micro-batches; a plain batch
    of 16 agrees only to bf16 precision."""
    same_split = run_job(
        batch_size=16,
        mode="cpu",
        amp_dtype="bf16",
        order=interleaved(96, 2, 8),
        gradient_accumulation_config=GradientAccumulationConfig(micro_batch_size=8),
        log_dir=tmp_path,
    )[2]
    plain = run_job(batch_size=16, mode="cpu", amp_dtype="bf16", log_dir=tmp_path)[2]
    ddp = load(jobs, "ddp_bf16")["weights"]
    assert_same_weights(ddp, same_split)
    assert_same_weights(ddp, plain, atol=2e-3)


@pytest.mark.distributed
def test_ddp_with_accumulation_and_a_short_last_window(jobs: Path, tmp_path: Path) -> None:
    _, results, weights = run_job(
        batch_size=16,
        n=100,
        mode="cpu",
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=3),
        log_dir=tmp_path,
    )
    ddp = load(jobs, "ddp_accum")
    assert ddp["results"]["global_step"] == results.global_step == 6  # windows 3, 3, 1 per epoch
    assert_same_weights(ddp["weights"], weights)


@pytest.mark.distributed
def test_fsdp2_two_ranks_equal_one_process(jobs: Path, tmp_path: Path) -> None:
    weights = run_job(batch_size=16, mode="cpu", log_dir=tmp_path)[2]
    assert_same_weights(load(jobs, "fsdp_fp32")["weights"], weights)
    assert load(jobs, "fsdp_fp32", rank=1)["weights"] == {}  # gathered on rank 0 only


@pytest.mark.distributed
def test_fsdp2_checkpoint_through_dcp_resumes_exactly(jobs: Path) -> None:
    resumed = load(jobs, "fsdp_resume")
    assert resumed["results"]["global_step"] == 12
    assert_same_weights(resumed["weights"], load(jobs, "fsdp_fp32")["weights"], atol=0)
    (checkpoint,) = sorted((jobs / "resume_logs" / "fsdp_resume" / "checkpoints").iterdir())[:1]
    assert (checkpoint / "sharded" / ".metadata").exists()  # the DCP commit marker
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert any(name.startswith("sharded/") for name in manifest["files"])


class Payload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.target), "w"))


@pytest.mark.distributed
def test_a_crafted_fsdp2_metadata_is_refused_before_torch_reads_it(
    jobs: Path, tmp_path: Path
) -> None:
    written = jobs / "resume_logs" / "fsdp_resume" / "checkpoints"
    newest = CheckpointStore(written, keep_last_n=2).committed()[0]
    check_metadata(newest / "sharded")  # a real 2-rank FSDP2 .metadata passes the allow-list
    checkpoint = tmp_path / "checkpoints" / newest.name
    shutil.copytree(newest, checkpoint)
    target = tmp_path / "pwned"
    metadata = checkpoint / "sharded" / ".metadata"
    metadata.write_bytes(pickle.dumps(Payload(target)))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["sharded/.metadata"] = {  # the attacker recomputes the manifest
        "sha256": hash_file(metadata),
        "bytes": metadata.stat().st_size,
    }
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    # Named as the checkpoint to resume: resume="auto" would pass it over unread, on the
    # settings its manifest records (two FSDP2 ranks, not this one-process job).
    with pytest.raises(UnsafeCheckpointError, match=r"refused to load .*\.metadata"):
        run_job(
            batch_size=16,
            mode="cpu",
            log_dir=tmp_path / "logs",
            checkpoint_dir=tmp_path / "checkpoints",
            resume=str(checkpoint),
        )
    assert not target.exists()


@pytest.mark.distributed
def test_fsdp2_with_a_bf16_mixed_precision_policy_trains(jobs: Path) -> None:
    results = load(jobs, "fsdp_bf16_policy")["results"]
    assert results["epochs_completed"] == 3 and results["val_accuracy"] > 0.7


@pytest.mark.gpu
@pytest.mark.distributed
@pytest.mark.skipif(not torch.cuda.is_available(), reason="SyncBatchNorm runs on CUDA only")
def test_sync_bn_converts_batch_norm_and_keeps_ranks_in_step(tmp_path: Path) -> None:
    ranks = min(2, torch.cuda.device_count())
    torchrun(tmp_path, "ddp_sync_bn", extra=["--standalone", f"--nproc_per_node={ranks}"])
    loaded = [
        torch.load(tmp_path / f"ddp_sync_bn.rank{r}.pt", weights_only=True) for r in range(ranks)
    ]
    assert all(r["sync_bn"] == 1 for r in loaded)
    assert all(torch.equal(r["running_mean"], loaded[0]["running_mean"]) for r in loaded)


@pytest.mark.distributed
def test_validation_metrics_equal_single_process_metrics(jobs: Path, tmp_path: Path) -> None:
    """37 validation samples: rank 1's shard is padded; padding must not be counted."""
    _, results, _ = run_job(batch_size=16, mode="cpu", log_dir=tmp_path)
    for name in ("ddp_fp32", "fsdp_fp32"):
        for rank in (0, 1):
            theirs = load(jobs, name, rank)["results"]
            assert theirs["val_accuracy"] == results.val_accuracy
            assert theirs["val_loss"] == pytest.approx(results.val_loss, rel=1e-6)


@pytest.mark.distributed
def test_distributed_sampler_covers_the_dataset_once_per_epoch(jobs: Path) -> None:
    seen = [load(jobs, "ddp_shuffle", rank)["seen"] for rank in (0, 1)]
    per_rank = 49  # ceil(97 / 2): one padded duplicate
    epochs = [[s[e * per_rank : (e + 1) * per_rank] for s in seen] for e in range(2)]
    for shards in epochs:
        counts = Counter(shards[0] + shards[1])
        assert set(counts) == set(range(97))
        assert sum(counts.values()) == 98 and max(counts.values()) == 2
        assert not set(shards[0]) & set(shards[1]) - {i for i, c in counts.items() if c == 2}
    assert epochs[0][0] != epochs[1][0]  # set_epoch: a new shuffle each epoch


@pytest.mark.distributed
def test_rank0_early_stopping_decision_stops_every_rank(jobs: Path) -> None:
    ranks = [load(jobs, "early_stop", rank)["results"] for rank in (0, 1)]
    assert [r["epochs_completed"] for r in ranks] == [2, 2]
    assert all(r["stopped_early"] for r in ranks)


@pytest.mark.distributed
def test_a_cancelled_rank_stops_every_rank_at_the_same_step(jobs: Path) -> None:
    rank0, rank1 = (load(jobs, "cancel_rank1", rank) for rank in (0, 1))
    assert rank1["cancelled"] and not rank0["cancelled"]
    assert rank0["interrupted"]
    assert rank0["global_step"] == rank1["global_step"] >= 5


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["cancel_rank0_at_epoch_end", "cancel_rank0_in_an_epoch"])
def test_a_rank_cancelled_before_a_vote_does_not_leave_the_others_behind(
    jobs: Path, scenario: str
) -> None:
    """Rank 0's task is cancelled (``task.cancel()``) while it validates at the end of epoch
    0, or in epoch 0's first step (the epoch ends before the first vote): no vote is held
    before the epoch's end, so it goes on to the next vote with its stop flag set, and both
    ranks stop at step 17 (the vote at step 16, counted at the next step) with one stop
    checkpoint; rank 0's ``train()`` raises the cancellation, rank 1's is interrupted."""
    rank0, rank1 = (load(jobs, scenario, rank) for rank in (0, 1))
    assert rank0["cancelled"] and not rank1["cancelled"]
    assert rank1["interrupted"]
    assert rank0["global_step"] == rank1["global_step"] == 17
    kept = Path(rank0["last_checkpoint"])
    assert rank1["last_checkpoint"] == str(kept) and kept.name.startswith("step-000000017-")
    ends = {}
    for log in kept.parents[1].glob("*/events*.jsonl"):
        records = [json.loads(line) for line in log.read_text().splitlines()]
        ends.update((r["rank"], r["status"]) for r in records if r["event"] == "run_end")
        if log.name == "events.jsonl":  # rank 0's, where the saves are logged
            saves = [r["reason"] for r in records if r["event"] == "checkpoint"]
            assert saves == ["epoch", "epoch", "cancel"]
    assert ends == {0: "cancelled", 1: "stopped"}


@pytest.mark.distributed
def test_uneven_streams_end_each_epoch_together_and_say_so(jobs: Path) -> None:
    """Rank 0 streams 10 batches (5 windows of 2), rank 1 7 (4 windows): both take 4 steps
    per epoch, and each rank's log records where and why the epoch ended."""
    ranks = [load(jobs, "uneven_stream", rank) for rank in (0, 1)]
    assert [r["results"]["global_step"] for r in ranks] == [8, 8]
    assert [r["results"]["epochs_completed"] for r in ranks] == [2, 2]
    assert ranks[0]["results"]["val_loss"] == ranks[1]["results"]["val_loss"]
    run_dir = Path(ranks[0]["run_dir"])
    for name in ("events.jsonl", "events.rank1.jsonl"):
        records = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
        uneven = [r for r in records if r["event"] == "uneven_inputs"]
        assert [(r["epoch"], r["step"]) for r in uneven] == [(0, 4), (1, 8)]
        for record in uneven:
            assert record["loader"] == "train_loader"
            assert record["exhausted_ranks"] == [1]
            assert record["unused_batches_at_least"] == [2, 0]  # rank 0's 5th window


@pytest.mark.slow
@pytest.mark.distributed
def test_uneven_loader_lengths_fail_clearly_on_every_rank(tmp_path: Path) -> None:
    """Loaders of 10 and 6 batches without the DistributedSampler used to kill rank 0 with
    SIGABRT inside gloo (an empty log) and rank 1 with "connection reset"."""
    done = torchrun(tmp_path, "uneven_len", check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "SIGABRT" not in output and "Connection reset" not in output, output[-3000:]
    assert "UnevenLoadersError" in output
    for rank in (0, 1):
        val, train = (tmp_path / f"uneven_len.rank{rank}.txt").read_text().splitlines()
        assert re.match(
            r"val_loader holds a different number of batches on each rank "
            r"\(rank 0: 10, rank 1: 6\), found when the optimizer was built",
            val,
        )
        assert re.match(
            r"train_loader holds a different number of batches on each rank "
            r"\(rank 0: 10, rank 1: 6\), found at the start of epoch 0",
            train,
        )
        assert "use_distributed_sampler=True" in train and "drop_last=True" in train
    (run_dir,) = (tmp_path / "logs" / "uneven_len").iterdir()
    for name in ("events.jsonl", "events.rank1.jsonl"):
        end = json.loads((run_dir / name).read_text().splitlines()[-1])
        assert end["event"] == "run_end" and end["status"] == "failed"
        assert end["error_type"] == "UnevenLoadersError"


@pytest.mark.distributed
def test_two_nodes_on_localhost_equal_one_node(jobs: Path, tmp_path: Path) -> None:
    port = get_free_port()
    rendezvous = [
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        str(JOBS),
        "--out",
        str(tmp_path),
        "ddp_fp32",
    ]
    nodes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), b"".join(outputs)[-3000:]
    two_nodes = [load(tmp_path, "ddp_fp32", rank)["weights"] for rank in (0, 1)]
    one_node = load(jobs, "ddp_fp32")["weights"]
    assert_same_weights(two_nodes[0] or two_nodes[1], one_node, atol=1e-6)


@pytest.mark.distributed
def test_the_event_loop_keeps_beating_while_a_slow_rank_holds_up_epoch_ends(jobs: Path) -> None:
    fast = load(jobs, "slow_rank_heartbeat", rank=0)
    # The slow rank cost rank 0 three waits of 0.3 s (the collectives did block, in a thread)...
    assert fast["train_s"] > 3 * 0.3
    # ...while its event loop, beating every 5 ms, never stalled: the bound is 50 ms.
    assert fast["beats"] > 100 and fast["worst_gap_s"] < 0.050, fast


@pytest.mark.distributed
def test_an_oom_on_one_rank_halves_both_and_matches_the_smaller_micro_batch(
    jobs: Path, tmp_path: Path
) -> None:
    """Rank 1 alone runs out of memory at 8 samples: both ranks halve to 4 and go on; the
    weights equal one process with the global batch of 16 (and the ranks stay identical)."""
    rank0, rank1 = load(jobs, "ddp_oom_rank1"), load(jobs, "ddp_oom_rank1", rank=1)
    assert rank0["micro_batch_size"] == rank1["micro_batch_size"] == 4
    assert rank0["results"]["global_step"] == rank1["results"]["global_step"] == 12
    _, _, weights = run_job(
        batch_size=16,
        mode="cpu",
        log_dir=tmp_path,
        gradient_accumulation_config=GradientAccumulationConfig(micro_batch_size=8),
    )
    assert_same_weights(rank0["weights"], weights)
    for key, value in rank1["weights"].items():
        assert torch.equal(value, rank0["weights"][key])
    records = [
        json.loads(line)
        for path in sorted((jobs / "logs" / "oom").glob("*/events*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    recovered = [r for r in records if r["event"] == "oom_recovered"]
    assert [r["micro_batch_size"] for r in recovered] == [4, 4]  # each rank logs the halving


@pytest.mark.distributed
def test_token_normalisation_over_two_ranks_equals_the_big_batch(
    jobs: Path, tmp_path: Path
) -> None:
    ddp = load(jobs, "ddp_tokens")["weights"]
    model = TokenModel()
    tokens, targets = padded_sequences(4)[:]
    nn.functional.cross_entropy(model(tokens), targets).backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert_same_weights(ddp, model.state_dict(), atol=1e-6)


@pytest.mark.distributed
def test_the_batch_size_search_agrees_on_the_smallest_answer(jobs: Path) -> None:
    """Rank 1 runs out of memory above 12 samples, rank 0 fits all 64: both use 12."""
    rank0, rank1 = load(jobs, "ddp_auto_batch"), load(jobs, "ddp_auto_batch", rank=1)
    assert rank0["search"]["batch_size"] == rank1["search"]["batch_size"] == 12
    assert rank0["micro"] == rank1["micro"] == 12  # the loader's 16 are split
    assert any(not t["fits"] for t in rank1["search"]["trials"])
    assert all(t["fits"] for t in rank0["search"]["trials"])


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_raises_the_same_error_naming_the_rank_that_caused_it(tmp_path: Path) -> None:
    """A SIGTERM that reaches rank 1 only, then a loss that turns NaN on rank 1 only: both
    ranks' ``train()`` raise the same error naming rank 1 and the last good checkpoint, and
    neither is torn down before its user code saw it (the job re-raises without a barrier;
    rank 0 writes the reports)."""
    from core import load_weights
    from tests.distributed_jobs import Recorder

    done = torchrun(tmp_path, "sigterm_rank1", "nan_rank1", check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    said = {
        (fault, rank): json.loads((tmp_path / f"{fault}_rank1.rank{rank}.json").read_text())
        for fault in ("sigterm", "nan")
        for rank in (0, 1)
    }
    for rank in (0, 1):
        stop = said["sigterm", rank]
        assert stop["type"] == "SignalReceived" and stop["rank"] == 1, stop
        assert stop["exit_code"] == 143 and "SIGTERM (sent to rank 1)" in stop["message"]
        assert stop["checkpoint"] == said["sigterm", 0]["checkpoint"] is not None
        nan = said["nan", rank]
        assert nan["type"] == "NonFiniteLossError" and nan["rank"] == 1, nan
        assert nan["ranks"] == [1] and "the loss was not finite on rank 1" in nan["message"]
        assert nan["message"] == said["nan", 0]["message"]
    last = re.search(r"Last good checkpoint: (\S+)\.$", said["nan", 0]["message"])
    assert last is not None, said["nan", 0]["message"]
    loaded = load_weights(last.group(1), Recorder())  # verified: sizes and hashes
    assert loaded.step >= 2
    for fault, status in (("sigterm", "stopped"), ("nan", "failed")):
        (run_dir,) = (tmp_path / "logs" / f"{fault}_rank1").glob("2*")
        for name in ("events.jsonl", "events.rank1.jsonl"):
            end = json.loads((run_dir / name).read_text().splitlines()[-1])
            assert end["event"] == "run_end" and end["status"] == status, end


def test_ddp_at_world_size_one_trains_the_single_device_weights_without_the_wrapper(
    tmp_path: Path,
) -> None:
    """One rank has nothing to all-reduce: the model is not wrapped (no buffer broadcast,
    hooks or buckets every step), and the weights are the single device's to the bit."""

    def run(**settings: Any) -> Any:
        train, _ = loaders(n=96, val=False)
        job = create_optimized_training_optimizer(
            model=make_model(),
            train_loader=train,
            max_epochs=2,
            learning_rate=1e-2,
            log_dir=tmp_path / "logs",
            checkpoint_every_n_epochs=None,
            reports=False,
            progress=False,
            seed=0,
            **settings,
        )
        anyio.run(job.train)
        return job

    single = run()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        config = MultiGPUConfig(
            training_mode="distributed",
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            init_method=f"tcp://127.0.0.1:{get_free_port()}",  # unused: the group exists
        )
        ddp = run(multi_gpu_config=config)
        assert ddp.describe()["strategy"]["world_size"] == 1
        assert ddp.describe()["strategy"]["training_mode"] == "distributed"
        assert not isinstance(ddp._built.model, DistributedDataParallel)
    finally:
        dist.destroy_process_group()
    for a, b in zip(single.model.parameters(), ddp.model.parameters(), strict=True):
        assert torch.equal(a, b)
