"""A training process for fault-injection tests (tests/test_reliability.py).

    python tests/fault_jobs.py --out DIR [--resume auto] [--kill-at-call K] ...
    python -m torch.distributed.run --nproc_per_node=2 tests/fault_jobs.py --out DIR ...

Trains a small model with dropout on shuffled data in fp16 with an LR schedule and
checkpoints every ``--every-n-steps`` steps; then writes its final state to
``DIR/final.rank<R>.pt``. Faults are injected from inside the process, at a chosen forward
call: SIGKILL itself, stall between a checkpoint's write and its commit, exit once, hang, or
freeze the whole process (a C call that holds the GIL), or (``--kill-at-handback``) SIGKILL
the training process while it hands the trained weights back.
With ``--isolation process`` the model trains in a child process, where the faults strike;
the final state's optimizer, scheduler and scaler then come from the run's last checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core import MultiGPUConfig, create_optimized_training_optimizer  # noqa: E402
from core.checkpointing.store import CheckpointStore  # noqa: E402
from core.errors import CoreError, SignalReceived, TrainingProcessDied  # noqa: E402


def step_lr(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)


class Faulty(nn.Module):
    """An MLP with dropout that can kill, hang or exit its process at a chosen forward call."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Tanh(), nn.Linear(32, 2))
        self.args, self.rank, self.calls = args, rank, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            self._inject()
        out: torch.Tensor = self.net(x)
        return out

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        if self.args.kill_at_handback and _called_from("hand_back"):
            os.kill(os.getpid(), signal.SIGKILL)  # the training process, handing back
        return super().state_dict(*args, **kwargs)

    def _inject(self) -> None:
        a = self.args
        if self.calls == a.kill_at_call:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.calls == a.exit_at_call and self.rank == a.exit_rank:
            marker = Path(a.out) / "exited_once"
            if not marker.exists():
                marker.write_text("1")
                os._exit(1)
        if self.calls == a.hang_at_call and self.rank == a.hang_rank:
            (Path(a.out) / f"hanging.rank{self.rank}").write_text("1")
            time.sleep(3600)
        if self.calls == a.freeze_at_call:  # the whole process: libc's sleep holding the GIL
            (Path(a.out) / "frozen").write_text(str(self.calls))
            ctypes.PyDLL(None).sleep(3600)
        if self.calls == a.pause_at_call:
            (Path(a.out) / "paused").write_text(str(self.calls))
            time.sleep(a.pause_s)
        if a.slow_s:
            time.sleep(a.slow_s)


def _called_from(function: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def stall_before_commit(out: Path, from_step: int) -> Any:
    def hook(staging: Path) -> None:
        if int(staging.name[len(".step-") :][:9]) >= from_step:
            (out / "stalled").write_text(str(staging))
            time.sleep(3600)

    return hook


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--every-n-steps", type=int, default=2)
    p.add_argument("--precision", default="fp16")
    p.add_argument("--resume", default=None)
    p.add_argument("--kill-at-call", type=int, default=-1)
    p.add_argument("--stall-commit-from-step", type=int, default=-1)
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-at-call", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at-call", type=int, default=-1)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--pause-at-call", type=int, default=-1)
    p.add_argument("--pause-s", type=float, default=1.0)
    p.add_argument("--freeze-at-call", type=int, default=-1)
    p.add_argument("--kill-at-handback", action="store_true")
    p.add_argument("--runner", choices=("anyio", "asyncio"), default="anyio")
    p.add_argument("--hang-loader-at-batch", type=int, default=-1)
    p.add_argument("--stop-grace-s", type=float, default=30.0)
    p.add_argument("--data-stall-warn-s", type=float, default=10.0)  # the library's default
    p.add_argument("--isolation", choices=("thread", "process"), default="thread")
    return p.parse_args(argv)


class HangingLoader:
    """A loader whose ``at``-th batch (counted over the whole job) never comes."""

    def __init__(self, loader: DataLoader[Any], at: int, out: Path) -> None:
        self.loader, self.at, self.out, self.served = loader, at, out, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            if self.served == self.at:
                (self.out / "loader_hung").write_text(str(self.served))
                time.sleep(3600)
            self.served += 1
            yield batch


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 8, generator=g)
    data = TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())
    from core import GradientAccumulationConfig

    loader: Any = DataLoader(data, batch_size=args.batch, shuffle=True)
    if args.hang_loader_at_batch >= 0:
        loader = HangingLoader(loader, args.hang_loader_at_batch, args.out)
    optimizer = create_optimized_training_optimizer(
        model=Faulty(args, rank),
        train_loader=loader,
        max_epochs=args.epochs,
        learning_rate=1e-2,
        amp_dtype=args.precision,
        amp_init_scale=2.0**8,
        scheduler=step_lr,
        gradient_accumulation_config=GradientAccumulationConfig(args.accum),
        log_dir=args.out / "logs",
        experiment_name="faults",
        seed=0,
        checkpoint_every_n_steps=args.every_n_steps,
        keep_last_n=3,
        resume=args.resume,
        handle_signals=args.runner == "anyio",  # asyncio.run: the defaults a newcomer keeps
        stop_grace_s=args.stop_grace_s,
        data_stall_warn_s=args.data_stall_warn_s,
        multi_gpu_config=MultiGPUConfig(timeout_s=args.timeout_s),
        isolation=args.isolation,
    )
    if args.stall_commit_from_step > 0:
        optimizer._built.checkpointer.store.before_commit = stall_before_commit(
            args.out, args.stall_commit_from_step
        )
    try:
        if args.runner == "asyncio":
            results = asyncio.run(optimizer.train())
        else:
            results = anyio.run(optimizer.train)
    except TrainingProcessDied as exc:
        print(f"rank {rank}: TrainingProcessDied: {exc}", flush=True)
        return 3
    except SignalReceived as exc:
        print(f"rank {rank}: {exc}", flush=True)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C under asyncio.run: train() was cancelled, then saved
        print(f"rank {rank}: interrupted", flush=True)
        return 130
    except CoreError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        return 1
    finally:
        optimizer.close()
    if args.isolation == "process":
        return save_from_last_checkpoint(optimizer, args.out, results)
    inner = optimizer._built.strategy.unwrap(optimizer.model)
    torch.save(
        {
            "model": inner.state_dict(),
            "optimizer": optimizer.optimizer.state_dict(),
            "scheduler": optimizer.scheduler.state_dict(),
            "precision": optimizer.mixed_precision.state_dict(),
            "global_step": optimizer.global_step,
            "results": results.to_dict(),
        },
        args.out / f"final.rank{rank}.pt",
    )
    return 0


def save_from_last_checkpoint(optimizer: Any, out: Path, results: Any) -> int:
    """The final state of a run trained in a child process: the service's model (loaded with
    the trained weights) and the rest from the checkpoint the run wrote at its last step."""
    last = Path(optimizer.last_checkpoint)
    state = CheckpointStore(last.parent, keep_last_n=1).load_state(last)
    assert state["trainer"]["global_step"] == optimizer.global_step == results.global_step
    torch.save(
        {
            "model": optimizer.model.state_dict(),
            "optimizer": state["optimizer"],
            "scheduler": state["trainer"]["scheduler"],
            "precision": state["trainer"]["precision"],
            "global_step": optimizer.global_step,
            "results": results.to_dict(),
        },
        out / "final.rank0.pt",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(parse()))
