"""Training jobs in real processes, killed where a test says: a fork server for the lineage
tests (``tests/test_lineage.py``).

The server imports torch and core once, then forks one child per job read from stdin (one
JSON object a line) and answers with how the child ended (one JSON line). A child trains the
job's run and writes what it trained to ``<out>/result.json`` and ``<out>/weights.pt``; it
may SIGKILL itself at its ``kill_at_forward``-th forward call or right before its
``kill_at_op``-th filesystem operation in the checkpoint directory (every ``os.rename``,
``os.replace``, ``os.symlink``, ``os.unlink``, ``os.rmdir``, ``shutil.rmtree`` and directory
swap, each recorded in ``<out>/ops.log`` before it runs), or cancel its ``train()`` task
(``task.cancel()``) at its ``cancel_at_forward``-th. Its wall clock (``time.time``,
``time.time_ns``) can be stepped by ``clock_offset_s``, as NTP or another host's clock would.
The server never trains itself, so every child starts from the same clean state.

    python -m tests.lineage_jobs < jobs.jsonl
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from core import create_optimized_training_optimizer
from core.checkpointing import atomic
from tests.helpers import make_classification, make_model

EXPERIMENT = "lineage"


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class FilesystemTrap:
    """Counts the filesystem operations in ``directory`` and kills the process right before
    the ``kill_at``-th (1-based); with ``kill_at`` None it only counts."""

    def __init__(self, directory: Path, kill_at: int | None, log: Path) -> None:
        self.directory, self.kill_at, self.count = str(directory), kill_at, 0
        self.log = log.open("a", buffering=1)
        self.inside = threading.local()  # within an rmtree of the directory

    def _ours(self, path: object) -> bool:
        text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        return text.startswith(self.directory) or getattr(self.inside, "rmtree", False)

    def op(self, name: str, *paths: Any) -> None:
        self.count += 1
        self.log.write(f"{self.count} {name} {' '.join(os.fsdecode(p) for p in paths)}\n")
        if self.count == self.kill_at:
            _kill()

    def wrap(self, owner: Any, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            where = args[1] if name == "symlink" else args[0]  # a link: where it is made
            if self._ours(where):
                self.op(name, *(a for a in args[:2] if isinstance(a, (str, os.PathLike))))
            return original(*args, **kwargs)

        setattr(owner, name, wrapped)

    def install(self, no_exchange: bool) -> None:
        for name in ("rename", "replace", "symlink", "unlink", "rmdir"):
            self.wrap(os, name)
        if no_exchange:  # a file system that cannot swap two directories: nothing happens
            atomic.exchange = lambda first, second: False
        else:
            self.wrap(atomic, "exchange")
        rmtree = shutil.rmtree

        def counted_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            if not self._ours(path):
                return rmtree(path, *args, **kwargs)
            self.op("rmtree", path)
            self.inside.rmtree = True
            try:
                return rmtree(path, *args, **kwargs)
            finally:
                self.inside.rmtree = False

        shutil.rmtree = counted_rmtree  # type: ignore[assignment]


def _optimizer(spec: dict[str, Any]) -> Callable[[Any], torch.optim.Optimizer]:
    settings = dict(spec)
    kind = getattr(torch.optim, settings.pop("name"))
    return lambda params: kind(params, **settings)


def _shift_clock(offset_s: float) -> None:
    """Step this process's wall clock by ``offset_s`` (monotonic clocks are left alone)."""
    time_ns, time_s = time.time_ns, time.time
    time.time_ns = lambda: time_ns() + int(offset_s * 1e9)
    time.time = lambda: time_s() + offset_s


def build(job: dict[str, Any], model: nn.Module | None = None) -> Any:
    """The job's run (its model, data and settings), not started."""
    log_dir = Path(job["log_dir"])
    train = DataLoader(  # shuffled by the global generator, which checkpoints restore
        make_classification(job.get("n", 64)), batch_size=job.get("batch_size", 8), shuffle=True
    )
    val = DataLoader(make_classification(32, seed=1), batch_size=16) if job.get("val") else None
    return create_optimized_training_optimizer(
        model=model or make_model(),
        train_loader=train,
        val_loader=val,
        log_dir=log_dir,
        experiment_name=EXPERIMENT,
        optimizer=_optimizer(job["optimizer"]),
        max_epochs=job.get("max_epochs", 2),
        progress=False,
        reports=False,
        **job["run"],
    )


def at_forward(model: nn.Module, calls: int, then: Callable[[], None]) -> None:
    """Call ``then`` right before the ``calls``-th forward of ``model``."""
    forwards = {"n": 0}

    def count(module: nn.Module, args: Any) -> None:
        forwards["n"] += 1
        if forwards["n"] == calls:
            then()

    model.register_forward_pre_hook(count)


async def _train(run: Any, cancel: threading.Event) -> Any:
    """``run.train()`` as a task, cancelled natively once ``cancel`` is set."""
    task = asyncio.ensure_future(run.train())
    waiter = asyncio.ensure_future(asyncio.to_thread(cancel.wait))
    try:
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            task.cancel()
        return await task
    finally:
        cancel.set()  # the waiting thread returns
        await waiter


def _run(job: dict[str, Any]) -> dict[str, Any]:
    out = Path(job["out"])
    checkpoints = Path(job["log_dir"]) / EXPERIMENT / "checkpoints"
    trap = FilesystemTrap(checkpoints, job.get("kill_at_op"), out / "ops.log")
    trap.install(job.get("no_exchange", False))
    if (offset := job.get("clock_offset_s")) is not None:
        _shift_clock(offset)
    model, cancel = make_model(), threading.Event()
    if (kill_at := job.get("kill_at_forward")) is not None:
        at_forward(model, kill_at, _kill)
    if (cancel_at := job.get("cancel_at_forward")) is not None:
        at_forward(model, cancel_at, cancel.set)
    run = build(job, model)
    try:
        results = asyncio.run(_train(run, cancel))
    except asyncio.CancelledError:
        return {"cancelled": True, "run_dir": str(run.run_dir), "ops": trap.count}
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "ops": trap.count}
    torch.save(model.state_dict(), out / "weights.pt")
    groups = [{k: v for k, v in g.items() if k != "params"} for g in run.optimizer.param_groups]
    return {
        "global_step": results.global_step,
        "epochs_completed": results.epochs_completed,
        "stopped_early": results.stopped_early,
        "run_dir": str(results.run_dir),
        "best_checkpoint": results.best_checkpoint,
        "param_groups": json.loads(json.dumps(groups, default=str)),
        "ops": trap.count,
    }


def _child(job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    result = _run(job)
    (out / "result.json").write_text(json.dumps(result))


def serve() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child(job)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        ended = {
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        }
        print(json.dumps(ended), flush=True)


if __name__ == "__main__":
    serve()
