"""One command that measures every GPU claim and says pass or fail against its goal.

    python -m benchmarks.gpu_suite --out results/gpu          # on a CUDA machine (< 8 min)
    python -m benchmarks.gpu_suite --dry-run --out /tmp/gs    # plumbing check on any machine
    python -m benchmarks.gpu_suite --only overhead,mfu --out results/gpu

Writes ``OUT/gpu_suite.md`` (a table: case, figure, value, goal, status, note) and
``OUT/gpu_suite.json``, headed by the device, driver, torch and CUDA versions and the date.
Each case runs under a time budget (SIGALRM); a case the device cannot do is "skipped" with
the reason; an exception (or a spent budget) is recorded as "error: ..." and the suite goes
on. A dry run uses tiny sizes and does not judge goals.
"""

from __future__ import annotations

import argparse
import datetime
import json
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
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from benchmarks import gpu_suite_speed as speed
from benchmarks import gpu_suite_tools as tools
from benchmarks.gpu_suite_rows import Ctx, Row

__all__ = ("CASES", "header", "main", "run_case", "write")

# name: (function, time budget in seconds on a GPU). The budgets add up to 460 s.
CASES: dict[str, tuple[Callable[[Ctx], list[Row]], int]] = {
    "overhead": (speed.overhead_case, 75),
    "precision": (speed.precision, 60),
    "mfu": (speed.mfu, 100),
    "compile": (tools.compile_case, 70),
    "activation_checkpointing": (tools.activation_checkpointing, 25),
    "batch_size_finder": (tools.batch_size_finder, 35),
    "monitor": (tools.monitor, 40),
    "ddp": (tools.ddp, 55),
}
DRY_RUN_BUDGET_S = 30


class CaseTimeout(Exception):
    """Raised in the main thread when a case spends its time budget."""


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
def _budget(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"time budget of {seconds} s spent")

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
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    return restore


def run_case(name: str, ctx: Ctx) -> tuple[list[Row], float]:
    """Run one case under its budget: its rows, or one "error: ..." row; and its seconds."""
    fn, budget = CASES[name]
    restore = _restore_globals()
    started = time.perf_counter()
    try:
        with _budget(DRY_RUN_BUDGET_S if ctx.dry_run else budget):
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


def write(out: Path, head: dict[str, Any], rows: list[Row], seconds: dict[str, float]) -> None:
    """Write ``gpu_suite.md`` and ``gpu_suite.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# GPU suite", ""]
    lines += [f"- {key}: {value}" for key, value in head.items()]
    lines += ["", "| case | figure | value | goal | status | note |", "|---|---|---:|---|---|---|"]
    for row in rows:
        cells = (row.case, row.figure, row.value, row.goal, row.status, row.note)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "Seconds per case: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())]
    (out / "gpu_suite.md").write_text("\n".join(lines) + "\n")
    data = {**head, "rows": [asdict(r) for r in rows], "case_seconds": seconds}
    (out / "gpu_suite.json").write_text(json.dumps(data, indent=2) + "\n")


def _names(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown!r}; choose from {', '.join(CASES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the chosen cases, write the files; 0 unless a goal failed
    or a case errored (a dry run returns 1 only for errors)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes; goals not judged")
    parser.add_argument("--out", type=Path, default=Path("results/gpu"))
    parser.add_argument("--only", help=f"comma-separated cases from: {', '.join(CASES)}")
    parser.add_argument("--skip", help="comma-separated cases to leave out")
    args = parser.parse_args(argv)
    only, skip = _names(args.only) or list(CASES), _names(args.skip)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    head = header(device, args.dry_run)
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            if name in skip or name not in only:
                continue
            if device.type != "cuda" and not args.dry_run:
                reason = "no CUDA device (run with --dry-run to check the plumbing)"
                rows.append(Row(name, "-", "-", "-", "skipped", reason))
                continue
            ctx = Ctx(device, args.dry_run, Path(tmp) / name)
            ctx.tmp.mkdir()
            case_rows, seconds[name] = run_case(name, ctx)
            rows += case_rows
            sys.stderr.write(f"gpu_suite: {name} done in {seconds[name]:.1f} s\n")
    write(args.out, head, rows, seconds)
    sys.stdout.write((args.out / "gpu_suite.md").read_text())
    bad = [r for r in rows if r.status.startswith("error") or r.status == "fail"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
