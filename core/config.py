"""The config tree: one frozen, validated section per component under one root.

Settings that change what is computed live here; runtime objects (model, loaders, loss,
optimizer, scheduler, callbacks) are arguments of the orchestrator, outside the tree::

    config = TrainingConfig(
        run=RunConfig(experiment_name="email_sequence", max_epochs=3, seed=0),
        precision=MixedPrecisionConfig(dtype="bf16"),
        transforms=ModelTransformsConfig(activation_checkpointing=True),
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=500, resume="auto"),
    )
    config.replace({"precision.scaler.hysteresis": 2})   # a new tree; errors name the path

``to_dict()`` is what ``config.json`` holds; ``from_dict()`` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from core.checkpointing.checkpointer import CheckpointConfig
from core.checkpointing.config import METRIC_NAME
from core.checks import check_bool_fields, check_max_grad_norm, is_finite_number, is_int
from core.data.config import LoaderConfig
from core.distributed.config import MultiGPUConfig
from core.errors import ConfigError, config_error
from core.hardware.settings import GPUManagerConfig
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.recovery import ErrorHandlerConfig
from core.memory.config import MemoryConfig
from core.monitoring.config import GPUMonitorConfig
from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.ray_config import RayConfig
from core.run_config import RunConfig
from core.telemetry.config import LoggingConfig
from core.transforms.config import ModelTransformsConfig

__all__ = (
    "DataConfig",
    "EarlyStoppingConfig",
    "OptimConfig",
    "RayConfig",
    "RunConfig",
    "TrainingConfig",
)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The default optimizer's settings (AdamW, fused where supported) and clipping.

    ``learning_rate`` and ``weight_decay`` build the default optimizer only; an optimizer
    given to the run keeps its own. ``max_grad_norm`` clips the global gradient norm of any
    optimizer (None: no clipping)."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        if not (is_finite_number(self.learning_rate) and self.learning_rate > 0):
            raise config_error(
                "learning_rate", self.learning_rate, "a finite float > 0", "try learning_rate=1e-3."
            )
        if not (is_finite_number(self.weight_decay) and self.weight_decay >= 0):
            raise config_error("weight_decay", self.weight_decay, "a finite float >= 0")
        check_max_grad_norm(self.max_grad_norm)


@dataclass(frozen=True, kw_only=True)
class EarlyStoppingConfig:
    """When the run stops before ``max_epochs``, judged at every validation (without a
    ``val_loader``: at every epoch end, on the training loss), as Lightning's
    ``EarlyStopping`` judges:

    - ``patience``: stop after ``patience`` validations in a row whose ``monitor`` did not
      improve by more than ``min_delta`` (lower with ``mode="min"``, higher with ``"max"``);
      None: no patience rule;
    - ``check_finite`` (on): stop at once when the monitored value is NaN or inf;
    - ``stopping_threshold``: stop at once when the value is at least this good;
    - ``divergence_threshold``: stop at once when the value is worse than this;
    - ``min_epochs`` / ``min_steps``: no rule stops the run before this many epochs /
      optimizer steps (a rule that fired earlier stops it at the first validation after).

    Early stopping is on when ``patience`` or a threshold is set (``check_finite`` alone
    stops nothing). ``monitor=None`` watches what the checkpoint section's ``monitor`` names,
    with its ``mode`` (by default the validation loss, or the mean training loss without a
    ``val_loader``): one setting for the best checkpoint and for stopping. Why the run
    stopped is ``run_end``'s ``stop_reason`` (and ``TrainingResults.stop_reason``)."""

    patience: int | None = None
    min_delta: float = 0.0
    monitor: str | None = None
    mode: Literal["min", "max"] | None = None
    check_finite: bool = True
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    min_epochs: int | None = None
    min_steps: int | None = None

    def __post_init__(self) -> None:
        if self.monitor is not None and not (
            isinstance(self.monitor, str) and METRIC_NAME.match(self.monitor)
        ):
            raise config_error(
                "early_stopping.monitor",
                self.monitor,
                "None (the checkpoint section's monitor), 'val_loss', 'train_loss', "
                "'val_accuracy' or 'val_<name>' of a metric",
                "e.g. monitor='val_f1'.",
            )
        if self.mode not in (None, "min", "max"):
            raise config_error(
                "early_stopping.mode", self.mode, "None (the checkpoint's mode), 'min' or 'max'"
            )
        if self.patience is not None and not (is_int(self.patience) and self.patience >= 1):
            raise config_error(
                "patience",
                self.patience,
                "None (off) or an integer >= 1",
                "pass None to train for max_epochs.",
            )
        if not (is_finite_number(self.min_delta) and self.min_delta >= 0):
            raise config_error("min_delta", self.min_delta, "a finite float >= 0")
        check_bool_fields(self)
        for name in ("stopping_threshold", "divergence_threshold"):
            value = getattr(self, name)
            if value is not None and not is_finite_number(value):
                raise config_error(name, value, "None (off) or a finite number")
        for name in ("min_epochs", "min_steps"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 0):
                raise config_error(name, value, "None or an integer >= 0")

    @property
    def enabled(self) -> bool:
        """Whether any rule may stop the run: a ``patience`` or a threshold is set."""
        return self.patience is not None or not (
            self.stopping_threshold is None and self.divergence_threshold is None
        )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """How loaders are fed. ``use_distributed_sampler``: under DDP/FSDP2 a plain DataLoader
    is rebuilt with a DistributedSampler (off: each rank's loader is used as given).
    ``loader``: how :func:`~core.data.create_dataloader` builds loaders; of it, a run uses
    ``device_prefetch`` (its loaders are the user's own)."""

    use_distributed_sampler: bool = True
    loader: LoaderConfig = field(default_factory=LoaderConfig)

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if not isinstance(self.loader, LoaderConfig):
            raise config_error("loader", self.loader, "a LoaderConfig")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The root: one section per component. Every section has working defaults."""

    run: RunConfig = field(default_factory=RunConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    accumulation: GradientAccumulationConfig = field(default_factory=GradientAccumulationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    distributed: MultiGPUConfig = field(default_factory=MultiGPUConfig)
    hardware: GPUManagerConfig = field(default_factory=GPUManagerConfig)
    transforms: ModelTransformsConfig = field(default_factory=ModelTransformsConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    errors: ErrorHandlerConfig = field(default_factory=ErrorHandlerConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    monitor: GPUMonitorConfig = field(default_factory=GPUMonitorConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        for section in fields(self):
            value = getattr(self, section.name)
            kind = _SECTIONS[section.name]
            if not isinstance(value, kind):
                raise config_error(
                    section.name,
                    value,
                    f"a {kind.__name__}",
                    f"pass {section.name}={kind.__name__}(...), or leave it out for the defaults.",
                )

    @property
    def monitoring_enabled(self) -> bool:
        """The monitor runs unless either switch turns it off."""
        return self.monitor.enabled and self.distributed.enable_gpu_monitoring

    @property
    def checkpoint_directory(self) -> Path:
        """Where checkpoints go: ``checkpoint.checkpoint_dir``, or the experiment's
        ``<log_dir>/<experiment_name>/checkpoints`` (shared by its runs)."""
        run, chosen = self.run, self.checkpoint.checkpoint_dir
        return Path(chosen) if chosen else Path(run.log_dir) / run.experiment_name / "checkpoints"

    def for_run(self) -> TrainingConfig:
        """The tree a run uses: this one, or with a ``run.fast_dev_run`` its one epoch of
        ``n`` train and ``n`` val batches (:meth:`RunConfig.for_run`; the orchestrator
        applies it once, when it is created)."""
        run = self.run.for_run()
        return self if run is self.run else dataclasses.replace(self, run=run)

    def replace(self, values: Mapping[str, object]) -> TrainingConfig:
        """A new tree with each dotted path set (``{"precision.scaler.hysteresis": 2}``);
        a bad value raises :class:`ConfigError` naming its dotted path."""
        by_section: dict[str, dict[str, object]] = {}
        for path, value in values.items():  # a section's fields are checked together
            section, _, leaf = path.rpartition(".")
            by_section.setdefault(section, {})[leaf] = value
        tree: Any = self
        for section, leaves in by_section.items():
            tree = _replace_in(tree, section.split(".") if section else [], leaves, section)
        return tree  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, section by section (what ``config.json`` holds)."""
        return _plain(self)  # type: ignore[return-value]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingConfig:
        """The tree ``to_dict()`` wrote (absent sections and fields keep their defaults; the
        ``resolved`` part of a run's ``config.json`` is a description, not a setting)."""
        settings = {k: v for k, v in data.items() if k != "resolved"}
        return TrainingConfig().replace(dict(_leaves(settings)))


_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(TrainingConfig)}  # type: ignore[misc]
_NESTED: dict[type, dict[str, type]] = {
    MixedPrecisionConfig: {"scaler": LossScalerConfig},
    DataConfig: {"loader": LoaderConfig},
}


def _replace_in(node: Any, parts: list[str], leaves: dict[str, object], section: str) -> Any:
    """``node`` with the ``leaves`` of the section ``parts`` below it replaced."""
    prefix = f"{section}." if section else ""
    if parts:
        head = parts[0]
        _check_names(node, {head: leaves}, prefix[: -len(".".join(parts)) - 1])
        return dataclasses.replace(
            node, **{head: _replace_in(getattr(node, head), parts[1:], leaves, section)}
        )
    _check_names(node, leaves, section)
    try:
        return dataclasses.replace(node, **leaves)
    except ConfigError as exc:  # name the field by its dotted path
        raise exc.renamed(prefix + exc.field) if exc.field else exc from None


def _check_names(node: Any, leaves: Mapping[str, object], where: str) -> None:
    names = [f.name for f in fields(node)]
    for name, value in leaves.items():
        if name not in names:
            path = f"{where}.{name}" if where else name
            raise config_error(path, value, f"a field of {where or 'the root'}: {', '.join(names)}")


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and _is_section(path):
            out += _leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def _is_section(path: str) -> bool:
    parts = path.split(".")
    kind: type | None = TrainingConfig
    for part in parts:
        if kind is TrainingConfig:
            kind = _SECTIONS.get(part)
        else:
            kind = _NESTED.get(kind, {}).get(part) if kind is not None else None
    return kind is not None


def _plain(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):  # a leaf that is a mapping of its own (ray.runtime_env)
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
