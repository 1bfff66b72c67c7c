"""The performance summary: a plain-text report of a run, built from its records alone. Run,
Throughput, Step time, Input pipeline and Bottleneck verdicts are here, the other sections in
``sections`` and ``expert_summary``; a section without data says so."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from core.reports import fmt
from core.reports.expert_summary import experts_section, had_experts
from core.reports.read import (
    Record,
    Records,
    first,
    last,
    mapping,
    number,
    numbers,
    of,
    run_id,
    text,
    timestamp,
)
from core.reports.sections import (
    amp_section,
    clip,
    compile_section,
    errors_section,
    kv,
    memory_section,
    profile_section,
    validation_section,
)

__all__ = ("format_performance_summary",)

Section = Callable[[Records], list[str]]


def format_performance_summary(records: Records) -> str:
    """The summary of a run's records as text (ends with a newline)."""
    start = first(records, "run_start") or {}
    experiment = text(mapping(start, "config", "run").get("experiment_name"))
    title = f"Performance summary: {experiment} / {run_id(records)}"
    out = [title, "(built from the run's events.jsonl)"]
    sections: tuple[tuple[str, Section], ...] = (
        ("Run", _run),
        ("Throughput", _throughput),
        ("Step time", _step_time),
        ("Input pipeline", _input_pipeline),
        ("Bottleneck verdicts", _bottleneck),
        ("AMP", amp_section),
        ("Compile", compile_section),
        ("Memory peaks", memory_section),
        ("Validation", validation_section),
        ("Errors and warnings", errors_section),
        ("Profile", profile_section),
    )
    if had_experts(records):
        sections += (("Experts", experts_section),)
    for title, section in sections:
        out += ["", f"== {title} ==", *_guarded(section, records)]
    return "\n".join(out) + "\n"


def _guarded(section: Section, records: Records) -> list[str]:
    """The section's lines; a note instead when odd record content breaks it, so one
    section cannot cost the others."""
    try:
        return section(records)
    except Exception as exc:
        return [
            kv("not available", f"the records broke this section ({type(exc).__name__}: {exc})")
        ]


def _run(records: Records) -> list[str]:
    start = first(records, "run_start") or {}
    end = last(records, "run_end")
    strategy = mapping(start, "resolved", "strategy")
    plan = mapping(start, "plan")
    lines = [kv("started", text(start.get("ts")))]
    if end is None:
        lines.append(kv("status", "unfinished: no run_end record (crashed or still running)"))
    else:
        lines.append(kv("status", text(end.get("status"))))
        if end.get("error_type") or end.get("error"):
            lines.append(kv("error", f"{text(end.get('error_type'))}: {text(end.get('error'))}"))
    world = strategy.get("world_size", plan.get("world_size"))
    lines += [
        kv("device", text(start.get("device"))),
        kv("precision", text(start.get("precision"))),
        kv("strategy", f"{text(strategy.get('training_mode'))}, world size {text(world)}"),
    ]
    parameters = mapping(start, "model_summary").get("parameters")
    parameters = (
        parameters if parameters is not None else mapping(start, "resolved").get("parameters")
    )
    model = mapping(start, "resolved").get("model")
    if model is not None or parameters is not None:
        lines.append(kv("model", f"{text(model)}, {fmt.count(number(parameters))} parameters"))
    if "seed" in start:
        lines.append(kv("seed", text(start.get("seed"), "none")))
    if (resumed := first(records, "resumed")) is not None:
        lines.append(
            kv("resumed from", f"{text(resumed.get('path'))} (step {resumed.get('step')})")
        )
    ends = of(records, "epoch_end")
    done = number(end.get("epochs_completed")) if end else None
    max_epochs = plan.get("max_epochs", mapping(start, "config", "run").get("max_epochs"))
    epochs = fmt.count(done if done is not None else len(ends))
    lines.append(kv("epochs completed", f"{epochs} of {text(max_epochs)}"))
    steps = number(end.get("global_step")) if end else None
    if steps is None:
        steps = max(numbers(records, "train_step", "step"), default=None)
    lines.append(kv("optimizer steps", fmt.count(steps)))
    lines.append(kv("wall time", _wall_time(records, end)))
    return lines


def _wall_time(records: Records, end: Record | None) -> str:
    elapsed = number(end.get("elapsed_s")) if end is not None else None
    if elapsed is not None:
        return fmt.seconds(elapsed)
    times = [t for t in (timestamp(r) for r in records) if t is not None]
    if len(times) < 2:
        return fmt.seconds(None)
    return f"{fmt.seconds(max(times) - min(times))} (first to last record)"


def _throughput(records: Records) -> list[str]:
    ends = of(records, "epoch_end")
    samples = sum(number(e.get("samples")) or 0.0 for e in ends)
    seconds = sum(number(e.get("epoch_time_s")) or 0.0 for e in ends)
    world = number(
        mapping(first(records, "run_start") or {}, "resolved", "strategy").get("world_size")
    )
    scope = " on rank 0" if world is not None and world > 1 else ""
    if seconds > 0:
        lines = [
            kv("overall", fmt.rate(samples / seconds)),
            kv(
                "",
                f"{fmt.count(samples)} samples{scope} / {fmt.seconds(seconds)} of training "
                f"in {len(ends)} epochs (validation excluded)",
            ),
        ]
    else:
        step_samples = sum(numbers(records, "train_step", "samples"))
        step_seconds = sum(numbers(records, "train_step", "step_time_s"))
        overall = step_samples / step_seconds if step_seconds > 0 else None
        lines = [kv("overall", fmt.rate(overall, none="no training time recorded"))]
        if overall is not None:
            lines.append(kv("", "from train_step records (no epoch completed)"))
    end = last(records, "run_end")
    if end is not None and number(end.get("samples_per_s")) is not None:
        lines.append(kv("reported at run end", fmt.rate(number(end.get("samples_per_s")))))
    per_epoch = []
    for e in ends:
        epoch_s = number(e.get("epoch_time_s"))
        epoch_rate = number(e.get("samples_per_s"))
        if epoch_rate is None and epoch_s:
            epoch_rate = (number(e.get("samples")) or 0.0) / epoch_s
        per_epoch.append(
            kv(
                f"epoch {text(e.get('epoch'))}",
                f"{fmt.rate(epoch_rate)}  "
                f"({fmt.count(number(e.get('samples')))} samples in {fmt.seconds(epoch_s)})",
            )
        )
    return lines + clip(per_epoch)


def _step_time(records: Records) -> list[str]:
    times = numbers(records, "train_step", "step_time_s")
    if not times:
        return [kv("steps timed", "none (no train_step records)")]
    lines = [
        kv("steps timed", fmt.count(len(times))),
        kv("first step", f"{fmt.seconds(times[0])} (includes compilation and warm-up)"),
    ]
    rest = times[1:]
    if rest:
        lines.append(kv("later steps", f"{fmt.count(len(rest))} steps:"))
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            lines.append(kv(f"  {name}", fmt.seconds(fmt.percentile(rest, q))))
        lines.append(kv("  max", fmt.seconds(max(rest))))
    return lines


def _input_pipeline(records: Records) -> list[str]:
    data = sum(numbers(records, "train_step", "data_time_s"))
    step = sum(numbers(records, "train_step", "step_time_s"))
    if step > 0:
        lines = [
            kv("input stall", f"{fmt.percent(data / step)} of step time spent waiting for data"),
            kv("", f"({fmt.seconds(data)} of {fmt.seconds(step)}, over train_step records)"),
        ]
    else:
        lines = [kv("input stall", "not measured (no train_step records)")]
    per_epoch = [
        kv(f"epoch {text(e.get('epoch'))}", fmt.percent(number(e.get("input_stall_fraction"))))
        for e in of(records, "epoch_end")
    ]
    stalls = of(records, "data_stall")
    if stalls:
        waited = max((number(s.get("waited_s")) or 0.0) for s in stalls)
        lines.append(
            kv("data_stall warnings", f"{len(stalls)} (longest wait {fmt.seconds(waited)})")
        )
    return lines + clip(per_epoch)


def _bottleneck(records: Records) -> list[str]:
    ends = of(records, "epoch_end")
    verdicts = [
        kv(
            f"epoch {text(e.get('epoch'))}",
            f"{text(e.get('bottleneck'))} (mean utilisation "
            f"{fmt.percent(_fraction(e.get('util_mean_pct')), 'not sampled')})",
        )
        for e in ends
    ]
    if not verdicts:
        return [kv("verdicts", "none (no epoch completed)")]
    advice = next((text(e.get("bottleneck_advice"), "") for e in reversed(ends)), "")
    lines = clip(verdicts)
    if advice:
        wrapped = textwrap.wrap(advice, width=72)
        lines += [kv("latest advice", wrapped[0]), *(kv("", w) for w in wrapped[1:])]
    return lines


def _fraction(percent: object) -> float | None:
    value = number(percent)
    return value / 100.0 if value is not None else None
