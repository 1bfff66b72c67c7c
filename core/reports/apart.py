"""Writing a run's reports in a child Python process, so that they never pause the parent.

Reading a long ``events.jsonl`` and drawing the figure allocate many Python objects: in the
training process that triggers full garbage collections over its large heap (torch, the
model, the application), which hold the GIL for a few hundred milliseconds and so stall the
application's event loop even though the reports are written from a worker thread. A child
process has its own heap and GIL. It loads ``core.reports`` alone (it needs neither torch
nor the rest of ``core``), so it starts in about half a second.

Example::

    files = write_reports_apart(run_dir)  # [.../performance_summary.txt, .../training_metrics.png]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import structlog

from core.reports import REPORT_FILES, write_reports

__all__ = ("write_reports_apart",)

_log = structlog.get_logger("core")

# Loads the core.reports package from its directory without running core/__init__.py.
_CHILD = """
import sys, types
from pathlib import Path
package = types.ModuleType("core")
package.__path__ = [sys.argv[1]]
sys.modules["core"] = package
from core.reports import write_reports
write_reports(Path(sys.argv[2]))
"""


def write_reports_apart(run_dir: Path, *, timeout_s: float = 600.0) -> list[Path]:
    """:func:`~core.reports.write_reports` for ``run_dir`` in a child process; the files it
    wrote. Where no child process can be started (no ``sys.executable``), the reports are
    written here instead. Raises ``RuntimeError`` with the child's last words when it
    fails, ``subprocess.TimeoutExpired`` after ``timeout_s``."""
    run_dir = Path(run_dir)
    package = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-c", _CHILD, str(package), str(run_dir)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except OSError as exc:  # an embedded interpreter without a usable executable
        _log.info("reports_in_process", reason=f"{type(exc).__name__}: {exc}")
        return write_reports(run_dir)
    if done.returncode != 0:
        raise RuntimeError(
            f"the report writer exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    if "plots_unavailable" in done.stdout + done.stderr:
        _log.warning("plots_unavailable", fix="pip install 'core[plots]'")
    return [run_dir / name for name in REPORT_FILES if (run_dir / name).exists()]
