"""Launch helpers: a free port, an in-process group, torchrun, and the ranks of ``devices=N``.

launch_distributed_training("train.py", world_size=8, nnodes=2, rdzv_endpoint="10.0.0.1:29500")
launch_local_ranks(2, *python_module("core", ["fit", "--example", "digits"]))
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from core.distributed.environment import DistributedEnvironment, rendezvous_address
from core.errors import config_error

__all__ = (
    "get_free_port",
    "launch_distributed_training",
    "launch_local_ranks",
    "python_module",
    "quiet_agent",
    "setup_distributed_environment",
)

TIMEOUT_EXIT_CODE = 124
_PORT_ATTEMPTS = 3
_AGENT_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
)


def get_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (for MASTER_PORT / rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def setup_distributed_environment(
    world_size: int = 1,
    backend: str | None = None,
    init_method: str = "env://",
    *,
    rank: int | None = None,
) -> dict[str, Any]:
    """Join (or create) the default process group from a process torchrun did not start
    (MASTER_ADDR defaults to 127.0.0.1, MASTER_PORT to a free port, ``rank`` to 0; under
    torchrun its environment wins). Returns rank, world size and backend."""
    env = DistributedEnvironment.from_environ()
    if env is not None:
        world_size, rank = env.world_size, env.rank
    rank = 0 if rank is None else rank
    if not 0 <= rank < world_size:
        raise config_error("rank", rank, f"0 <= rank < world_size={world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if init_method == "env://":
        addr, port = rendezvous_address()
        os.environ["MASTER_ADDR"] = addr or "127.0.0.1"
        os.environ["MASTER_PORT"] = port or str(get_free_port())
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank)
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
    }


def launch_distributed_training(
    script_path: str | os.PathLike[str],
    world_size: int,
    *,
    script_args: Sequence[str] = (),
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> int:
    """Run ``script_path`` under torchrun (in a session of its own) with ``world_size``
    processes per node; its exit code (124 if ``timeout_s`` passed, every worker stopped)."""
    if not Path(script_path).exists():
        raise config_error("script_path", str(script_path), "an existing Python file")
    if world_size < 1:
        raise config_error("world_size", world_size, "an integer >= 1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world_size}",
        f"--nnodes={nnodes}",
        f"--max-restarts={max_restarts}",
    ]
    if rdzv_endpoint is None:
        command.append("--standalone")
    else:
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    command += [str(script_path), *script_args]
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_session(process)
        return TIMEOUT_EXIT_CODE


def _stop_session(process: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def python_module(module: str, argv: Sequence[str]) -> tuple[str, list[str]]:
    """``(entrypoint, args)`` running ``python -u -m module argv`` in each rank."""
    return sys.executable, ["-u", "-m", module, *argv]


def launch_local_ranks(
    nprocs: int,
    entrypoint: Callable[..., Any] | str,
    args: Sequence[Any] = (),
    *,
    shutdown_timeout_s: int | None = None,
) -> dict[int, Any]:
    """Start ``nprocs`` ranks on this machine through torch's ``elastic_launch`` and wait;
    ``{rank: return value}`` (None for a command). ``entrypoint`` is a function (module-level
    where this process initialized CUDA: ranks are then spawned) or a command
    (:func:`python_module`).

    A failed rank raises ``ChildFailedError`` once the others are stopped; SIGTERM/SIGINT
    reach every rank and raise ``SignalException`` (after ``shutdown_timeout_s`` they are
    killed). Blocking: never call it on an event loop.
    """
    if not (isinstance(nprocs, int) and nprocs >= 1):
        raise config_error("nprocs", nprocs, "an integer >= 1")
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    quiet_agent(logging.ERROR)  # not "Received 2 death signal, shutting down workers"
    # Two differences from torchrun take seconds off the start (benchmarks/startup.py): ranks
    # forked from this process, which imported torch already (never where it touched CUDA),
    # and the static rendezvous on a free local port (one machine, no nodes to wait for).
    start_method, target = "spawn", entrypoint
    if callable(entrypoint) and not torch.cuda.is_initialized():
        start_method, target = "fork", _as_if_spawned(entrypoint)
    attempts = 0
    while True:
        attempts += 1
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nprocs,
            run_id=str(uuid.uuid4()),
            rdzv_backend="static",
            rdzv_endpoint=f"127.0.0.1:{get_free_port()}",
            rdzv_configs={"rank": 0},
            max_restarts=0,
            monitor_interval=0.1,
            start_method=start_method,
            shutdown_timeout=shutdown_timeout_s,
        )
        try:
            with _torchrun_environment(nprocs, command=isinstance(entrypoint, str)):
                values: dict[int, Any] = elastic_launch(config, target)(*args)
            return values
        except dist.DistNetworkError:  # the free port was taken before its store bound it
            if attempts == _PORT_ATTEMPTS:
                raise


def quiet_agent(level: int) -> None:
    """Raise torch's agent loggers to ``level`` (never lowered): it logs every stop step as
    a warning, and a Ctrl-C is not news to the user who pressed it."""
    import torch.distributed.elastic.agent.server.local_elastic_agent
    import torch.distributed.launcher.api  # noqa: F401 (their loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith(_AGENT_LOGGERS):
            logger = logging.getLogger(name)
            logger.setLevel(max(logger.getEffectiveLevel(), level))


def _as_if_spawned(entrypoint: Callable[..., Any]) -> Callable[..., Any]:
    """``entrypoint`` for a forked rank, started as a spawned one: default stop-signal
    handlers, and the OpenMP pool ``OMP_NUM_THREADS`` sets (an inherited pool ignores it)."""

    @functools.wraps(entrypoint)
    def rank(*args: Any) -> Any:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for stop in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, signal.SIG_DFL)
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        return entrypoint(*args)

    return rank


@contextmanager
def _torchrun_environment(nprocs: int, *, command: bool) -> Iterator[None]:
    """What torchrun sets before it starts the ranks, restored after: ``OMP_NUM_THREADS=1``
    unless set (full pools on shared cores slow each other); for a command, this ``core``
    first on PYTHONPATH."""
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "PYTHONPATH")}
    if nprocs > 1 and saved["OMP_NUM_THREADS"] is None:
        os.environ["OMP_NUM_THREADS"] = "1"
    if command:
        root = str(Path(__file__).resolve().parents[2])
        before = saved["PYTHONPATH"] or ""
        if root not in before.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, before) if p)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
