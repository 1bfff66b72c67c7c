"""Small frictions a newcomer met: bf16 on a CPU that emulates it, the CLI's end summary,
the profiler's and MLflow's alarming stderr lines, and ``evaluate()``'s ``samples``."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog
import torch
from torch.utils.data import DataLoader

from core import (
    MixedPrecisionConfig,
    OptimizedTrainingOptimizer,
    ProgressBar,
    RunConfig,
    TrainingConfig,
)
from core.cli import run_fit
from core.precision import cpu_bf16
from core.precision.policy import PrecisionPolicy, fallback_precision
from core.telemetry import kineto
from core.telemetry.config import LoggingConfig
from tests.helpers import loaders, make_classification, make_model, pythonpath

CPU = torch.device("cpu")
NO_BF16 = {"architecture": "x86_64", "avx2": True, "avx512_bf16": False, "amx_bf16": False}
BF16 = {"architecture": "x86_64", "avx2": True, "avx512_bf16": True, "amx_bf16": False}


def emulated(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [entry for entry in logs if entry["event"] == "bf16_emulated"]


# -- 1. bf16 on a CPU without bf16 instructions ---------------------------------------------
def test_the_probe_reads_x86_and_arm_flags_and_falls_back_on_older_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for caps, native in (
        (NO_BF16, False),
        (BF16, True),
        ({"amx_bf16": True}, True),
        ({"architecture": "arm64", "neon": True}, False),
        ({"architecture": "arm64", "sve_bf16": True}, True),
    ):
        monkeypatch.setattr(cpu_bf16, "_capabilities", lambda caps=caps: caps)
        assert cpu_bf16.cpu_has_native_bf16() is native, caps
    monkeypatch.setattr(cpu_bf16, "_capabilities", lambda: None)  # no get_capabilities()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert cpu_bf16.cpu_has_native_bf16() is False
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_bf16.cpu_has_native_bf16() is None  # unknown: no warning is given


def test_auto_is_fp32_on_a_cpu_without_bf16_and_fp16_falls_back_to_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_bf16, "_capabilities", lambda: NO_BF16)
    with structlog.testing.capture_logs() as logs:
        auto = PrecisionPolicy(MixedPrecisionConfig(dtype="auto"), CPU)
    assert auto.precision.name == "fp32" and auto.describe()["note"] is None
    assert emulated(logs) == []
    assert fallback_precision(MixedPrecisionConfig(dtype="fp16"), CPU).name == "fp32"
    monkeypatch.setattr(cpu_bf16, "_capabilities", lambda: BF16)
    assert fallback_precision(MixedPrecisionConfig(dtype="fp16"), CPU).name == "bf16"


def test_explicit_bf16_where_it_is_native_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_bf16, "_capabilities", lambda: BF16)
    with structlog.testing.capture_logs() as logs:
        policy = PrecisionPolicy(MixedPrecisionConfig(dtype="bf16"), CPU)
    assert policy.precision.name == "bf16" and policy.describe()["note"] is None
    assert emulated(logs) == []


@pytest.mark.anyio
async def test_explicit_bf16_on_a_cpu_without_bf16_warns_once_in_the_log_and_the_banner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_bf16, "_capabilities", lambda: NO_BF16)
    train_loader, _ = loaders(n=64)
    console = io.StringIO()
    config = TrainingConfig(
        run=RunConfig(log_dir=tmp_path, max_epochs=1),
        precision=MixedPrecisionConfig(dtype="bf16"),
        logging=LoggingConfig(reports=False),
    )
    with structlog.testing.capture_logs() as logs:
        async with OptimizedTrainingOptimizer(
            config,
            model=make_model(),
            train_loader=train_loader,
            callbacks=[ProgressBar(file=console, mode="lines")],
        ) as run:
            results = await run.train()
    assert results.global_step == 2  # bf16 is honoured: the run trains
    (warning,) = emulated(logs)
    assert warning["log_level"] == "warning"
    assert "emulated" in str(warning["advice"]) and "dtype='auto'" in str(warning["advice"])
    (line,) = [row for row in console.getvalue().splitlines() if row.startswith("precision")]
    assert "bf16 (warning: bf16 on this CPU is emulated" in line and line.count("warning") == 1
    assert "dtype='auto' (fp32 on CPUs) or dtype='float32'" in line


# -- 2. the CLI's end summary -----------------------------------------------------------------
@pytest.mark.parametrize("progress", [True, False])
def test_the_cli_prints_the_end_summary_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], progress: bool
) -> None:
    argv = [
        "--model",
        "tests.test_cli:tiny_model",
        "--data",
        "tests.test_cli:tiny_data",
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--num-workers",
        "0",
        "--no-reports",
        "--log-dir",
        str(tmp_path),
        *([] if progress else ["--no-progress"]),
    ]
    outcome = run_fit(argv)
    assert outcome.exit_code == 0 and outcome.results is not None
    out, err = capsys.readouterr()
    printed = out + err
    # The progress display's summary (on stderr), or the plain outcome lines without it.
    summaries = re.findall(r"^status +completed$", printed, flags=re.MULTILINE)
    outcome_lines = re.findall(r"^epochs=1 steps=5 train_loss=", printed, flags=re.MULTILINE)
    assert (len(summaries), len(outcome_lines)) == ((1, 0) if progress else (0, 1))
    run_dir = outcome.results.run_dir
    assert out.count(f"run directory: {run_dir}\n") == 1
    assert out.count(f"results: {run_dir / 'results.json'}\n") == 1


# -- 3. the trackers example's stderr -------------------------------------------------------
TRACKED = """
import logging
import anyio, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from core import MLflowLogger, create_optimized_training_optimizer

x = torch.randn(128, 16); y = (x[:, 0] > 0).long()
data = DataLoader(TensorDataset(x, y), batch_size=32)
run = create_optimized_training_optimizer(
    model=nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2)), train_loader=data,
    max_epochs=1, log_dir="logs", experiment_name="tracked", reports=False,
    callbacks=[MLflowLogger()], profile_steps=(1, 1, 1), callback_grace_s=120.0,
)
results = anyio.run(run.train)
run.close()
print("trace", (results.run_dir / "profile" / "trace.json").exists())
print("levels", logging.getLogger("mlflow").level, logging.getLogger("alembic").level)
"""


@pytest.mark.slow  # importing mlflow takes seconds
def test_a_profiled_run_with_mlflow_writes_no_alarming_lines(tmp_path: Path) -> None:
    for package in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(package)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRACKED)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trace True" in done.stdout  # the profiler ran (on the step thread)
    assert (tmp_path / "logs" / "mlflow.db").exists()  # and the store was created
    assert "External init callback" not in done.stderr
    assert not re.search(r"\bINFO\b", done.stderr), done.stderr
    # MLflow's own levels are back: INFO for mlflow, WARNING for alembic (as MLflow sets them).
    assert f"levels {logging.INFO} {logging.WARNING}" in done.stdout


def test_only_kinetos_false_alarm_is_dropped_and_only_at_the_first_start(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "_started", False)
    noise = b"ERROR: External init callback must run in same thread as registerClient (1 != 2)\n"
    with kineto.quiet_first_start():
        os.write(2, noise)  # as kineto's C code writes it
        os.write(2, b"a line written meanwhile\n")
    with kineto.quiet_first_start():
        os.write(2, noise)  # not the first start: left alone
    err = capfd.readouterr().err
    assert err.count("External init callback") == 1
    assert "a line written meanwhile\n" in err
    assert err.index("a line written meanwhile") < err.index("External init callback")


# -- 6. evaluate()'s samples ----------------------------------------------------------------
@pytest.mark.anyio
async def test_evaluate_samples_is_the_number_of_samples_evaluated(tmp_path: Path) -> None:
    train_loader, _ = loaders(n=64)
    config = TrainingConfig(
        run=RunConfig(log_dir=tmp_path, max_epochs=1), logging=LoggingConfig(progress=False)
    )
    held_out = make_classification(70, seed=4)  # batches of 32, 32 and 6
    async with OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=train_loader
    ) as run:
        scores = await run.evaluate(DataLoader(held_out, batch_size=32))
    assert scores["samples"] == len(held_out) == 70
    assert "samples" in (OptimizedTrainingOptimizer.evaluate.__doc__ or "")
