"""Expert parallelism on 2 real gloo ranks (scenarios in tests/moe_jobs.py, run by the
session's one torchrun launch) against one process holding every expert.

One process sees each rank's batch as a micro-batch of a window (``interleaved`` order,
accumulation x 2): routing, capacity and the balancing loss are per micro-batch on both
sides, so the two compute the same thing and the losses and weights must agree to float
rounding.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from core import load_weights
from core.errors import IncompatibleCheckpointError
from core.reports.read import read_events
from tests.distributed_jobs import interleaved
from tests.moe_jobs import moe_model, run_moe_job
from tests.torchrun import assert_same_weights, load

pytestmark = pytest.mark.distributed


def both_ranks_losses(jobs: Path, name: str) -> list[float]:
    """The ranks' micro-batch losses in the order one process meets them."""
    pairs = zip(load(jobs, name, 0)["losses"], load(jobs, name, 1)["losses"], strict=True)
    return [loss for pair in pairs for loss in pair]


def records(jobs: Path, name: str, event: str) -> list[dict[str, Any]]:
    (run,) = (jobs / "logs" / name).glob("*/events.jsonl")
    return [r for r in read_events(run) if r["event"] == event]


def test_two_expert_parallel_ranks_equal_one_process_holding_every_expert(
    jobs: Path, tmp_path: Path
) -> None:
    losses, _, weights = run_moe_job(
        mode="cpu", accumulation=2, order=interleaved(64, 2, 8), log_dir=tmp_path
    )
    torch.testing.assert_close(both_ranks_losses(jobs, "ep_fp32"), losses, atol=1e-5, rtol=1e-5)
    ep = load(jobs, "ep_fp32")
    assert_same_weights(ep["weights"], weights)
    assert any(".moe.experts.3." in key for key in ep["weights"])  # rank 1's, gathered
    assert load(jobs, "ep_fp32", rank=1)["weights"] == {}  # the whole model on rank 0 only
    (start,) = records(jobs, "ep_fp32", "run_start")
    described = start["resolved"]["strategy"]["expert_parallel"]
    assert described["token_exchange"] == "all_to_all_single"
    assert described["layers"]["blocks.0.moe"] == {
        "experts": 4,
        "experts_per_rank": 2,
        "held": [0, 1],
    }


def test_the_all_gather_exchange_computes_the_same_as_all_to_all(jobs: Path) -> None:
    assert_same_weights(
        load(jobs, "ep_all_gather")["weights"], load(jobs, "ep_fp32")["weights"], atol=0
    )
    (start,) = records(jobs, "ep_all_gather", "run_start")
    assert start["resolved"]["strategy"]["expert_parallel"]["token_exchange"] == "all_gather"


def test_expert_parallel_with_accumulation_and_a_short_last_window(
    jobs: Path, tmp_path: Path
) -> None:
    losses, results, weights = run_moe_job(
        mode="cpu", n=80, epochs=1, accumulation=4, order=interleaved(80, 2, 8), log_dir=tmp_path
    )
    ep = load(jobs, "ep_accum")
    assert ep["results"]["global_step"] == results.global_step == 3  # windows 2, 2, 1 per rank
    torch.testing.assert_close(both_ranks_losses(jobs, "ep_accum"), losses, atol=1e-5, rtol=1e-5)
    assert_same_weights(ep["weights"], weights)


@pytest.mark.parametrize(("name", "atol"), [("ep_bf16", 1e-3), ("ep_fp16", 1e-4)])
def test_expert_parallel_under_autocast_tracks_one_process(
    jobs: Path, tmp_path: Path, name: str, atol: float
) -> None:
    dtype = name.removeprefix("ep_")
    losses, _, weights = run_moe_job(
        mode="cpu",
        epochs=1,
        accumulation=2,
        amp_dtype=dtype,
        order=interleaved(64, 2, 8),
        log_dir=tmp_path,
    )
    torch.testing.assert_close(both_ranks_losses(jobs, name), losses, atol=atol * 5, rtol=0)
    assert_same_weights(load(jobs, name)["weights"], weights, atol=atol)
    steps = records(jobs, name, "train_step")
    assert all(not s["skipped"] for s in steps)
    assert (steps[0]["loss_scale"] is not None) == (dtype == "fp16")


def test_the_step_records_count_this_ranks_tokens(jobs: Path) -> None:
    for record in records(jobs, "ep_fp32", "train_step"):
        kept = sum(sum(c) for c in record["moe_tokens_per_expert"].values())
        assert kept + record["moe_dropped_tokens"] == 2 * 8 * 8 * 2  # layers, tokens, top_k


def test_an_expert_parallel_checkpoint_resumes_exactly_and_loads_whole_in_one_process(
    jobs: Path,
) -> None:
    resumed = load(jobs, "ep_resume")
    assert resumed["results"]["global_step"] == 8
    assert_same_weights(resumed["weights"], load(jobs, "ep_fp32")["weights"], atol=0)
    newest = sorted((jobs / "ep_resume_logs" / "ep_resume" / "checkpoints").glob("step-*"))[-1]
    assert (newest / "sharded" / ".metadata").exists()
    whole = moe_model()  # every expert, one process, no process group
    load_weights(newest, whole)
    assert_same_weights(whole.state_dict(), resumed["weights"], atol=0)


def test_resuming_on_another_world_size_fails_clearly(jobs: Path, tmp_path: Path) -> None:
    written = jobs / "ep_resume_logs" / "ep_resume" / "checkpoints"
    shutil.copytree(written, tmp_path / "checkpoints")
    with pytest.raises(IncompatibleCheckpointError, match=r"world_size \(checkpoint 2, now 1\)"):
        run_moe_job(
            mode="expert_parallel",
            log_dir=tmp_path / "logs",
            checkpoint_dir=tmp_path / "checkpoints",
            resume="strict",
        )
