"""The precision section of the config tree: ``MixedPrecisionConfig`` and its loss scaler.

Example::

    MixedPrecisionConfig(dtype="fp16", scaler=LossScalerConfig(init_scale=2.0**12, hysteresis=2))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from core.checks import check_bool_fields, is_finite_number, is_int, is_number
from core.errors import config_error

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

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    consecutive_hysteresis: bool = False
    min_scale: float = _DEFAULT_MIN_SCALE
    max_scale: float = 2.0**24

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
                "hysteresis", self.hysteresis,
                "an integer >= 1 (the consecutive overflows that trigger a back-off)",
                "use hysteresis=1 to back off on every overflow, as torch.amp.GradScaler does.",
            )  # fmt: skip
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
                    "max_scale", high, f"a finite float >= min_scale={low!r}",
                    "raise max_scale (default 2.0**24), or lower min_scale below it.",
                )  # fmt: skip
            raise config_error(
                "min_scale", low, f"a float in (0, max_scale={high!r}]",
                "lower min_scale (default 1.0), or raise max_scale above it.",
            )  # fmt: skip
        if not low <= self.init_scale <= high:
            raise config_error(
                "init_scale", self.init_scale,
                f"a float in [min_scale={low!r}, max_scale={high!r}]",
                "choose init_scale (default 2.0**16) between min_scale and max_scale.",
            )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MixedPrecisionConfig:
    """How a run uses reduced precision.

    ``dtype="auto"`` picks bf16 on CUDA devices that support it, fp16 with loss scaling on
    older CUDA devices, and fp32 on CPU. bf16 and fp16 work on CPU when asked for.
    ``enable_grad_scaler=False`` runs fp16 without loss scaling (rarely wise).
    ``cache_enabled`` is autocast's weight-cast cache (on: each weight is cast once per
    forward). The fp16 loss scaler is configured by ``scaler``.
    """

    enable_amp: bool = True
    dtype: AmpDtype = "auto"
    enable_grad_scaler: bool = True
    cache_enabled: bool = True
    scaler: LossScalerConfig = field(default_factory=LossScalerConfig)

    def __post_init__(self) -> None:
        check_bool_fields(self)
        parse_amp_dtype(self.dtype, "dtype")
        if not isinstance(self.scaler, LossScalerConfig):
            raise config_error(
                "scaler", self.scaler, "a LossScalerConfig", "e.g. scaler=LossScalerConfig()."
            )
