"""One command that measures every GPU claim and says pass or fail against its goal.

    python -m benchmarks.gpu_suite --out results/gpu          # on a CUDA machine (< 7 min)
    python -m benchmarks.gpu_suite --dry-run --out /tmp/gs    # plumbing check on any machine
    python -m benchmarks.gpu_suite --only overhead_gpt2,mfu_core --out results/gpu
    bash benchmarks/gpu_proof.sh results/gpu                  # + nvidia-smi, pytest -m gpu

Writes ``OUT/gpu_suite.md`` (a table: case, figure, value, goal, status, note) and
``OUT/gpu_suite.json``, headed by the device, driver, torch and CUDA versions and the date.
The header is written before the first case and both files are rewritten as each case
ends, so a run stopped part-way keeps every row measured so far (``state`` names the case
that was running). Each case runs under a time budget (SIGALRM); a case the device cannot
do is "skipped" with the reason; an exception (or a spent budget) is recorded as
"error: ..." and the suite goes on. Cases with rounds run as many as fit their budget (at
least one; the row says how many). ``--time-limit`` shortens the budgets of the last cases,
or skips them, so that the whole run ends in time. A dry run uses tiny sizes and does not
judge goals.

Every core run is like for like with its hand-written loop: ``compile=False`` everywhere
but the two compiled cases (``compile``, and ``mfu_core`` where both sides compile), fused
AdamW, the same precision (TF32 on for fp32 matmuls on every side), start-up included.

Budgets, sized from an H100 80GB (GPT-2 small bf16 at 8 x 1024 eager: up to ~0.12 s per
step, ~12 s per 100-step ``train()``; the MLP's 300 steps: ~1-1.5 s; a cold inductor compile
of GPT-2 medium: under a minute), in the order the cases run:

    overhead_gpt2             115 s   hand, core, Fabric, Accelerate: 100 steps, 2-3 rounds
    overhead_mlp               25 s   the same four on the MLP: 300 steps x 2, up to 5 rounds
    sync_check                 12 s   core: GPT-2 10 steps, MLP 30 steps; a sync is an error
    mfu_core                   65 s   core compile=True, GPT-2 medium 16 x 1024, 2 x 8 steps
    mfu                        35 s   the hand step, same job (inductor cache warm), 11 steps
    precision                  30 s   8 core runs, 2 epochs x 6 steps each
    monitor                    20 s   MLP 10 Hz monitor / off, up to 5 rounds
    ddp                        30 s   torchrun, world size 1 / single GPU, 3 rounds
    activation_checkpointing    8 s
    batch_size_finder          10 s
    compile                    90 s   GPT-2 small compiled / eager, three ways (the model, the
                                      model with its loss, forward with backward), 3 rounds x
                                      10 steps; last, so its three compilations never crowd
                                      out another case
                              ----
                              440 s   7.3 minutes; with start-up the suite ends within 7.6.
                                      ``bash benchmarks/gpu_proof.sh OUT`` adds the facts
                                      and ``pytest -m gpu`` and ends within 9 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from benchmarks import gpu_suite_overhead as overhead
from benchmarks import gpu_suite_speed as speed
from benchmarks import gpu_suite_tools as tools
from benchmarks.gpu_suite_rows import CaseTimeout, Ctx, Row

__all__ = ("CASES", "CaseTimeout", "header", "main", "run_case", "write")

# name: (function, time budget in seconds on a GPU). The budgets add up to 440 s.
CASES: dict[str, tuple[Callable[[Ctx], list[Row]], int]] = {
    "overhead_gpt2": (overhead.overhead_gpt2, 115),
    "overhead_mlp": (overhead.overhead_mlp, 25),
    "sync_check": (overhead.sync_check, 12),
    "mfu_core": (speed.mfu_core, 65),
    "mfu": (speed.mfu, 35),
    "precision": (speed.precision, 30),
    "monitor": (tools.monitor, 20),
    "ddp": (tools.ddp, 30),
    "activation_checkpointing": (tools.activation_checkpointing, 8),
    "batch_size_finder": (tools.batch_size_finder, 10),
    "compile": (tools.compile_case, 90),
}
DRY_RUN_BUDGET_S = 30
MIN_CASE_S = 10  # under --time-limit, a case with less time left than this is skipped


def _driver() -> str:
    try:
        import pynvml  # nvidia-ml-py; optional

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return f"{version.decode() if isinstance(version, bytes) else version} (NVML)"
    except Exception:  # no NVML library, no GPU, no driver: try the next source
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True)
            return f"{out.stdout.splitlines()[0].strip()} (nvidia-smi)"
        except (subprocess.SubprocessError, OSError, IndexError):
            pass
    if torch.cuda.is_available():
        try:  # private (no public API for it): the driver's CUDA API version, e.g. 12040
            api = int(torch._C._cuda_getDriverVersion())  # type: ignore[attr-defined]
            return f"CUDA driver API {api // 1000}.{api % 1000 // 10} (torch.cuda)"
        except (AttributeError, RuntimeError):
            pass
    return "unknown"


def header(device: torch.device, dry_run: bool) -> dict[str, Any]:
    """The facts that head both files: device, driver, versions, date, mode."""
    cpu = f"cpu ({platform.machine() or 'unknown'})"
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
        "driver": _driver(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "dry-run" if dry_run else "full",
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }


@contextmanager
def _budget(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"time budget of {seconds:g} s spent")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _restore_globals() -> Callable[[], None]:
    matmul, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32

    def restore() -> None:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch._dynamo.reset()
        gc.collect()  # a case's models and optimizer states, before the next case measures
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")  # in case a budget cut a sync check
            torch.cuda.empty_cache()

    return restore


def run_case(name: str, ctx: Ctx, budget: float | None = None) -> tuple[list[Row], float]:
    """Run one case under its budget (``budget`` shortens it): its rows, or one
    "error: ..." row; and its seconds."""
    fn, full = CASES[name]
    seconds: float = DRY_RUN_BUDGET_S if ctx.dry_run else full
    if budget is not None:
        seconds = min(seconds, budget)
    restore = _restore_globals()
    started = time.perf_counter()
    ctx = replace(ctx, deadline=time.monotonic() + seconds)
    try:
        with _budget(seconds):
            rows = fn(ctx)
    except Exception as error:  # one case failing must not stop the suite
        detail = getattr(error, "stderr", None)
        tail = f" [{str(detail)[-300:]}]" if detail else ""
        reason = f"error: {type(error).__name__}: {error}{tail}".replace("\n", " ")
        traceback.print_exc(file=sys.stderr)
        rows = [Row(name, "-", "-", "-", reason[:600])]
    finally:
        restore()
    return rows, time.perf_counter() - started


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file: a reader (or a kill) never sees
    a half-written table."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def write(out: Path, head: dict[str, Any], rows: list[Row], seconds: dict[str, float]) -> None:
    """Write ``gpu_suite.md`` and ``gpu_suite.json`` into ``out`` (the whole table so far)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# GPU suite", ""]
    lines += [f"- {key}: {value}" for key, value in head.items()]
    lines += ["", "| case | figure | value | goal | status | note |", "|---|---|---:|---|---|---|"]
    for row in rows:
        cells = (row.case, row.figure, row.value, row.goal, row.status, row.note)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "Seconds per case: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())]
    _replace_file(out / "gpu_suite.md", "\n".join(lines) + "\n")
    data = {**head, "rows": [asdict(r) for r in rows], "case_seconds": seconds}
    _replace_file(out / "gpu_suite.json", json.dumps(data, indent=2) + "\n")


def _names(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown!r}; choose from {', '.join(CASES)}")
    return names


def _time_left(limit: float | None, started: float) -> float | None:
    return None if limit is None else limit - (time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the chosen cases, write the files as each case ends; 0
    unless a goal failed or a case errored (a dry run returns 1 only for errors)."""
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes; goals not judged")
    parser.add_argument("--out", type=Path, default=Path("results/gpu"))
    parser.add_argument("--only", help=f"comma-separated cases from: {', '.join(CASES)}")
    parser.add_argument("--skip", help="comma-separated cases to leave out")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="end the whole run within this many seconds: a case gets at most the time left, "
        f"and one with under {MIN_CASE_S} s left is skipped",
    )
    args = parser.parse_args(argv)
    only, skip = _names(args.only) or list(CASES), _names(args.skip)
    chosen = [name for name in CASES if name in only and name not in skip]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    head = header(device, args.dry_run)
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    write(args.out, {**head, "state": "starting"}, rows, seconds)
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            left = _time_left(args.time_limit, started)
            if device.type != "cuda" and not args.dry_run:
                reason = "no CUDA device (run with --dry-run to check the plumbing)"
                rows.append(Row(name, "-", "-", "-", "skipped", reason))
            elif left is not None and left < MIN_CASE_S:
                reason = f"--time-limit {args.time_limit:g} s reached ({left:.0f} s left)"
                rows.append(Row(name, "-", "-", "-", "skipped", reason))
            else:
                write(args.out, {**head, "state": f"running {name}"}, rows, seconds)
                ctx = Ctx(device, args.dry_run, Path(tmp) / name)
                ctx.tmp.mkdir()
                case_rows, seconds[name] = run_case(name, ctx, left)
                rows += case_rows
                sys.stderr.write(f"gpu_suite: {name} done in {seconds[name]:.1f} s\n")
            write(args.out, {**head, "state": f"done up to {name}"}, rows, seconds)
    write(args.out, {**head, "state": "complete"}, rows, seconds)
    sys.stdout.write((args.out / "gpu_suite.md").read_text())
    bad = [r for r in rows if r.status.startswith("error") or r.status == "fail"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
