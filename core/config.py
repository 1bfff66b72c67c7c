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
from typing import Any

from core.checkpointing.checkpointer import CheckpointConfig
from core.checks import check_max_grad_norm, is_finite_number
from core.data.config import DataConfig, LoaderConfig
from core.distributed.config import MultiGPUConfig
from core.errors import ConfigError, config_error
from core.flat_keyword import flat
from core.hardware.settings import GPUManagerConfig
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.recovery import ErrorHandlerConfig
from core.memory.config import MemoryConfig
from core.monitoring.config import GPUMonitorConfig
from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.ray_config import RayConfig
from core.run_config import RunConfig
from core.stopping.config import EarlyStoppingConfig
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

    learning_rate: float = field(default=1e-3, metadata=flat("learning_rate"))
    weight_decay: float = field(default=0.01, metadata=flat("weight_decay"))
    max_grad_norm: float | None = field(default=None, metadata=flat("max_grad_norm"))

    def __post_init__(self) -> None:
        if not (is_finite_number(self.learning_rate) and self.learning_rate > 0):
            raise config_error(
                "learning_rate", self.learning_rate, "a finite float > 0", "try learning_rate=1e-3."
            )
        if not (is_finite_number(self.weight_decay) and self.weight_decay >= 0):
            raise config_error("weight_decay", self.weight_decay, "a finite float >= 0")
        check_max_grad_norm(self.max_grad_norm)


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """The root: one section per component. Every section has working defaults."""

    run: RunConfig = field(default_factory=RunConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: MixedPrecisionConfig = field(
        default_factory=MixedPrecisionConfig, metadata=flat("mixed_precision_config")
    )
    accumulation: GradientAccumulationConfig = field(
        default_factory=GradientAccumulationConfig, metadata=flat("gradient_accumulation_config")
    )
    data: DataConfig = field(default_factory=DataConfig)
    distributed: MultiGPUConfig = field(
        default_factory=MultiGPUConfig, metadata=flat("multi_gpu_config")
    )
    hardware: GPUManagerConfig = field(default_factory=GPUManagerConfig)
    transforms: ModelTransformsConfig = field(
        default_factory=ModelTransformsConfig, metadata=flat("model_transforms_config")
    )
    memory: MemoryConfig = field(default_factory=MemoryConfig, metadata=flat("memory_config"))
    checkpoint: CheckpointConfig = field(
        default_factory=CheckpointConfig, metadata=flat("checkpoint_config")
    )
    errors: ErrorHandlerConfig = field(
        default_factory=ErrorHandlerConfig, metadata=flat("error_handler_config")
    )
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
