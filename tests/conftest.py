"""Shared fixtures (helpers for building tiny jobs live in tests/helpers.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.torchrun import SCENARIOS, torchrun

# Started in the background by a shell (`make test &`), pytest inherits SIGINT ignored, and
# every program a test starts would too: its Ctrl-C, which the tests send, would do nothing.
# A Python handler here is reset to the default in each program started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on both backends unless it overrides this fixture."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _small_torch() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture(autouse=True)
def _training_plot_only_where_asked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run of the suite writes its ``performance_summary.txt``, but in this process,
    before ``train()`` returns, and without ``training_metrics.png``: a run's child process
    that renders it takes about a second on a 2-core machine. Tests marked ``plots``, the
    README programs and the multi-process jobs keep the real thing (written in the
    background: ``core.wait_for_reports`` waits for it)."""
    if request.node.get_closest_marker("plots") is None:
        import core.reports
        import core.trainer.epochs.cycle
        from core.reports.apart import ReportJob

        # For the whole test, not around each run's reports: two runs closing at once
        # would each save and restore the other's stand-in, and leave it for later tests.
        for figure in (
            "write_training_plot",
            "write_expert_activations",
            "write_expert_device_distribution",
        ):
            monkeypatch.setattr(core.reports, figure, lambda records, path: None)

        def summary_only(run_dir: Path) -> ReportJob:
            core.reports.write_reports(run_dir)
            return ReportJob.done(run_dir)

        monkeypatch.setattr(core.trainer.epochs.cycle, "start_reports", summary_only)


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun launch runs every scenario of tests/distributed_jobs.py (startup
    dominates a job's cost); the tests read what each saved."""
    out = tmp_path_factory.mktemp("jobs")
    torchrun(out, *SCENARIOS)
    return out


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fault_jobs.py run to its end once: the reference every kill-and-resume test of
    the session compares with (a job's runner, isolation and ``--slow-s`` pace change no
    number it saves, so one reference serves the reliability, cancellation and process
    tests; each start of it costs seconds of imports)."""
    from tests.test_reliability import job

    out = tmp_path_factory.mktemp("uninterrupted")
    done = job(out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster for the session's ``ray`` tests, this process its driver: a
    head node that runs no actors (0 CPUs) and a worker node of 2 CPUs, where every run's
    actor lands, so that a test can add nodes and remove them (the head cannot be). Its
    workers preload torch and core, as a cluster core starts itself does. Skipped where Ray
    is not installed."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    import ray

    os.environ.setdefault("RAY_preload_python_modules", "torch,core")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="core", configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
