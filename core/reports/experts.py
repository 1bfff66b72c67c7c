"""The mixture-of-experts content of a run's records (routing per step from ``train_step``'s
``moe_*`` fields, placement from ``run_start``), read into plain objects for the Experts
section and the expert figures; odd content is skipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from core.reports.read import Records, first, mapping, number, of, text

__all__ = (
    "ExpertHolder",
    "ExpertPlacement",
    "ExpertSteps",
    "expert_placement",
    "expert_steps",
    "index_ranges",
)

_MAX_RANKS = 4096  # a world size past this is odd content, not a run
_MAX_PER_RANK = 1 << 16


@dataclass(frozen=True)
class ExpertSteps:
    """Routing statistics per optimizer step, in record order.

    ``counts[layer][i]`` holds the layer's kept assignments per expert at ``steps[i]``
    (empty where that record lacks the layer); ``dropped[i]`` the assignments dropped for
    capacity over all layers; ``aux_loss[i]`` the layers' mean balance loss (1.0: even).
    """

    steps: list[float]
    counts: dict[str, list[list[float]]]
    aux_loss: list[float | None]
    dropped: list[float | None]

    @property
    def layers(self) -> list[str]:
        """The MoE layers' names, in the order the records first name them."""
        return list(self.counts)

    def experts(self, layer: str) -> int:
        """The layer's number of experts (the longest row: experts may be added)."""
        return max((len(row) for row in self.counts[layer]), default=0)

    def totals(self, layer: str, last: int | None = None) -> list[float]:
        """The layer's kept assignments per expert, summed over the last ``last`` steps
        (all steps for None)."""
        rows = self.counts[layer] if last is None else self.counts[layer][-last:]
        summed = [0.0] * self.experts(layer)
        for row in rows:
            for index, value in enumerate(row):
                summed[index] += value
        return summed

    def kept(self, index: int) -> float:
        """Kept assignments of every layer at ``steps[index]``."""
        return sum(sum(rows[index]) for rows in self.counts.values())


def expert_steps(records: Records) -> ExpertSteps | None:
    """The ``moe_*`` fields of the ``train_step`` records; None when no record has any."""
    steps: list[float] = []
    rows: list[dict[str, list[float]]] = []
    aux: list[float | None] = []
    dropped: list[float | None] = []
    for record in of(records, "train_step"):
        tokens, step = record.get("moe_tokens_per_expert"), number(record.get("step"))
        if step is None or not isinstance(tokens, Mapping):
            continue
        row = {str(name): _counts(values) for name, values in tokens.items()}
        rows.append({name: values for name, values in row.items() if values is not None})
        steps.append(step)
        aux.append(number(record.get("moe_aux_loss")))
        lost = number(record.get("moe_dropped_tokens"))
        dropped.append(max(lost, 0.0) if lost is not None else None)
    layers = list(dict.fromkeys(name for row in rows for name in row))
    if not layers:
        return None
    counts = {name: [row.get(name, []) for row in rows] for name in layers}
    return ExpertSteps(steps, counts, aux, dropped)


def _counts(values: object) -> list[float] | None:
    """A layer's counts: the usual list of non-negative ints as it is, anything else as
    non-negative finite floats."""
    if isinstance(values, list) and set(map(type, values)) == {int} and min(values) >= 0:
        return values  # checked at C speed: a long run's records hold millions
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        return None
    return [max(number(v) or 0.0, 0.0) for v in values]


@dataclass(frozen=True)
class ExpertHolder:
    """A device (one process) or a rank (torchrun) and the experts it holds."""

    label: str
    """``cuda:0`` or ``rank 0``."""
    experts: dict[str, list[str]]
    """Layer name -> the indices of its experts held here."""
    cost: float | None = None
    """The placement plan's summed cost (parameters x expected token share); None for ranks."""
    name: str = ""
    """The device's name (one process); empty for a rank."""
    sm_count: float | None = None

    @property
    def detail(self) -> str:
        """The device's name and SM count, e.g. ``NVIDIA H100, 132 SMs``; empty for a rank."""
        sms = f"{self.sm_count:,.0f} SMs" if self.sm_count is not None else ""
        return ", ".join(part for part in (self.name, sms) if part)

    @property
    def count(self) -> int:
        """How many experts (of every layer) are held here."""
        return sum(len(indices) for indices in self.experts.values())


@dataclass(frozen=True)
class ExpertPlacement:
    """Where the experts lived: a one-process plan or the ranks of a torchrun job."""

    kind: Literal["planned", "ranks"]
    holders: list[ExpertHolder]
    note: str
    """One process: where the experts ran; torchrun: the token exchange and why."""
    exchange: str | None = None


def expert_placement(records: Records) -> ExpertPlacement | None:
    """The expert strategy's placement from ``run_start``; None when none ran."""
    strategy = mapping(first(records, "run_start") or {}, "resolved", "strategy")
    if mapping(strategy, "expert_placement"):
        return _planned(strategy)
    if mapping(strategy, "expert_parallel"):
        return _ranks(strategy)
    return None


def _planned(strategy: Mapping[str, object]) -> ExpertPlacement | None:
    devices = mapping(strategy, "expert_placement").get("devices")
    if not isinstance(devices, Sequence) or isinstance(devices, (str, bytes)):
        return None
    holders = []
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        names = device.get("experts")
        held: dict[str, list[str]] = {}
        for name in names if isinstance(names, Sequence) and not isinstance(names, str) else ():
            layer, _, index = str(name).rpartition(".")
            held.setdefault(layer, []).append(index)
        holders.append(
            ExpertHolder(
                text(device.get("device")),
                held,
                number(device.get("cost")),
                text(device.get("name"), ""),
                number(device.get("sm_count")),
            )
        )
    if not holders:
        return None
    if strategy.get("experts_moved") is True:
        note = f"experts moved to the {len(holders)} planned devices"
    else:
        note = f"planned: experts run on {text(strategy.get('device'))}"
    return ExpertPlacement("planned", holders, note)


def _ranks(strategy: Mapping[str, object]) -> ExpertPlacement | None:
    parallel = mapping(strategy, "expert_parallel")
    layers = mapping(parallel, "layers")
    per_rank: dict[str, int] = {}
    experts: dict[str, int] = {}
    for name, layer in layers.items():
        k, total = (
            number(mapping(layer).get("experts_per_rank")),
            number(mapping(layer).get("experts")),
        )
        if k is not None and 1 <= k <= _MAX_PER_RANK and k == int(k):
            per_rank[str(name)] = int(k)
            if total is not None and total >= k:
                experts[str(name)] = int(total)
    world = number(strategy.get("world_size"))
    if world is None and per_rank:  # every expert is held once: experts / per rank
        world = max((experts.get(n, 0) // k for n, k in per_rank.items()), default=None) or None
    if not per_rank or world is None or not 1 <= world <= _MAX_RANKS or world != int(world):
        return None
    holders = [
        ExpertHolder(
            f"rank {rank}",
            {name: [str(i) for i in range(rank * k, rank * k + k)] for name, k in per_rank.items()},
        )
        for rank in range(int(world))
    ]
    exchange = text(parallel.get("token_exchange"))
    why = text(parallel.get("note"), "")
    note = f"token exchange {exchange}" + (f" ({why})" if why else "")
    return ExpertPlacement("ranks", holders, note, exchange)


def index_ranges(indices: Sequence[str]) -> str:
    """Expert indices as short text: runs of consecutive integers become ``a-b``."""
    parts: list[str] = []
    run: list[int] = []
    for index in [*indices, None]:
        value = int(index) if index is not None and index.isdigit() else None
        if value is not None and run and value == run[-1] + 1:
            run.append(value)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        if value is not None:
            run = [value]
        elif index is not None:
            parts.append(index)
    return ", ".join(parts)
