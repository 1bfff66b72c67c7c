"""Mixed precision: the choice of precision object, and AMP statistics. ``PrecisionPolicy``
resolves the config once into a precision object and hands the active one to the step loop at
each optimizer step. ``enable_amp()``/``disable_amp()``/``toggle_amp()`` may be called from any
thread; they take effect at the next optimizer step.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from core.hardware.device import device_of
from core.precision.config import LossScalerConfig, MixedPrecisionConfig, parse_amp_dtype
from core.precision.cpu_bf16 import cpu_has_native_bf16, emulated_bf16_note, warn_if_emulated_bf16
from core.precision.loss_scaler import DynamicLossScaler
from core.precision.plugins import FP32, Autocast, Precision, ScaledFP16

__all__ = (
    "PrecisionPolicy",
    "fallback_precision",
    "loss_scaler",
    "resolve_precision",
)

# The statistics a checkpoint keeps, in the order its "stats" list holds them.
_SAVED_STATS = (
    "_total_steps",
    "_amp_steps",
    "_recorded_steps",
    "_scaler_updates",
    "_overflow_count",
    "_skipped_steps",
    "_nonfinite_steps",
    "_step_time_total",
)


def loss_scaler(config: LossScalerConfig, device: torch.device) -> DynamicLossScaler:
    """The on-device loss scaler ``config`` describes (its fields are the scaler's keywords)."""
    return DynamicLossScaler(device, **asdict(config))


def fallback_precision(config: MixedPrecisionConfig, device: torch.device) -> Precision:
    """What fp16 falls back to when its loss scale cannot avoid overflow: bf16 where the
    device supports it (Ampere+ GPUs, CPUs with bf16 instructions), else fp32."""
    emulated = device.type == "cpu" and cpu_has_native_bf16() is False
    if device_of(device).supports_bf16() and not emulated:
        return Autocast(torch.bfloat16, device.type, config.weight_cache)
    return FP32()


def resolve_precision(config: MixedPrecisionConfig, device: torch.device) -> Precision:
    """Choose the precision object for ``config`` on ``device`` (once, at setup). ``"auto"``
    is fp32 on a CPU; an explicit bf16 on a CPU that emulates it logs ``bf16_emulated``."""
    dtype = parse_amp_dtype(config.dtype, "dtype") or device_of(device).auto_dtype()
    if not config.enable_amp or dtype == torch.float32:
        return FP32()
    warn_if_emulated_bf16(dtype, device)
    if dtype == torch.float16 and config.enable_grad_scaler:
        return ScaledFP16(device.type, loss_scaler(config.scaler, device), config.weight_cache)
    return Autocast(dtype, device.type, config.weight_cache)


class PrecisionPolicy:
    """The precision policy of a run: the precision of each optimizer step, the AMP switch,
    the fp16 fallback and the AMP statistics.

    AMP starts on when ``config.enable_amp`` and ``config.enabled`` are both set; with
    ``enabled=False`` the AMP precision is resolved but steps run fp32 until
    :meth:`enable_amp`. The per-batch calls (``train_step``...) are not here: the class of
    ``core.facades.mixed_precision_training`` extends this one with them.
    """

    def __init__(self, config: MixedPrecisionConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self._amp = resolve_precision(config, device)
        self.configured_precision = self._amp.name
        """The precision the config resolved to (before any fallback)."""
        self.precision_note = emulated_bf16_note(self._amp.dtype, device)
        """Why the resolved precision will be slow here (bf16 emulated by this CPU), or None."""
        self._fp32: Precision = FP32()
        self._amp_wanted = config.enable_amp and config.enabled
        self._active = self._amp if self._amp_wanted else self._fp32
        self._memory_savings: int | None = None
        self._memory_note = "not measured: track_memory_usage is off"
        self.compatibility: dict[str, Any] | None = None
        """The model's ``check_amp_compatibility`` report, where one was made."""
        self.reset_stats()

    # -- the step loop's side -------------------------------------------------------------
    @property
    def precision(self) -> Precision:
        """The precision of the current optimizer step."""
        return self._active

    @property
    def amp_precision(self) -> Precision:
        """The precision used while AMP is enabled (fp32 when AMP resolves to fp32)."""
        return self._amp

    @property
    def min_scale(self) -> float:
        """The fp16 loss scale's floor: an overflow there falls back to bf16 or fp32."""
        return self.config.scaler.min_scale

    def describe(self) -> dict[str, Any]:
        """The resolved precision and every setting of the precision section."""
        return {
            "resolved_precision": self._amp.name,
            "note": self.precision_note,
            "enable_amp": self.config.enable_amp,
            "dtype": str(self.config.dtype),
            "enable_grad_scaler": self.config.enable_grad_scaler,
            "cache_enabled": self.config.weight_cache,
            "scaler": asdict(self.config.scaler),
            "amp_enabled_at_start": self._amp_wanted,
            "memory_savings_bytes": self._memory_savings,
            "compatibility": self.compatibility,
        }

    def begin_step(self) -> Precision:
        """Apply a pending enable/disable and return the precision for this step."""
        self._active = self._amp if self._amp_wanted else self._fp32
        self._total_steps += 1
        self._amp_steps += int(self._active.uses_autocast)
        return self._active

    def record_step(
        self, *, overflow: bool, skipped: bool, step_time_s: float, counts_scaler_update: bool
    ) -> None:
        """Fold in one step's outcome, read back from the device after the step."""
        self._step_time_total += step_time_s
        self._recorded_steps += 1
        self._overflow_count += int(overflow)
        self._skipped_steps += int(skipped)
        self._nonfinite_steps += int(skipped and not overflow)
        self._scaler_updates += int(counts_scaler_update)

    def note_memory_savings(self, saved_bytes: int | None, note: str) -> None:
        """Keep the measured peak-memory saving of AMP over fp32 (``None``: not measured,
        ``note`` says why; see ``core.memory.amp_savings``)."""
        self._memory_savings, self._memory_note = saved_bytes, note

    def epoch_fields(self) -> dict[str, Any]:
        """What ``log_amp_stats`` adds to an ``epoch_end`` record: ``{"amp": stats}`` or ``{}``."""
        return {"amp": self.get_amp_stats()} if self.config.log_amp_stats else {}

    def fall_back(self) -> tuple[str, str]:
        """Leave fp16 for bf16 (or fp32) from the next step; returns (from, to) names."""
        before = self._amp.name
        self._amp = fallback_precision(self.config, self.device)
        self._fallbacks.append(self._amp.name)
        return before, self._amp.name

    # -- the user's side ------------------------------------------------------------------
    def enable_amp(self) -> None:
        self._amp_wanted = True

    def disable_amp(self) -> None:
        self._amp_wanted = False

    def toggle_amp(self) -> bool:
        """Flip AMP for the next step; returns whether AMP will be on."""
        self._amp_wanted = not self._amp_wanted
        return self._amp_wanted

    @property
    def amp_enabled(self) -> bool:
        return self._amp_wanted

    def reset_stats(self) -> None:
        self._total_steps = 0
        self._amp_steps = 0
        self._recorded_steps = 0
        self._scaler_updates = 0
        self._overflow_count = 0
        self._skipped_steps = 0
        self._step_time_total = 0.0
        self._nonfinite_steps = 0
        self._fallbacks: list[str] = []

    def get_amp_stats(self) -> dict[str, Any]:
        """The AMP statistics: steps, AMP steps, scaler updates, overflows, skipped and
        non-finite steps, fallbacks, the current loss scale, their ratios (0.0 before the first
        step) and the mean step time.

        ``avg_memory_savings`` is in GB of 2**30 bytes (as ``target_memory_gb``), measured
        once with ``track_memory_usage``; ``None`` otherwise, ``memory_savings_note`` says
        why. Example: ``policy.get_amp_stats()["overflow_ratio"]``.
        """
        total = self._total_steps
        scale = self._amp.loss_scale
        return {
            "precision": self._active.name,
            "amp_enabled": self._amp_wanted,
            "total_steps": total,
            "amp_steps": self._amp_steps,
            "scaler_updates": self._scaler_updates,
            "overflow_count": self._overflow_count,
            "skipped_steps": self._skipped_steps,
            "nonfinite_steps": self._nonfinite_steps,
            "precision_fallbacks": list(self._fallbacks),
            # Reads the live scale: one device sync, on request only.
            "current_scale": None if scale is None else float(scale),
            "amp_usage_ratio": self._amp_steps / total if total else 0.0,
            "overflow_ratio": self._overflow_count / total if total else 0.0,
            "avg_step_time": (
                self._step_time_total / self._recorded_steps if self._recorded_steps else 0.0
            ),
            "avg_memory_savings": (
                None if self._memory_savings is None else self._memory_savings / 2**30
            ),
            "memory_savings_note": self._memory_note,
        }

    def save_amp_stats(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`get_amp_stats` as JSON to ``path`` and return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.get_amp_stats(), indent=2) + "\n")
        return target

    def state_dict(self) -> dict[str, Any]:
        """Precision choice (fallbacks included), scaler state and the statistics."""
        return {
            "amp_enabled": self._amp_wanted,
            "fallbacks": list(self._fallbacks),
            "precision": self._amp.state_dict(),
            "stats": [getattr(self, name) for name in _SAVED_STATS],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._amp_wanted = bool(state["amp_enabled"])
        for _ in state["fallbacks"]:
            self.fall_back()
        self._active = self._amp if self._amp_wanted else self._fp32
        self._amp.load_state_dict(state["precision"])
        for name, value in zip(_SAVED_STATS, state["stats"], strict=True):
            setattr(self, name, value)


FORMER_NAMES = {"MixedPrecisionTrainer": "PrecisionPolicy"}
"""Names this module's classes had before, kept so that programs importing them still run."""


def __getattr__(name: str) -> Any:
    if name in FORMER_NAMES:
        warnings.warn(
            f"core.precision.policy.{name} is now {FORMER_NAMES[name]}; import the public "
            f"{name} from core (it adds the per-batch calls) or {FORMER_NAMES[name]} from here.",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[FORMER_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
