"""The precision section of the config tree: ``MixedPrecisionConfig`` and its loss scaler.

Example::

    MixedPrecisionConfig(dtype="fp16", scaler=LossScalerConfig(init_scale=2.0**12, hysteresis=2))
    MixedPrecisionConfig(dtype="float16", loss_scaling=True, initial_scale=2**16)  # other names
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace
from typing import Any, Literal

import torch

from core.checks import check_bool, check_bool_fields, is_finite_number, is_int, is_number
from core.errors import ConfigError, config_error
from core.flat_keyword import flat

__all__ = ("AmpDtype", "LossScalerConfig", "MixedPrecisionConfig", "parse_amp_dtype")

AmpDtype = Literal["auto", "float16", "fp16", "bfloat16", "bf16", "float32", "fp32"] | torch.dtype

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
}
_DEFAULT_MIN_SCALE = 1.0
_ALLOWED_DTYPES = "'auto', torch.float16, torch.bfloat16, torch.float32 (or their names)"


def parse_amp_dtype(value: object, field: str = "amp_dtype") -> torch.dtype | None:
    """Map a user's dtype choice to a torch dtype; ``None`` means "auto"."""
    if value == "auto":
        return None
    if isinstance(value, torch.dtype) and value in (torch.float16, torch.bfloat16, torch.float32):
        return value
    if isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
    raise config_error(field, value, _ALLOWED_DTYPES, f"pass {field}='auto' to let core choose.")


@dataclass(frozen=True, kw_only=True)
class LossScalerConfig:
    """The fp16 dynamic loss scaler (see ``core.precision.loss_scaler``).

    ``hysteresis`` is defined as DeepSpeed defines it: the number of consecutive overflows
    that trigger a back-off (``1``, the default, backs off on every overflow, exactly as
    ``torch.amp.GradScaler`` does). ``consecutive_hysteresis=True`` refills that budget after
    every step without overflow (DeepSpeed's flag); otherwise it refills when the scale
    grows. The scale stays within ``[min_scale, max_scale]``; it grows by ``growth_factor``
    after ``growth_interval`` clean steps and shrinks by ``backoff_factor`` on a back-off.
    """

    init_scale: float = field(default=2.0**16, metadata=flat("amp_init_scale"))
    growth_factor: float = field(default=2.0, metadata=flat("amp_growth_factor"))
    backoff_factor: float = field(default=0.5, metadata=flat("amp_backoff_factor"))
    growth_interval: int = field(default=2000, metadata=flat("amp_growth_interval"))
    hysteresis: int = field(default=1, metadata=flat("amp_hysteresis"))
    consecutive_hysteresis: bool = field(default=False, metadata=flat("amp_consecutive_hysteresis"))
    min_scale: float = field(default=_DEFAULT_MIN_SCALE, metadata=flat("amp_min_scale"))
    max_scale: float = field(default=2.0**24, metadata=flat("amp_max_scale"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if not (is_finite_number(self.growth_factor) and self.growth_factor > 1.0):
            raise config_error("growth_factor", self.growth_factor, "a float > 1.0 and finite")
        if not (is_number(self.backoff_factor) and 0.0 < self.backoff_factor < 1.0):
            raise config_error("backoff_factor", self.backoff_factor, "a float in (0, 1)")
        if not (is_int(self.growth_interval) and self.growth_interval >= 1):
            raise config_error("growth_interval", self.growth_interval, "an integer >= 1")
        if not (is_int(self.hysteresis) and self.hysteresis >= 1):
            raise config_error(
                "hysteresis",
                self.hysteresis,
                "an integer >= 1 (the consecutive overflows that trigger a back-off)",
                "use hysteresis=1 to back off on every overflow, as torch.amp.GradScaler does.",
            )
        for name in ("init_scale", "min_scale", "max_scale"):
            if not (is_finite_number(getattr(self, name)) and getattr(self, name) > 0):
                raise config_error(name, getattr(self, name), "a finite float > 0")
        self._check_scale_bounds()

    def _check_scale_bounds(self) -> None:
        low, high = self.min_scale, self.max_scale
        if high < low:
            # Blame the bound the user most likely set: a max_scale below the default
            # min_scale is wrong whatever min_scale is; otherwise min_scale is too high.
            if high < _DEFAULT_MIN_SCALE:
                raise config_error(
                    "max_scale",
                    high,
                    f"a finite float >= min_scale={low!r}",
                    "raise max_scale (default 2.0**24), or lower min_scale below it.",
                )
            raise config_error(
                "min_scale",
                low,
                f"a float in (0, max_scale={high!r}]",
                "lower min_scale (default 1.0), or raise max_scale above it.",
            )
        if not low <= self.init_scale <= high:
            raise config_error(
                "init_scale",
                self.init_scale,
                f"a float in [min_scale={low!r}, max_scale={high!r}]",
                "choose init_scale (default 2.0**16) between min_scale and max_scale.",
            )


_SCALER_ALIASES = (
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "hysteresis",
    "min_scale",
    "max_scale",
)


@dataclass(frozen=True, kw_only=True)
class MixedPrecisionConfig:
    """How a run uses reduced precision; the table below says what each field does.

    ``dtype="auto"`` picks bf16 on CUDA devices that support it, fp16 with loss scaling on
    older CUDA devices, and fp32 on CPU. bf16 and fp16 work on CPU when asked for (bf16 on a
    CPU without bf16 instructions is emulated, several times slower than fp32: a
    ``bf16_emulated`` warning and the start banner say so); ``dtype``
    takes ``torch.float16``, ``"float16"``, ``"fp16"``, ``"half"``, ``torch.bfloat16``,
    ``"bfloat16"``, ``"bf16"``, ``torch.float32``, ``"float32"`` or ``"fp32"``.

    ========================  ==================================================================
    field                     behaviour
    ========================  ==================================================================
    ``enable_amp``            False: fp32 throughout (no autocast, no scaler)
    ``enabled``               the runtime AMP switch's start state: False resolves the AMP
                              precision but runs fp32 until ``enable_amp()`` turns it on
    ``enable_grad_scaler``    fp16's dynamic loss scaling (fp16 without it is rarely wise);
                              another name: ``loss_scaling``
    ``scaler``                the loss scaler (:class:`LossScalerConfig`); its fields
                              ``init_scale`` (or ``initial_scale``), ``growth_factor``,
                              ``backoff_factor``, ``growth_interval``, ``hysteresis``,
                              ``min_scale``, ``max_scale``, given here, are folded into it
                              (given with a non-default ``scaler=`` they raise: set them in
                              one place).
                              ``hysteresis`` counts the overflows that trigger a back-off
                              (DeepSpeed's meaning): ``hysteresis=2000`` absorbs 1999
                              overflows
    ``cache_enabled``         autocast's weight-cast cache (each weight cast once per forward)
    ``memory_efficient``      turns that cache off, whatever ``cache_enabled`` says (its
                              default True cannot be told from an explicit True): weights are
                              recast at every use, sparing the cast copies' memory
    ``autocast_enabled``      another name for ``enable_amp``: False is fp32
    ``clear_cache``           empty the CUDA caching allocator after each training epoch
                              (and after the per-batch facade's epochs and validations); no-op
                              on CPU; costs one device sync and later re-allocations, hence
                              off by default (on, it would slow every run)
    ``enable_monitoring``     accepted, no effect: the AMP statistics are always kept (counters
                              fed by the lagged readback, free), so False changes nothing
    ``log_amp_stats``         adds ``get_amp_stats()`` to each ``epoch_end`` record (``amp``)
    ``track_memory_usage``    measures ``avg_memory_savings``: the peak of one forward+backward
                              in fp32 minus under AMP (``core.memory.meter``), once, at the
                              build of a run or the per-batch facade's first step; off by
                              default: it costs two extra passes
    ``validate_amp``          accepted, no effect: a config is always validated when created
    ``check_compatibility``   runs ``check_amp_compatibility`` on the model when a run (or the
                              per-batch facade) is built: an ``amp_compatibility`` record
    ========================  ==================================================================

    The other names (``loss_scaling``, ``autocast_enabled``, ``initial_scale``) and the
    scaler's fields given here are constructor arguments only: ``__post_init__`` folds them
    into their fields, so ``to_dict()`` holds each setting once and round-trips. Example::

        MixedPrecisionConfig(dtype=torch.bfloat16, track_memory_usage=True, clear_cache=True)
    """

    enable_amp: bool = field(default=True, metadata=flat("enable_amp", "enable_mixed_precision"))
    dtype: AmpDtype = field(default="auto", metadata=flat("amp_dtype"))
    enable_grad_scaler: bool = field(default=True, metadata=flat("enable_grad_scaler"))
    cache_enabled: bool = field(default=True, metadata=flat("amp_cache_enabled"))
    scaler: LossScalerConfig = field(default_factory=LossScalerConfig)
    enabled: bool = True
    memory_efficient: bool = False
    clear_cache: bool = False
    enable_monitoring: bool = field(default=True, metadata=flat("amp_monitoring"))
    log_amp_stats: bool = field(default=True, metadata=flat("amp_log_stats"))
    track_memory_usage: bool = field(default=False, metadata=flat("amp_track_memory"))
    validate_amp: bool = field(default=True, metadata=flat("amp_validate"))
    check_compatibility: bool = field(default=True, metadata=flat("amp_check_compatibility"))
    loss_scaling: InitVar[bool | None] = None
    autocast_enabled: InitVar[bool | None] = None
    initial_scale: InitVar[float | None] = None
    init_scale: InitVar[float | None] = None
    growth_factor: InitVar[float | None] = None
    backoff_factor: InitVar[float | None] = None
    growth_interval: InitVar[int | None] = None
    hysteresis: InitVar[int | None] = None
    min_scale: InitVar[float | None] = None
    max_scale: InitVar[float | None] = None

    def __post_init__(
        self,
        loss_scaling: bool | None,
        autocast_enabled: bool | None,
        initial_scale: float | None,
        *scaler_fields: float | None,
    ) -> None:
        check_bool_fields(self)
        parse_amp_dtype(self.dtype, "dtype")
        if not isinstance(self.scaler, LossScalerConfig):
            raise config_error(
                "scaler", self.scaler, "a LossScalerConfig", "e.g. scaler=LossScalerConfig()."
            )
        self._fold_switch("loss_scaling", loss_scaling, "enable_grad_scaler")
        self._fold_switch("autocast_enabled", autocast_enabled, "enable_amp")
        self._fold_scaler(initial_scale, dict(zip(_SCALER_ALIASES, scaler_fields, strict=True)))

    @property
    def weight_cache(self) -> bool:
        """Whether autocast caches weight casts: ``cache_enabled`` unless ``memory_efficient``."""
        return self.cache_enabled and not self.memory_efficient

    def _fold_switch(self, alias: str, value: bool | None, target: str) -> None:
        """Set ``target`` from ``alias``, its other name; an explicit, different ``target``
        clashes."""
        if value is None:
            return
        check_bool(alias, value)
        current = getattr(self, target)
        if current is False and value is True:  # the default is True: False was given
            raise config_error(
                alias,
                value,
                f"a setting given once, but {target}={current!r} sets it too",
                f"{alias} is another name for {target}: pass one of them.",
            )
        object.__setattr__(self, target, value)

    def _fold_scaler(self, initial_scale: float | None, given: dict[str, Any]) -> None:
        """Build ``scaler`` from the scaler fields given to the constructor, if any."""
        if initial_scale is not None:
            if given["init_scale"] is not None:
                raise config_error(
                    "initial_scale",
                    initial_scale,
                    f"a setting given once, but init_scale={given['init_scale']!r} sets it too",
                    "initial_scale and init_scale are one setting: pass one.",
                )
            given["init_scale"] = initial_scale
        given = {k: v for k, v in given.items() if v is not None}
        if not given:
            return
        if self.scaler != LossScalerConfig():
            name = next(iter(given))
            raise config_error(
                name,
                given[name],
                f"a setting given once, but scaler={self.scaler!r} sets it too",
                f"set {name} inside scaler=LossScalerConfig({name}=...), or drop scaler=.",
            )
        try:
            object.__setattr__(self, "scaler", replace(self.scaler, **given))
        except ConfigError as exc:
            if exc.field == "init_scale" and initial_scale is not None:
                raise exc.renamed("initial_scale") from None
            raise
