"""The performance summary's Experts section: routing balance over the last steps, dropped
assignments, the balance loss and where the experts were placed. Present only for runs
with MoE records or an expert strategy (:func:`had_experts`)."""

from __future__ import annotations

from collections.abc import Mapping

from core.reports import fmt
from core.reports.experts import (
    ExpertPlacement,
    ExpertSteps,
    expert_placement,
    expert_steps,
    index_ranges,
)
from core.reports.read import Records, first, mapping, number, of
from core.reports.sections import kv

__all__ = ("LAST_STEPS", "experts_section", "had_experts")

LAST_STEPS = 50
"""The share per expert and the mean balance loss are taken over this many last steps."""

_KEY_ROOM = 23  # a longer key (a layer's qualified name) gets a line of its own
_PER_LINE = 8  # shares per line
_MAX_ROWS = 20  # as the other sections' lists
_MAX_INDEX_TEXT = 64


def had_experts(records: Records) -> bool:
    """Whether the run had MoE routing records or placed experts."""
    tokens = (r.get("moe_tokens_per_expert") for r in of(records, "train_step"))
    return any(isinstance(t, Mapping) for t in tokens) or expert_placement(records) is not None


def experts_section(records: Records) -> list[str]:
    """The Experts section's lines (shares are of each layer's kept assignments)."""
    routing = expert_steps(records)
    lines = (
        _routing(routing)
        if routing is not None
        else [kv("routing", "not recorded (no train_step record with MoE counts)")]
    )
    world = _world_size(records)
    if routing is not None and world is not None and world > 1:
        lines.append(kv("counted on", "rank 0's tokens (each rank routes its own batch)"))
    placement = expert_placement(records)
    return lines + (_placement(placement) if placement is not None else [])


def _routing(routing: ExpertSteps) -> list[str]:
    layers = routing.layers
    sizes = sorted({routing.experts(layer) for layer in layers})
    each = (
        f"{sizes[0]} experts each"
        if len(sizes) == 1
        else f"{fmt.count(sizes[0])} to {fmt.count(sizes[-1])} experts"
    )
    n = len(routing.steps)
    last = min(n, LAST_STEPS)
    balanced = (
        f"balanced {fmt.percent(1.0 / sizes[0])}"
        if len(sizes) == 1 and sizes[0]
        else ("balanced 1 / experts")
    )
    lines = [
        kv("MoE layers", f"{len(layers)} ({each}), {_steps(n)} with routing statistics"),
        kv("share per expert", f"of kept assignments, last {_steps(last)} ({balanced})"),
    ]
    shares: list[list[str]] = []
    for layer in layers:
        totals = routing.totals(layer, last)
        whole = sum(totals)
        cells = [fmt.percent(t / whole if whole > 0 else None) for t in totals]
        shares.append(_named(layer, _chunks(cells)))
    lines += _clip_groups(shares, "layers")
    dropped = sum(d for d in routing.dropped if d is not None)
    known = [i for i, d in enumerate(routing.dropped) if d is not None]
    total = dropped + sum(routing.kept(i) for i in known)
    if known:
        lines.append(
            kv(
                "dropped assignments",
                f"{fmt.count(dropped)} of {fmt.count(total)} "
                f"({fmt.percent(dropped / total if total > 0 else None)}), "
                f"all layers, {_steps(len(known))}",
            )
        )
    else:
        lines.append(kv("dropped assignments", "not recorded"))
    aux = [a for a in routing.aux_loss[-last:] if a is not None]
    mean = sum(aux) / len(aux) if aux else None
    lines.append(
        kv("mean aux loss", f"{fmt.value(mean)} over the last {_steps(last)} (1.0 = balanced)")
    )
    return lines


def _steps(n: int) -> str:
    return f"{fmt.count(n)} step" + ("" if n == 1 else "s")


def _chunks(cells: list[str]) -> list[str]:
    if len(cells) <= _PER_LINE:
        return ["  ".join(cells)]
    return [
        f"{i}-{min(i + _PER_LINE, len(cells)) - 1}: " + "  ".join(cells[i : i + _PER_LINE])
        for i in range(0, len(cells), _PER_LINE)
    ]


def _named(key: str, values: list[str]) -> list[str]:
    """``key`` before the first value, or on a line of its own when too long to align."""
    if len(key) > _KEY_ROOM:
        return [kv(key, ""), *(kv("", v) for v in values)]
    return [kv(key if i == 0 else "", v) for i, v in enumerate(values)]


def _placement(placement: ExpertPlacement) -> list[str]:
    if placement.kind == "planned":
        n = len(placement.holders)
        head = f"planned over {n} device{'' if n == 1 else 's'}; {placement.note}"
    else:
        head = f"{len(placement.holders)} ranks, {placement.note}"
    lines = [kv("placement", head)]
    layers = {layer for holder in placement.holders for layer in holder.experts}
    rows: list[list[str]] = []
    for holder in placement.holders:
        about = f"{holder.count} experts"
        if holder.cost is not None:
            about += f", cost {fmt.count(holder.cost)}"
        if holder.detail:
            about += f" ({holder.detail})"
        rows.append(_named(holder.label, [about, *_held(holder.experts, len(layers))]))
    noun = "ranks" if placement.kind == "ranks" else "devices"
    return lines + _clip_groups(rows, noun)


def _held(experts: dict[str, list[str]], layers: int) -> list[str]:
    """One line per set of expert indices: ``0-3 of every layer``, ``blocks.1.moe: 4, 6``."""
    groups: dict[str, list[str]] = {}
    for layer, indices in experts.items():
        groups.setdefault(_indices(indices), []).append(layer)
    lines = []
    for held, names in groups.items():
        if len(names) == layers > 1:
            lines.append(f"{held} of every layer")
        elif len(names) == 1:
            lines.append(f"{names[0]}: {held}")
        else:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            lines.append(f"{held} of {len(names)} layers: {shown}")
    return lines


def _indices(indices: list[str]) -> str:
    """:func:`index_ranges`, cut to about a line."""
    ranges = index_ranges(indices)
    if len(ranges) <= _MAX_INDEX_TEXT:
        return ranges
    return ranges[: ranges.rfind(", ", 0, _MAX_INDEX_TEXT - 5)] + f", ... ({len(indices)})"


def _clip_groups(groups: list[list[str]], noun: str) -> list[str]:
    """The groups' lines; past :func:`clip`'s limit, whole groups from the start and the end
    around a "... N more" line (a group is never cut in two)."""
    if sum(len(group) for group in groups) <= _MAX_ROWS:
        return [line for group in groups for line in group]
    head = _take(groups, _MAX_ROWS // 2)
    tail = _take(groups[head:][::-1], _MAX_ROWS // 2)
    more = kv("...", f"{len(groups) - head - tail} more {noun}")
    kept = [*groups[:head], [more], *groups[len(groups) - tail :]]
    return [line for group in kept for line in group]


def _take(groups: list[list[str]], budget: int) -> int:
    """How many leading groups fit ``budget`` lines (at least one)."""
    taken, used = 0, 0
    for group in groups:
        if taken and used + len(group) > budget:
            break
        taken, used = taken + 1, used + len(group)
    return taken


def _world_size(records: Records) -> float | None:
    strategy = mapping(first(records, "run_start") or {}, "resolved", "strategy")
    return number(strategy.get("world_size"))
