"""The one table from the seed factory's flat keywords to the config tree.

``create_optimized_training_optimizer(amp_dtype="bf16", keep_last_n=3)`` sets
``precision.dtype`` and ``checkpoint.keep_last_n``; a section object
(``multi_gpu_config=MultiGPUConfig(...)``) sets a whole section; ``config=`` is the base
tree. Every new setting gets its place in the tree and, here, its flat name.

Each setting is given once: a flat keyword, a section object and ``config=`` that set the
same leaf raise :class:`~core.errors.ConfigError` naming both. (``config=`` sets the leaves
where it differs from the defaults; a section object sets every leaf of its section.)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from core.config import TrainingConfig
from core.errors import ConfigError, config_error
from core.facades.flat_settings import FlatSettings

__all__ = (
    "FLAT_KEYWORDS",
    "FlatSettings",
    "SECTION_KEYWORDS",
    "SEED_ALIASES",
    "config_from_flat",
)

FLAT_KEYWORDS: dict[str, str] = {
    "experiment_name": "run.experiment_name",
    "max_epochs": "run.max_epochs",
    "max_steps": "run.max_steps",
    "val_every_n_epochs": "run.val_every_n_epochs",
    "val_every_n_steps": "run.val_every_n_steps",
    "seed": "run.seed",
    "deterministic": "run.deterministic",
    "log_dir": "run.log_dir",
    "handle_signals": "run.handle_signals",
    "stop_grace_s": "run.stop_grace_s",
    "loader_grace_s": "run.loader_grace_s",
    "data_stall_warn_s": "run.data_stall_warn_s",
    "isolation": "run.isolation",
    "fast_dev_run": "run.fast_dev_run",
    "keep_fast_dev_run_files": "run.keep_fast_dev_run_files",
    "limit_train_batches": "run.limit_train_batches",
    "limit_val_batches": "run.limit_val_batches",
    "learning_rate": "optim.learning_rate",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "enable_amp": "precision.enable_amp",
    "amp_dtype": "precision.dtype",
    "enable_grad_scaler": "precision.enable_grad_scaler",
    "amp_cache_enabled": "precision.cache_enabled",
    "amp_init_scale": "precision.scaler.init_scale",
    "amp_growth_factor": "precision.scaler.growth_factor",
    "amp_backoff_factor": "precision.scaler.backoff_factor",
    "amp_growth_interval": "precision.scaler.growth_interval",
    "amp_hysteresis": "precision.scaler.hysteresis",
    "amp_consecutive_hysteresis": "precision.scaler.consecutive_hysteresis",
    "amp_min_scale": "precision.scaler.min_scale",
    "amp_max_scale": "precision.scaler.max_scale",
    "amp_monitoring": "precision.enable_monitoring",
    "amp_log_stats": "precision.log_amp_stats",
    "amp_track_memory": "precision.track_memory_usage",
    "amp_validate": "precision.validate_amp",
    "amp_check_compatibility": "precision.check_compatibility",
    "accumulation_steps": "accumulation.accumulation_steps",
    "micro_batch_size": "accumulation.micro_batch_size",
    "normalize_by": "accumulation.normalize_by",
    "training_mode": "distributed.training_mode",
    "devices": "distributed.devices",
    "use_distributed_sampler": "data.use_distributed_sampler",
    "device_prefetch": "data.loader.device_prefetch",
    "tf32": "hardware.tf32",
    "cudnn_benchmark": "hardware.cudnn_benchmark",
    "memory_fraction": "hardware.memory_fraction",
    "activation_checkpointing": "transforms.activation_checkpointing",
    "channels_last": "transforms.channels_last",
    "compile": "transforms.compile",
    "compile_mode": "transforms.compile_mode",
    "compile_fullgraph": "transforms.compile_fullgraph",
    "auto_batch_size": "memory.auto_batch_size",
    "target_memory_gb": "memory.target_memory_gb",
    "max_batch_size": "memory.max_batch_size",
    "memory_margin": "memory.margin",
    "checkpoint_dir": "checkpoint.checkpoint_dir",
    "checkpoint_every_n_steps": "checkpoint.checkpoint_every_n_steps",
    "checkpoint_every_n_epochs": "checkpoint.checkpoint_every_n_epochs",
    "keep_last_n": "checkpoint.keep_last_n",
    "resume": "checkpoint.resume",
    "save_on_cancel": "checkpoint.save_on_cancel",
    "checkpoint_safe_globals": "checkpoint.safe_globals",
    "save_best": "checkpoint.save_best",
    "save_top_k": "checkpoint.save_top_k",
    "save_last": "checkpoint.save_last",
    "monitor": "checkpoint.monitor",
    "mode": "checkpoint.mode",
    "max_consecutive_nonfinite": "errors.max_consecutive_nonfinite",
    "oom_recovery": "errors.oom_recovery",
    "early_stopping_patience": "early_stopping.patience",
    "early_stopping_min_delta": "early_stopping.min_delta",
    "early_stopping_monitor": "early_stopping.monitor",
    "early_stopping_mode": "early_stopping.mode",
    "check_finite": "early_stopping.check_finite",
    "stopping_threshold": "early_stopping.stopping_threshold",
    "divergence_threshold": "early_stopping.divergence_threshold",
    "min_epochs": "early_stopping.min_epochs",
    "min_steps": "early_stopping.min_steps",
    "monitor_interval_s": "monitor.interval_s",
    "monitor_history_size": "monitor.history_size",
    "event_buffer_size": "logging.event_buffer_size",
    "log_flush_interval_s": "logging.flush_interval_s",
    "callback_grace_s": "logging.callback_grace_s",
    "progress": "logging.progress",
    "reports": "logging.reports",
    "profile_steps": "logging.profile_steps",
}
"""Flat keyword -> dotted path of its leaf in :class:`~core.config.TrainingConfig`."""

SECTION_KEYWORDS: dict[str, str] = {
    "mixed_precision_config": "precision",
    "gradient_accumulation_config": "accumulation",
    "multi_gpu_config": "distributed",
    "checkpoint_config": "checkpoint",
    "error_handler_config": "errors",
    "model_transforms_config": "transforms",
    "memory_config": "memory",
}
"""Keyword taking a whole section object -> the section's name in the tree."""

SEED_ALIASES: dict[str, str] = {
    "enable_mixed_precision": "enable_amp",
    "enable_gradient_checkpointing": "activation_checkpointing",
    "batch_size": "micro_batch_size",
}
"""Seed 004's names for flat keywords: an alias sets the same leaf, and giving both raises.
``batch_size`` is the most samples one forward pass sees: larger loader batches are split
into micro-batches of it, with the same result (the loader's batch stays the step's batch)."""


def config_from_flat(
    settings: Mapping[str, Any], config: TrainingConfig | None = None
) -> TrainingConfig:
    """The tree for ``settings`` (flat and section keywords) on top of ``config``.

    >>> config_from_flat({"amp_dtype": "bf16"}).precision.dtype
    'bf16'
    """
    _check_names(settings)
    settings = _unalias(settings)
    if config is not None and not isinstance(config, TrainingConfig):
        raise config_error("config", config, "None or a TrainingConfig")
    base = config or TrainingConfig()
    givers = _given_by_config(base) if config is not None else {}
    tree = base
    for keyword, section in SECTION_KEYWORDS.items():
        value = settings.get(keyword)
        if value is None:
            continue
        for leaf in _leaf_paths(getattr(tree, section), section):
            _claim(givers, leaf, keyword, value)
        tree = _set(tree, {section: value}, {section: keyword})
    leaves = {path: settings[k] for k, path in FLAT_KEYWORDS.items() if k in settings}
    for keyword, path in FLAT_KEYWORDS.items():
        if keyword in settings:
            _claim(givers, path, keyword, settings[keyword])
    return _set(tree, leaves, {path: k for k, path in FLAT_KEYWORDS.items()})


def _unalias(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with seed aliases under their flat keyword (an error keeps the alias)."""
    plain = {k: v for k, v in settings.items() if k not in SEED_ALIASES}
    for alias, keyword in SEED_ALIASES.items():
        if alias not in settings:
            continue
        if keyword in settings:
            raise config_error(
                alias,
                settings[alias],
                f"a setting given once, but {keyword} sets it too",
                f"{alias} is another name for {keyword}: pass one of them.",
            )
        plain[keyword] = settings[alias]
    return plain


def _check_names(settings: Mapping[str, Any]) -> None:
    known = FLAT_KEYWORDS.keys() | SECTION_KEYWORDS.keys() | SEED_ALIASES.keys()
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"create_optimized_training_optimizer() got an unexpected keyword argument "
                f"{name!r}{hint} (settings without a flat keyword are reached with config=)"
            )


def _given_by_config(config: TrainingConfig) -> dict[str, str]:
    """The leaves ``config=`` sets: those that differ from the defaults."""
    default = TrainingConfig()
    return {
        path: "config"
        for section in fields(TrainingConfig)
        for path in _leaf_paths(getattr(config, section.name), section.name)
        if _get(config, path) != _get(default, path)
    }


def _leaf_paths(node: Any, prefix: str) -> list[str]:
    paths: list[str] = []
    for f in fields(node):
        value = getattr(node, f.name)
        path = f"{prefix}.{f.name}"
        paths += _leaf_paths(value, path) if hasattr(value, "__dataclass_fields__") else [path]
    return paths


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _claim(givers: dict[str, str], path: str, keyword: str, value: object) -> None:
    if path in givers:
        first = givers[path]
        raise config_error(
            keyword,
            value,
            f"a setting given once, but {first} sets {path} too",
            f"set it in one place: drop {keyword}=..., or leave {path} out of {first}.",
        )
    givers[path] = keyword


def _set(
    tree: TrainingConfig, values: dict[str, object], keywords: dict[str, str]
) -> TrainingConfig:
    """``tree`` with ``values`` set; an error names the keyword the user writes for the
    field (``amp_min_scale``, not ``precision.scaler.min_scale``)."""
    try:
        return tree.replace(values)
    except ConfigError as exc:
        path = exc.field or ""
        keyword = keywords.get(path, path)
        message = str(exc).replace(path, keyword)
        # The section's other fields a message mentions get their flat names too:
        # "max_scale ... >= min_scale=1.0" reads "amp_max_scale ... >= amp_min_scale=1.0".
        section = path.rsplit(".", 1)[0]
        for name, other in FLAT_KEYWORDS.items():
            if other.rsplit(".", 1)[0] == section:
                leaf = other.rsplit(".", 1)[-1]
                message = re.sub(rf"(?<![.\w]){re.escape(leaf)}\b", name, message)
        error = type(exc)(message)
        error.field = keyword
        raise error from None
