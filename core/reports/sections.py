"""The performance summary's later sections: AMP, Compile, Memory peaks, Validation, Errors
and warnings, Profile. Each takes the run's records and returns the section's lines."""

from __future__ import annotations

import math
from collections import Counter

from core.reports import fmt
from core.reports.read import Record, Records, first, last, number, numbers, of, text

__all__ = (
    "amp_section",
    "clip",
    "compile_section",
    "errors_section",
    "kv",
    "memory_section",
    "profile_section",
    "validation_section",
)

_KEY_WIDTH = 24
_MAX_ROWS = 20


def kv(key: str, value: str) -> str:
    """One aligned ``key  value`` line of a section."""
    return f"  {key:<{_KEY_WIDTH}}{value}".rstrip()


def clip(lines: list[str], limit: int = _MAX_ROWS) -> list[str]:
    """``lines``, or their first and last halves of ``limit`` around a "... N more" line
    (a run of 500 epochs keeps a readable report)."""
    if len(lines) <= limit:
        return lines
    half = limit // 2
    return [*lines[:half], kv("...", f"{len(lines) - 2 * half} more"), *lines[-half:]]


def _scale(value: float) -> str:
    """A loss scale: ``65,536 (2^16)`` for the usual powers of two."""
    mantissa, exponent = math.frexp(value)
    if mantissa == 0.5:
        return f"{value:,.0f} (2^{exponent - 1})"
    return f"{value:,.6g}"


def amp_section(records: Records) -> list[str]:
    """Precision, the fp16 loss scale, overflows, skipped steps and precision fallbacks."""
    start = first(records, "run_start") or {}
    steps = of(records, "train_step")
    scales = numbers(records, "train_step", "loss_scale")
    lines = [kv("precision", text(start.get("precision")))]
    if scales:
        lines += [
            kv("loss scale min", _scale(min(scales))),
            kv("loss scale max", _scale(max(scales))),
            kv("loss scale final", _scale(scales[-1])),
        ]
    else:
        lines.append(kv("loss scale", "no loss scaler"))
    overflow = [s for s in steps if s.get("overflow") is True]
    skipped = sum(1 for s in steps if s.get("skipped") is True)
    where = ", ".join(text(s.get("step")) for s in overflow[:10])
    more = f", ... ({len(overflow) - 10} more)" if len(overflow) > 10 else ""
    lines.append(
        kv("overflow steps", f"{len(overflow)}" + (f" (steps {where}{more})" if where else ""))
    )
    lines.append(kv("skipped steps", f"{skipped} of {len(steps)}"))
    nonfinite = of(records, "nonfinite_skipped")
    if nonfinite:
        lines.append(kv("NaN/inf steps skipped", str(len(nonfinite))))
    for fallback in of(records, "precision_fallback"):
        lines.append(
            kv(
                "precision fallback",
                f"step {text(fallback.get('step'))}: {text(fallback.get('from_precision'))} -> "
                f"{text(fallback.get('to_precision'))} ({text(fallback.get('reason'))})",
            )
        )
    return lines


def compile_section(records: Records) -> list[str]:
    """Each compiled target (mode, seconds, graph breaks) and compile failures."""
    lines = [
        kv(
            text(c.get("target")),
            f"mode {text(c.get('mode'))}, "
            f"{fmt.seconds(number(c.get('seconds')))} to compile, "
            f"{text(c.get('graph_breaks'))} graph breaks, fullgraph {text(c.get('fullgraph'))}",
        )
        for c in of(records, "compile")
    ]
    failures = [e for e in of(records, "error") if e.get("kind") == "compile_failed"]
    lines += [
        kv("compile failed", f"{text(e.get('reason'))}; {text(e.get('effect'), '')}".rstrip("; "))
        for e in failures
    ]
    return lines or [kv("torch.compile", "not compiled")]


def memory_section(records: Records) -> list[str]:
    """Peak memory from train_step and gpu_sample records, as GiB."""
    start = first(records, "run_start") or {}
    on_cpu = text(start.get("device"), "").startswith("cpu")
    absent = "not measured on CPU" if on_cpu else "not measured"
    step_peak = max(numbers(records, "train_step", "max_mem_allocated_bytes"), default=None)
    torch_peak = max(numbers(records, "gpu_sample", "torch_max_mem_allocated_bytes"), default=None)
    lines = [
        kv(
            "torch allocator peak",
            fmt.gib(step_peak, absent) + " (train_step)" if step_peak is not None else absent,
        ),
        kv("", f"{fmt.gib(torch_peak)} (gpu_sample)") if torch_peak is not None else "",
    ]
    samples = of(records, "gpu_sample")
    for device in sorted({text(s.get("device")) for s in samples}):
        mine = [s for s in samples if text(s.get("device")) == device]
        used = max(numbers(mine, "gpu_sample", "mem_used_bytes"), default=None)
        host = any(s.get("source") == "psutil" for s in mine)
        label = "process RSS (host)" if host else f"device {device} memory used"
        total = max(numbers(mine, "gpu_sample", "mem_total_bytes"), default=None)
        of_total = f" of {fmt.gib(total)}" if total is not None else ""
        lines.append(kv(label, f"{fmt.gib(used, 'not measured')}{of_total}"))
    if not samples:
        lines.append(kv("device memory used", "no gpu_sample records (monitor off)"))
    return [line for line in lines if line]


def validation_section(records: Records) -> list[str]:
    """The best validation loss and its epoch, the last metrics, the monitored best."""
    runs = of(records, "validation")
    if not runs:
        return [kv("validation", "none (no validation records)")]
    lines = [kv("validations", str(len(runs)))]
    scored = [(loss, r) for r in runs if (loss := number(r.get("val_loss"))) is not None]
    if scored:
        best_loss, best = min(scored, key=lambda pair: pair[0])
        lines.append(
            kv(
                "best val loss",
                f"{fmt.value(best_loss)} (epoch {text(best.get('epoch'))}"
                f", counted from 0; step {text(best.get('step'))})",
            )
        )
    latest = runs[-1]
    lines.append(kv("last val loss", fmt.value(number(latest.get("val_loss")))))
    if latest.get("val_accuracy") is not None:
        lines.append(kv("last val accuracy", fmt.percent(number(latest.get("val_accuracy")))))
    metrics = latest.get("metrics")
    if isinstance(metrics, dict):
        for name, metric in sorted(metrics.items(), key=lambda item: str(item[0])):
            lines.append(kv(f"last {name}", fmt.value(number(metric))))
    end = last(records, "run_end")
    if end is not None and end.get("monitor"):
        lines.append(
            kv(
                f"best {text(end.get('monitor'))}",
                f"{fmt.value(number(end.get('best_value')))} "
                f"(checkpoint {text(end.get('best_checkpoint'), 'none')})",
            )
        )
    return lines


def errors_section(records: Records) -> list[str]:
    """Counts of warning and error records, by event (and kind for ``error`` records)."""
    counts: Counter[str] = Counter()
    for r in records:
        if r.get("level") in ("warning", "error") and r.get("event") != "run_end":
            kind = r.get("kind")
            counts[text(r.get("event")) + (f" ({kind})" if kind else "")] += 1
    lines = [kv(name, str(n)) for name, n in sorted(counts.items())]
    end = last(records, "run_end")
    if end is not None and end.get("level") == "error":
        lines.append(kv("run_end", f"{text(end.get('status'))}: {_failure(end)}"))
    return lines or [kv("none", "no warning or error records")]


def _failure(end: Record) -> str:
    return f"{text(end.get('error_type'))}: {text(end.get('error'))}"


def profile_section(records: Records) -> list[str]:
    """The profiler's trace path and its operator table, when the run was profiled."""
    profile = last(records, "profile")
    if profile is None:
        return [kv("profile", "not profiled")]
    lines = [
        kv("steps", f"{text(profile.get('first_step'))} to {text(profile.get('last_step'))}"),
        kv("Chrome trace", text(profile.get("trace"))),
        kv("table file", text(profile.get("table_file"))),
    ]
    table = profile.get("table")
    if isinstance(table, str) and table.strip():
        lines += ["", *(f"  {row}".rstrip() for row in table.splitlines())]
    return lines
