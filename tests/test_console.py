"""The console: model summary, start banner, end summary and the progress callback, driven
with records (as a run's callbacks receive them) and once by a real run."""

from __future__ import annotations

import copy
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from core import ConfigError, OptimizedTrainingOptimizer, RunConfig, TrainingConfig
from core.callbacks import Record
from core.console import (
    ProgressBar,
    RunDigest,
    format_banner,
    format_count,
    format_duration,
    format_epoch_line,
    format_event_line,
    format_model_summary,
    format_summary,
    summarize_model,
)
from core.telemetry.config import LoggingConfig
from tests.helpers import loaders, make_model

RUN_DIR = "logs/sample/20261122-120150.289-bbae85"
CKPT = "logs/sample/checkpoints/step-000000016-20261122-120150.289-bbae85"

# The run_start of a real 2-epoch run (the parts the console reads), plus issue 11's fields.
RUN_START: Record = {
    "event": "run_start",
    "ts": "2026-11-22T12:01:50.290473Z",
    "level": "info",
    "run_id": "20261122-120150.289-bbae85",
    "rank": 0,
    "config": {
        "run": {"experiment_name": "sample", "max_epochs": 2, "seed": None},
        "logging": {"event_buffer_size": 1024, "flush_interval_s": 0.25, "reports": True},
    },
    "resolved": {
        "strategy": {"training_mode": "cpu", "device": "cpu", "world_size": 1, "rank": 0},
        "precision": {"resolved_precision": "bf16", "enable_amp": True, "dtype": "bf16"},
        "model_setup": {
            "activation_checkpointed": [],
            "channels_last": False,
            "compiled": [],
            "batch_size_search": None,
            "micro_batch_size": None,
        },
        "model": "Sequential",
        "parameters": 610,
        "optimizer": "AdamW",
        "checkpoints": {
            "top_k": 1,
            "keep_newest": 1,
            "monitor": "val_loss",
            "mode": "min",
            "save_last": False,
        },
    },
    "torch_version": "2.13.0+cpu",
    "python_version": "3.11.7",
    "device": "cpu",
    "precision": "bf16",
    "run_dir": RUN_DIR,
    "model_summary": {
        "modules": [
            {
                "name": "0",
                "class": "Linear",
                "parameters": 576,
                "trainable": 576,
                "dtype": "float32",
                "size_mb": 0.002,
            },
            {
                "name": "1",
                "class": "Linear",
                "parameters": 34,
                "trainable": 34,
                "dtype": "float32",
                "size_mb": 0.0,
            },
        ],
        "parameters": 610,
        "trainable": 610,
        "size_mb": 0.002,
    },
    "plan": {
        "max_epochs": 2,
        "max_steps": None,
        "steps_per_epoch": 4,
        "batches_per_epoch": 8,
        "effective_batch_size": 64,
        "world_size": 1,
        "val_every_n_epochs": 1,
        "val_every_n_steps": None,
        "has_validation": True,
        "monitor": "val_loss",
        "mode": "min",
        "save_best": True,
    },
    "seed": 1234,
    "model_init_hash": "9f2c4e1ab3d5c6e7",
    "model_init_matches_previous": True,
}
RUN_END: Record = {
    "event": "run_end",
    "ts": "2026-11-22T12:03:13.392800Z",
    "level": "info",
    "run_id": "20261122-120150.289-bbae85",
    "rank": 0,
    "status": "completed",
    "epochs_completed": 2,
    "global_step": 8,
    "best_metric": 0.7079171538352966,
    "events_dropped": 0,
    "last_checkpoint": CKPT,
    "elapsed_s": 83.4,
    "samples_per_s": 19305.59,
    "monitor": "val_loss",
    "best_value": 0.7079171538352966,
    "best_checkpoint": CKPT,
    "run_dir": RUN_DIR,
}


def step(epoch: int, n: int, loss: float = 0.7) -> Record:
    return {
        "event": "train_step",
        "level": "info",
        "rank": 0,
        "epoch": epoch,
        "step": n,
        "loss": loss,
        "lr": 0.001,
        "samples": 16,
        "step_time_s": 0.01,
        "accuracy": 0.75,
    }


def epoch_end(epoch: int, n: int, **extra: Any) -> Record:
    return {
        "event": "epoch_end",
        "level": "info",
        "rank": 0,
        "epoch": epoch,
        "step": n,
        "train_loss": 0.7274171113967896,
        "val_loss": 0.7350176870822906,
        "val_accuracy": 0.4375,
        "val_metrics": {"f1": 0.8},
        "steps": 4,
        "skipped_steps": 0,
        "samples": 256,
        "epoch_time_s": 0.05734,
        "samples_per_s": 4464.43,
        "stopped_early": False,
        **extra,
    }


def validation(epoch: int, n: int) -> list[Record]:
    return [
        {"event": "validation_start", "level": "info", "epoch": epoch, "step": n, "batches": 2},
        {
            "event": "validation",
            "level": "info",
            "epoch": epoch,
            "step": n,
            "val_loss": 0.735,
            "val_accuracy": 0.4375,
            "metrics": {"f1": 0.8},
            "samples": 64,
        },
    ]


STALL: Record = {
    "event": "data_stall",
    "level": "warning",
    "epoch": 1,
    "batch_index": 3,
    "waited_s": 60.0,
    "advice": "Raise the DataLoader's num_workers.",
}
FAILED_CALLBACK: Record = {
    "event": "error",
    "level": "error",
    "kind": "callback_failed",
    "callback": "Tracker",
    "error": "ValueError: tracker is down",
}


def a_run() -> list[Record]:
    """Two epochs of four steps; epoch 2's step 6 record was dropped (a lagging callback)."""
    return [
        RUN_START,
        *(step(0, n) for n in range(1, 5)),
        *validation(0, 4),
        epoch_end(0, 4),
        {"event": "checkpoint", "level": "info", "path": CKPT, "step": 4, "best": True},
        STALL,
        step(1, 5),
        step(1, 7),
        step(1, 8),
        *validation(1, 8),
        epoch_end(1, 8),
        FAILED_CALLBACK,
        RUN_END,
    ]


@dataclass
class Run:
    """What a callback may read about a run (RunInfo), for records fed by hand."""

    rank: int = 0
    world_size: int = 1
    run_dir: Path | None = None
    config: TrainingConfig | None = None

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0


HOOKS = {
    "run_start": "on_run_start",
    "epoch_end": "on_epoch_end",
    "checkpoint": "on_checkpoint",
    "run_end": "on_run_end",
}


async def feed(bar: ProgressBar, records: list[Record], run: Run | None = None) -> None:
    """As a run does: ``on_record`` with every record, then the record's own hook."""
    for record in records:
        await bar.on_record(run or Run(), record)  # type: ignore[arg-type]
        if record["event"] in HOOKS:
            await getattr(bar, HOOKS[record["event"]])(run or Run(), record)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# --- model summary --------------------------------------------------------------------------


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))  # on the root: the "(own)" row
        self.embed = nn.Embedding(10, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.half = nn.Linear(4, 4).to(torch.bfloat16)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: counted once in the totals


def test_summarize_model_counts_rows_and_totals() -> None:
    summary = summarize_model(Tied())
    rows = {row["name"]: row for row in summary["modules"]}
    assert list(rows) == ["(own)", "embed", "frozen", "half", "norm", "head"]
    assert rows["(own)"] == {
        "name": "(own)",
        "class": "Tied",
        "parameters": 3,
        "trainable": 3,
        "dtype": "float32",
        "size_mb": 0.0,
    }
    assert (rows["frozen"]["parameters"], rows["frozen"]["trainable"]) == (20, 0)
    assert rows["half"]["dtype"] == "bfloat16" and rows["head"]["parameters"] == 40
    assert rows["norm"]["parameters"] == 8  # the running statistics are buffers
    assert summary["parameters"] == 3 + 40 + 20 + 20 + 8  # the tied weight once
    assert summary["trainable"] == summary["parameters"] - 20
    params = 3 * 4 + 40 * 4 + 20 * 4 + 20 * 2 + 8 * 4
    assert summary["size_mb"] == round((params + 8 * 4 + 8) / 2**20, 3)  # + buffers
    mixed = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).half()), nn.ReLU())
    assert [r["dtype"] for r in summarize_model(mixed)["modules"]] == ["mixed", None]


def test_the_model_summary_table_is_aligned_with_a_total_row() -> None:
    table = format_model_summary(summarize_model(nn.Sequential(nn.Linear(1000, 1200), nn.ReLU())))
    lines = table.splitlines()
    assert lines[0].split() == ["module", "class", "params", "trainable", "dtype", "size", "MB"]
    assert lines[1].split() == ["0", "Linear", "1.2M", "1.2M", "float32", "4.582"]
    assert lines[-1].split() == ["total", "1.2M", "1.2M", "4.582"]
    assert len({line.index("1.2M") for line in (lines[1], lines[-1])}) == 1  # aligned
    assert format_model_summary({"modules": [{"name": "x"}]}).splitlines()[1].split() == [
        "x",
        "-",
        "?",
        "?",
        "-",
        "?",
    ]


def test_counts_and_durations_read_as_people_write_them() -> None:
    assert [format_count(n) for n in (610, 3_400, 1_234_567, 999_960, None)] == [
        "610",
        "3.4K",
        "1.2M",
        "1.0M",
        "?",
    ]
    assert [format_duration(s) for s in (0.25, 4.2, 83.4, 7507, None)] == [
        "250ms",
        "4.2s",
        "1m 23s",
        "2h 5m 7s",
        "?",
    ]


# --- banner, summary, lines -------------------------------------------------------------------


def test_the_banner_says_what_the_run_is_about_to_do() -> None:
    banner = format_banner(RUN_START)
    assert banner.splitlines()[0].split() == ["run", "sample", "/", RUN_START["run_id"]]
    for line in (
        f"run dir      {RUN_DIR}",
        "device       cpu (training_mode cpu, world size 1)",
        "precision    bf16",
        "parameters   610 total, 610 trainable (Sequential, 0.002 MB)",
        "schedule     2 epochs, 4 steps/epoch, 8 batches/epoch, effective batch 64",
        "validation   every 1 epoch, monitor val_loss (min)",
        "checkpoints  keeps the best by val_loss (min) + the newest",
        "model setup  no compile, checkpointing or channels_last",
        "seed         1234",
        "model init   9f2c4e1ab3d5 (same as the previous run)",
    ):
        assert line in banner.splitlines()
    assert banner.splitlines()[-1].split() == ["total", "610", "610", "0.002"]
    top_3 = copy.deepcopy(RUN_START)
    top_3["resolved"]["checkpoints"]["top_k"] = 3
    assert "checkpoints  keeps the 3 best by val_loss (min) + the newest" in format_banner(top_3)


def test_the_banner_of_an_older_record_leaves_out_what_it_lacks() -> None:
    old = {k: v for k, v in RUN_START.items() if k not in ("plan", "model_summary", "seed")}
    old["resolved"] = copy.deepcopy(old["resolved"])
    old["resolved"]["model_setup"] = {
        "compiled": ["model"],
        "channels_last": True,
        "activation_checkpointed": ["0", "1", "2", "3"],
        "micro_batch_size": 16,
    }
    lines = format_banner(old).splitlines()
    assert "parameters   610 total (Sequential)" in lines and "schedule     2 epochs" in lines
    assert "seed         none (not reproducible)" in lines  # from the config
    assert (
        "model setup  compiled model; activation checkpointing on 4 blocks (0, 1, 2, +1 "
        "more); channels_last; micro-batch 16"
    ) in lines
    assert not any(line.startswith(("validation", "module")) for line in lines)
    assert format_banner({"event": "run_start", "device": "cuda:0"}) == "device  cuda:0"


def digest_of(records: list[Record]) -> RunDigest:
    digest = RunDigest()
    for record in records:
        digest.update(record)
    return digest


def test_the_end_summary_gives_results_speed_and_where_things_are() -> None:
    lines = format_summary(RUN_END, digest_of(a_run()[:-1])).splitlines()
    assert lines == [
        "status           completed",
        "progress         2/2 epochs, 8 steps",
        f"best             val_loss 0.7079 (checkpoint {CKPT})",
        "final            train_loss 0.7274, val_loss 0.735, val_accuracy 43.75%, f1 0.8",
        "throughput       19.3K samples/s",
        "wall time        1m 23s",
        f"last checkpoint  {CKPT}",
        f"logs             {RUN_DIR}/events.jsonl",
        f"reports          {RUN_DIR}/training_metrics.png, {RUN_DIR}/performance_summary.txt",
        "alerts           1 warnings, 1 errors during the run (see logs)",
    ]


def test_the_summary_of_a_failed_run_gives_the_error_and_the_last_good_checkpoint() -> None:
    failed = {
        "event": "run_end",
        "level": "error",
        "status": "failed",
        "epochs_completed": 0,
        "global_step": 3,
        "error_type": "RuntimeError",
        "error": "CUDA error: boom",
        "last_checkpoint": None,
        "ts": "2026-11-22T12:01:52.790473Z",
    }
    old_start = {k: v for k, v in RUN_START.items() if k != "plan"}
    summary = format_summary(failed, digest_of([old_start, step(0, 1), step(0, 2)]))
    assert summary.splitlines() == [
        "status           failed",
        "error            RuntimeError: CUDA error: boom",
        "progress         0/2 epochs, 3 steps",
        "wall time        2.5s",  # from the records' timestamps (no elapsed_s)
        "last checkpoint  none was saved",
        f"logs             {RUN_DIR}/events.jsonl",
        f"reports          {RUN_DIR}/training_metrics.png, {RUN_DIR}/performance_summary.txt",
    ]
    assert format_summary({"event": "run_end"}) == "status           unknown\n" + (
        "last checkpoint  none was saved"
    )


def test_records_read_as_single_lines() -> None:
    assert format_epoch_line(epoch_end(0, 4, skipped_steps=1), max_epochs=2) == (
        "epoch 1/2  step 4  train_loss 0.7274  val_loss 0.735  val_accuracy 43.75%  f1 0.8  "
        "skipped 1  4.5K samples/s  time 57ms"
    )
    assert format_event_line(STALL) == (
        "warning: data_stall: no batch for 1m 0s: Raise the DataLoader's num_workers."
    )
    assert format_event_line(FAILED_CALLBACK) == (
        "error: callback_failed: Tracker: ValueError: tracker is down"
    )
    assert format_event_line(step(0, 1)) is None and format_event_line(RUN_END) is None


# --- the progress callback ----------------------------------------------------------------------


def lines_of(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.anyio
async def test_without_a_terminal_each_epoch_is_one_plain_line() -> None:
    out = io.StringIO()
    await feed(ProgressBar(file=out), a_run())
    text = out.getvalue()
    assert "\r" not in text
    assert text.startswith(format_banner(RUN_START) + "\n")
    assert text.endswith(format_summary(RUN_END, digest_of(a_run()[:-1])) + "\n")
    body = lines_of(text)[len(lines_of(format_banner(RUN_START))) : -10]
    assert body == [
        format_epoch_line(epoch_end(0, 4), max_epochs=2),
        format_event_line(STALL),
        format_epoch_line(epoch_end(1, 8), max_epochs=2),
        format_event_line(FAILED_CALLBACK),
    ]
    assert [line.split("  ")[0] for line in body] == [
        "epoch 1/2",
        "warning: data_stall: no batch for 1m 0s: Raise the DataLoader's num_workers.",
        "epoch 2/2",
        "error: callback_failed: Tracker: ValueError: tracker is down",
    ]


@pytest.mark.anyio
async def test_on_a_terminal_each_epoch_and_validation_has_a_bar() -> None:
    out = Terminal()
    await feed(ProgressBar(file=out), a_run())
    text = out.getvalue()
    assert "\r" in text and format_banner(RUN_START) in text and "wall time        1m 23s" in text
    shown = [part for part in re.split(r"[\r\n]", text) if part.startswith("epoch ")]
    final = [part for part in shown if "100%" in part]
    assert len(final) == 4  # two epochs, two validations: each bar completed, once
    rate = r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(step|batch)/s"  # elapsed<ETA, rate
    assert re.match(
        r"epoch 1/2: 100%\|#+\| 4/4 " + rate + r", loss=0\.7, accuracy=75\.00%, lr=1\.00e-03, "
        r"samples/s=1\.6K\]$",
        final[0],
    )
    assert re.match(
        r"epoch 1/2 val: 100%\|#+\| 2/2 " + rate + r", val_loss=0\.735, "
        r"val_accuracy=43\.75%, f1=0\.8\]$",
        final[1],
    )
    # Epoch 2 lost its step-6 record: the bar still ends at the step the records say.
    assert final[2].startswith("epoch 2/2: 100%") and " 4/4 [" in final[2]
    assert any(part.startswith("epoch 2/2:   0%") for part in shown)  # drawn while running
    assert "warning: data_stall: no batch for 1m 0s" in text


@pytest.mark.anyio
async def test_a_resumed_run_with_validation_inside_epochs_keeps_one_bar_per_epoch() -> None:
    start = copy.deepcopy(RUN_START)
    start["plan"]["val_every_n_steps"] = 3
    resumed = {"event": "resumed", "level": "info", "path": CKPT, "step": 6, "epoch": 1}
    out = Terminal()
    records = [start, resumed, step(1, 7), *validation(1, 7), step(1, 8), epoch_end(1, 8)]
    await feed(ProgressBar(file=out), [*records, RUN_END])
    parts = re.split(r"[\r\n]", out.getvalue())
    assert f"resumed from {CKPT} (step 6)" in parts
    assert "epoch 2/2 val  step 7  val_loss 0.735  val_accuracy 43.75%  f1 0.8" in parts
    bars = [part for part in parts if part.startswith("epoch 2/2: ")]
    assert any(" 3/4 [" in bar for bar in bars) and " 4/4 [" in bars[-1]  # from the epoch start
    assert "loss=0.7274, accuracy=75.00%, lr=1.00e-03" in bars[-1]  # epoch_end's loss, all ranks
    assert sum(part.startswith("epoch 2/2:   0%") for part in parts) == 1  # never reopened


def test_a_resume_says_which_lineage_it_took_and_what_it_passed_over() -> None:
    other = {"path": "b", "reason": "incompatible", "detail": "batch_size (checkpoint 16, now 8)"}
    resumed = {
        "event": "resumed",
        "level": "info",
        "path": CKPT,
        "step": 6,
        "epoch": 1,
        "lineage": "a",
        "branched": True,
        "passed_over": [other],
    }
    assert format_event_line(resumed) == (
        f"resumed from {CKPT} (step 6), in a new lineage: its own lineage has newer "
        "checkpoints; passed over 1 newer lineage(s): batch_size (checkpoint 16, now 8)"
    )
    fresh = {"event": "fresh_start", "level": "info", **other, "passed_over": [other, other]}
    assert format_event_line(fresh) == (
        "new run: resume='auto' left b alone, batch_size (checkpoint 16, now 8) (and 1 older "
        "lineages, none continuable) (resume='strict' would continue it or fail)"
    )


@pytest.mark.anyio
async def test_only_rank_zero_writes() -> None:
    out = Terminal()
    await feed(ProgressBar(file=out, mode="bar"), a_run(), Run(rank=1, world_size=2))
    assert out.getvalue() == ""


@pytest.mark.anyio
async def test_the_default_file_is_stderr_when_the_run_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = ProgressBar(mode="lines")  # created before the capture below replaced stderr
    capsys.readouterr()
    await feed(bar, a_run())
    captured = capsys.readouterr()
    assert captured.out == "" and "epoch 2/2  step 8" in captured.err


@pytest.mark.anyio
async def test_malformed_and_partial_records_are_skipped_not_raised() -> None:
    out = io.StringIO()
    odd: list[Record] = [
        {"event": "train_step"},
        {"event": "epoch_end", "epoch": "one", "samples": None},
        {"event": "validation", "metrics": "f1"},
        {"event": "checkpoint", "path": 3},
        {"event": "error", "level": "error"},
        {"event": "run_end", "ts": 5, "elapsed_s": "1"},
        {"event": "compile", "target": "model", "seconds": 12.5, "graph_breaks": 0},
    ]
    for mode in ("lines", "bar"):
        await feed(ProgressBar(file=out, mode=mode), odd)  # type: ignore[arg-type]
        await feed(ProgressBar(file=out, mode=mode), [RUN_START, *odd, step(0, 2), RUN_END])  # type: ignore[arg-type]
    assert "compiled model in 12.5s (0 graph breaks)" in out.getvalue()
    assert "epoch ?  n/a" not in out.getvalue()


def test_an_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^mode='fancy' is invalid; allowed: 'auto', 'bar'"):
        ProgressBar(mode="fancy")  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_real_run_shows_banner_epochs_and_summary(log_dir: Path) -> None:
    out = io.StringIO()
    train, val = loaders(n=128)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, max_epochs=2), logging=LoggingConfig(reports=False)
    )
    async with OptimizedTrainingOptimizer(
        config,
        model=make_model(),
        train_loader=train,
        val_loader=val,
        callbacks=[ProgressBar(file=out)],
    ) as run:
        results = await run.train()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and lines[0].startswith("run ")
    assert "device       cpu (training_mode cpu, world size 1)" in lines
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split("  ")[:2] for line in epochs] == [
        ["epoch 1/2", "step 4"],
        ["epoch 2/2", "step 8"],
    ]
    assert all("train_loss " in line and "val_loss " in line for line in epochs)
    assert "status           completed" in lines
    assert f"logs             {results.run_dir / 'events.jsonl'}" in lines
    assert not any(line.startswith("reports") for line in lines)  # reports=False
