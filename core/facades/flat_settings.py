"""The seed factory's settings keywords, typed: one entry per flat keyword, seed alias and
section keyword of ``core.facades.flat`` (a test keeps the two in step)."""

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
    """The factory's settings keywords, typed (the table above says where each goes)."""

    experiment_name: str
    max_epochs: int
    max_steps: int | None
    val_every_n_epochs: int | None
    val_every_n_steps: int | None
    seed: int | None
    deterministic: bool
    log_dir: str | Path
    handle_signals: bool
    stop_grace_s: float
    loader_grace_s: float
    data_stall_warn_s: float
    isolation: Literal["thread", "process"]
    fast_dev_run: bool | int
    keep_fast_dev_run_files: bool
    limit_train_batches: int | float | None
    limit_val_batches: int | float | None
    learning_rate: float
    weight_decay: float
    max_grad_norm: float | None
    enable_amp: bool
    amp_dtype: AmpDtype
    enable_grad_scaler: bool
    amp_cache_enabled: bool
    amp_init_scale: float
    amp_growth_factor: float
    amp_backoff_factor: float
    amp_growth_interval: int
    amp_hysteresis: int
    amp_consecutive_hysteresis: bool
    amp_min_scale: float
    amp_max_scale: float
    amp_monitoring: bool
    amp_log_stats: bool
    amp_track_memory: bool
    amp_validate: bool
    amp_check_compatibility: bool
    accumulation_steps: int
    micro_batch_size: int | None
    normalize_by: Literal["samples", "tokens"]
    training_mode: TrainingMode
    devices: int | None
    use_distributed_sampler: bool
    device_prefetch: Literal["auto"] | bool
    tf32: bool
    cudnn_benchmark: bool
    memory_fraction: float | None
    activation_checkpointing: bool | tuple[str, ...]
    channels_last: Literal["auto"] | bool
    compile: Literal["auto"] | bool
    compile_mode: CompileMode
    compile_fullgraph: bool
    auto_batch_size: bool
    target_memory_gb: float | None
    max_batch_size: int
    memory_margin: float
    checkpoint_dir: str | Path | None
    checkpoint_every_n_steps: int | None
    checkpoint_every_n_epochs: int | None
    keep_last_n: int | None
    resume: str | Path | None
    save_on_cancel: bool
    checkpoint_safe_globals: Sequence[Any]
    save_best: bool
    save_top_k: int | None
    save_last: bool
    monitor: str
    mode: Literal["min", "max"]
    max_consecutive_nonfinite: int
    oom_recovery: Literal["auto", "on", "off"]
    early_stopping_patience: int | None
    early_stopping_min_delta: float
    early_stopping_monitor: str | None
    early_stopping_mode: Literal["min", "max"] | None
    check_finite: bool
    stopping_threshold: float | None
    divergence_threshold: float | None
    min_epochs: int | None
    min_steps: int | None
    monitor_interval_s: float
    monitor_history_size: int
    event_buffer_size: int
    log_flush_interval_s: float
    callback_grace_s: float
    progress: bool
    reports: bool
    profile_steps: tuple[int, int, int] | None
    enable_mixed_precision: bool
    enable_gradient_checkpointing: bool | tuple[str, ...]
    batch_size: int | None
    mixed_precision_config: MixedPrecisionConfig | None
    gradient_accumulation_config: GradientAccumulationConfig | None
    multi_gpu_config: MultiGPUConfig | None
    checkpoint_config: CheckpointConfig | None
    error_handler_config: ErrorHandlerConfig | None
    model_transforms_config: ModelTransformsConfig | None
    memory_config: MemoryConfig | None
