"""The seed factory's settings keywords, typed: one key per flat keyword, seed alias and
section keyword the config tree's fields declare (``metadata=flat(...)``).

Generated from the tree by ``python -m tests.flat_settings_gen``: do not edit by hand (a test
fails when the tree and this file disagree).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict

from core.checkpointing.config import CheckpointConfig
from core.distributed.config import MultiGPUConfig, TrainingMode
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.recovery import ErrorHandlerConfig
from core.memory.config import MemoryConfig
from core.precision.config import AmpDtype, MixedPrecisionConfig
from core.transforms.config import CompileMode, ModelTransformsConfig

__all__ = ("FlatSettings",)


class FlatSettings(TypedDict, total=False):
    """The factory's settings keywords, typed; each says what it sets."""

    experiment_name: str
    """Sets ``run.experiment_name``."""
    max_epochs: int
    """Sets ``run.max_epochs``."""
    max_steps: int | None
    """Sets ``run.max_steps``."""
    val_every_n_epochs: int | None
    """Sets ``run.val_every_n_epochs``."""
    val_every_n_steps: int | None
    """Sets ``run.val_every_n_steps``."""
    seed: int | None
    """Sets ``run.seed``."""
    deterministic: bool
    """Sets ``run.deterministic``."""
    log_dir: str | Path
    """Sets ``run.log_dir``."""
    handle_signals: bool
    """Sets ``run.handle_signals``."""
    stop_grace_s: float
    """Sets ``run.stop_grace_s``."""
    loader_grace_s: float
    """Sets ``run.loader_grace_s``."""
    data_stall_warn_s: float
    """Sets ``run.data_stall_warn_s``."""
    isolation: Literal["thread", "process", "ray"]
    """Sets ``run.isolation``."""
    fast_dev_run: bool | int
    """Sets ``run.fast_dev_run``."""
    keep_fast_dev_run_files: bool
    """Sets ``run.keep_fast_dev_run_files``."""
    limit_train_batches: int | float | None
    """Sets ``run.limit_train_batches``."""
    limit_val_batches: int | float | None
    """Sets ``run.limit_val_batches``."""
    num_sanity_val_steps: int
    """Sets ``run.num_sanity_val_steps``."""
    clear_cache_every_n_val_batches: int | None
    """Sets ``run.clear_cache_every_n_val_batches``."""
    learning_rate: float
    """Sets ``optim.learning_rate``."""
    weight_decay: float
    """Sets ``optim.weight_decay``."""
    max_grad_norm: float | None
    """Sets ``optim.max_grad_norm``."""
    enable_amp: bool
    """Sets ``precision.enable_amp``."""
    amp_dtype: AmpDtype
    """Sets ``precision.dtype``."""
    enable_grad_scaler: bool
    """Sets ``precision.enable_grad_scaler``."""
    amp_cache_enabled: bool
    """Sets ``precision.cache_enabled``."""
    amp_init_scale: float
    """Sets ``precision.scaler.init_scale``."""
    amp_growth_factor: float
    """Sets ``precision.scaler.growth_factor``."""
    amp_backoff_factor: float
    """Sets ``precision.scaler.backoff_factor``."""
    amp_growth_interval: int
    """Sets ``precision.scaler.growth_interval``."""
    amp_hysteresis: int
    """Sets ``precision.scaler.hysteresis``."""
    amp_consecutive_hysteresis: bool
    """Sets ``precision.scaler.consecutive_hysteresis``."""
    amp_min_scale: float
    """Sets ``precision.scaler.min_scale``."""
    amp_max_scale: float
    """Sets ``precision.scaler.max_scale``."""
    amp_monitoring: bool
    """Sets ``precision.enable_monitoring``."""
    amp_log_stats: bool
    """Sets ``precision.log_amp_stats``."""
    amp_track_memory: bool
    """Sets ``precision.track_memory_usage``."""
    amp_validate: bool
    """Sets ``precision.validate_amp``."""
    amp_check_compatibility: bool
    """Sets ``precision.check_compatibility``."""
    accumulation_steps: int
    """Sets ``accumulation.accumulation_steps``."""
    micro_batch_size: int | None
    """Sets ``accumulation.micro_batch_size``."""
    normalize_by: Literal["samples", "tokens"]
    """Sets ``accumulation.normalize_by``."""
    use_distributed_sampler: bool
    """Sets ``data.use_distributed_sampler``."""
    rebuild_loaders: bool
    """Sets ``data.rebuild_loaders``."""
    device_prefetch: Literal["auto"] | bool
    """Sets ``data.loader.device_prefetch``."""
    training_mode: TrainingMode
    """Sets ``distributed.training_mode``."""
    devices: int | None
    """Sets ``distributed.devices``."""
    tf32: bool
    """Sets ``hardware.tf32``."""
    cudnn_benchmark: bool
    """Sets ``hardware.cudnn_benchmark``."""
    memory_fraction: float | None
    """Sets ``hardware.memory_fraction``."""
    activation_checkpointing: bool | tuple[str, ...]
    """Sets ``transforms.activation_checkpointing``."""
    channels_last: Literal["auto"] | bool
    """Sets ``transforms.channels_last``."""
    compile: Literal["auto"] | bool
    """Sets ``transforms.compile``."""
    compile_mode: CompileMode
    """Sets ``transforms.compile_mode``."""
    compile_fullgraph: bool
    """Sets ``transforms.compile_fullgraph``."""
    auto_batch_size: bool
    """Sets ``memory.auto_batch_size``."""
    target_memory_gb: float | None
    """Sets ``memory.target_memory_gb``."""
    max_batch_size: int
    """Sets ``memory.max_batch_size``."""
    memory_margin: float
    """Sets ``memory.margin``."""
    checkpoint_dir: str | Path | None
    """Sets ``checkpoint.checkpoint_dir``."""
    checkpoint_every_n_steps: int | None
    """Sets ``checkpoint.checkpoint_every_n_steps``."""
    checkpoint_every_n_epochs: int | None
    """Sets ``checkpoint.checkpoint_every_n_epochs``."""
    keep_last_n: int | None
    """Sets ``checkpoint.keep_last_n``."""
    resume: str | Path | None
    """Sets ``checkpoint.resume``."""
    save_on_cancel: bool
    """Sets ``checkpoint.save_on_cancel``."""
    checkpoint_safe_globals: Sequence[Any]
    """Sets ``checkpoint.safe_globals``."""
    save_best: bool
    """Sets ``checkpoint.save_best``."""
    save_top_k: int | None
    """Sets ``checkpoint.save_top_k``."""
    save_last: bool
    """Sets ``checkpoint.save_last``."""
    monitor: str
    """Sets ``checkpoint.monitor``."""
    mode: Literal["min", "max"]
    """Sets ``checkpoint.mode``."""
    max_consecutive_nonfinite: int
    """Sets ``errors.max_consecutive_nonfinite``."""
    oom_recovery: Literal["auto", "on", "off"]
    """Sets ``errors.oom_recovery``."""
    early_stopping_patience: int | None
    """Sets ``early_stopping.patience``."""
    early_stopping_min_delta: float
    """Sets ``early_stopping.min_delta``."""
    early_stopping_monitor: str | None
    """Sets ``early_stopping.monitor``."""
    early_stopping_mode: Literal["min", "max"] | None
    """Sets ``early_stopping.mode``."""
    check_finite: bool
    """Sets ``early_stopping.check_finite``."""
    stopping_threshold: float | None
    """Sets ``early_stopping.stopping_threshold``."""
    divergence_threshold: float | None
    """Sets ``early_stopping.divergence_threshold``."""
    min_epochs: int | None
    """Sets ``early_stopping.min_epochs``."""
    min_steps: int | None
    """Sets ``early_stopping.min_steps``."""
    monitor_interval_s: float
    """Sets ``monitor.interval_s``."""
    monitor_history_size: int
    """Sets ``monitor.history_size``."""
    event_buffer_size: int
    """Sets ``logging.event_buffer_size``."""
    log_flush_interval_s: float
    """Sets ``logging.flush_interval_s``."""
    callback_grace_s: float
    """Sets ``logging.callback_grace_s``."""
    progress: bool
    """Sets ``logging.progress``."""
    reports: bool
    """Sets ``logging.reports``."""
    profile_steps: tuple[int, int, int] | None
    """Sets ``logging.profile_steps``."""
    step_accuracy: bool
    """Sets ``logging.step_accuracy``."""
    enable_mixed_precision: bool
    """Another name for ``enable_amp``."""
    batch_size: int | None
    """Another name for ``micro_batch_size``."""
    enable_gradient_checkpointing: bool | tuple[str, ...]
    """Another name for ``activation_checkpointing``."""
    mixed_precision_config: MixedPrecisionConfig | None
    """Sets the whole ``precision`` section."""
    gradient_accumulation_config: GradientAccumulationConfig | None
    """Sets the whole ``accumulation`` section."""
    multi_gpu_config: MultiGPUConfig | None
    """Sets the whole ``distributed`` section."""
    model_transforms_config: ModelTransformsConfig | None
    """Sets the whole ``transforms`` section."""
    memory_config: MemoryConfig | None
    """Sets the whole ``memory`` section."""
    checkpoint_config: CheckpointConfig | None
    """Sets the whole ``checkpoint`` section."""
    error_handler_config: ErrorHandlerConfig | None
    """Sets the whole ``errors`` section."""
