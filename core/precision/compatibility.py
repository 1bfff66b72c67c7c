"""What in a model breaks, or runs slower than it could, under autocast: one report.

``check_amp_compatibility`` reads the model (its modules, parameters, buffers and the Python
source of its own module classes, best effort); it runs nothing and reads no device value.
Each finding is a blocker or a warning whose message says why and how to fix it.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import torch
from torch import nn

from core.hardware.device import device_of
from core.precision.config import parse_amp_dtype

__all__ = ("check_amp_compatibility",)

_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_MATMUL = re.compile(r"(@|\bmatmul\b|\bbmm\b|\beinsum\b)")
_BATCH_NORM = nn.modules.batchnorm._BatchNorm


def check_amp_compatibility(
    model: nn.Module,
    *,
    device: torch.device | str | None = None,
    dtype: object = None,
    loss_scaling: bool = True,
) -> dict[str, Any]:
    """Check ``model`` for autocast to ``dtype`` (default: what ``"auto"`` picks on
    ``device``, itself defaulting to the model's device) with or without a loss scaler.

    ``compatible`` is False only when a ``blocker`` stops autocast from working; each
    ``warnings`` entry names the module and what it costs, ``recommendations`` the fixes.

    Example::

        report = check_amp_compatibility(model, dtype="bf16")
        report["compatible"], report["warnings"], report["recommendations"]
    """
    place = torch.device(device) if device is not None else _device_of(model)
    wanted = parse_amp_dtype("auto" if dtype is None else dtype, "dtype")
    chosen = wanted or device_of(place).auto_dtype()
    report = _Report()
    autocast = chosen != torch.float32
    if chosen == torch.bfloat16 and not device_of(place).supports_bf16():
        report.block(
            f"bf16 asked on {place}, which has no bf16 support",
            "use dtype='fp16' (with loss scaling) or dtype='auto' on this device",
        )
    if chosen == torch.float16 and not loss_scaling:
        report.warn(
            "fp16 without a loss scaler: gradients below fp16's range underflow to zero",
            "keep enable_grad_scaler=True with fp16, or use bf16 where the device has it",
        )
    if autocast:
        _check_tensors(model, report)
        _check_modules(model, report)
    else:
        report.notes.append("fp32: autocast is off, nothing to check")
    if place.type == "cpu" and autocast:
        report.notes.append("on CPU autocast saves memory but is rarely faster than fp32")
    return {
        "compatible": not report.blockers,
        "device": str(place),
        "dtype": _SHORT[chosen],
        "blockers": report.blockers,
        "warnings": report.warnings,
        "recommendations": report.recommendations,
        "notes": report.notes,
    }


class _Report:
    def __init__(self) -> None:
        self.blockers: list[str] = []
        self.warnings: list[str] = []
        self.recommendations: list[str] = []
        self.notes: list[str] = []

    def block(self, what: str, fix: str) -> None:
        self.blockers.append(f"{what}; fix: {fix}")
        self.recommendations.append(fix)

    def warn(self, what: str, fix: str | None) -> None:
        self.warnings.append(what if fix is None else f"{what}; fix: {fix}")
        if fix is not None:
            self.recommendations.append(fix)


def _device_of(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _check_tensors(model: nn.Module, report: _Report) -> None:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    wide = [name for name, t in tensors if t.dtype == torch.float64]
    complex_ = [name for name, t in tensors if t.is_complex()]
    half = [name for name, t in model.named_parameters() if t.dtype == torch.float16]
    if wide:
        report.block(
            f"float64 tensors ({_names(wide)}): autocast does not cast float64, so ops "
            "mixing them with its fp16/bf16 outputs fail",
            "model.float() before training (or enable_amp=False to stay in full precision)",
        )
    if complex_:
        report.block(
            f"complex tensors ({_names(complex_)}): autocast and the loss scaler skip them",
            "keep this model in fp32 (enable_amp=False)",
        )
    if half:
        report.warn(
            f"fp16 parameters ({_names(half)}): without fp32 master weights small updates are lost",
            "keep parameters fp32 (model.float()); autocast casts per op",
        )


def _check_modules(model: nn.Module, report: _Report) -> None:
    modules = dict(model.named_modules())
    norms = [name or "<model>" for name, m in modules.items() if isinstance(m, _BATCH_NORM)]
    if norms:
        report.warn(
            f"BatchNorm layers ({_names(norms)}) run with fp32 weights and running statistics "
            "under autocast: fine, nothing to do",
            None,
        )
    for name, module in modules.items():
        if isinstance(module, nn.MultiheadAttention):
            _check_attention(name, module, modules, report)
    seen: set[type] = set()
    for name, module in modules.items():
        kind = type(module)
        if kind in seen or kind.__module__.startswith("torch"):
            continue
        seen.add(kind)
        _check_source(name or "<model>", kind, report)
    _check_functions({type(m) for m in modules.values()}, report)


def _check_attention(
    name: str, module: nn.MultiheadAttention, modules: dict[str, nn.Module], report: _Report
) -> None:
    parent = modules.get(name.rpartition(".")[0])
    source = _source(type(parent)) if parent is not None else None
    if source is not None and "need_weights=False" in source:
        return
    where = f"nn.MultiheadAttention {name!r}"
    layout = "" if module.batch_first else "; batch_first=False adds transposes"
    report.warn(
        f"{where}: its caller {type(parent).__name__ if parent else '?'} never passes "
        "need_weights=False, so it computes softmax(QK^T) in full instead of the fused "
        f"scaled_dot_product_attention kernels{layout}",
        f"call {name}(q, k, v, need_weights=False) (and batch_first=True)",
    )


def _check_source(name: str, kind: type, report: _Report) -> None:
    source = _source(kind)
    if source is None or "scaled_dot_product_attention" in source:
        return
    if "softmax" in source and _MATMUL.search(source):
        report.warn(
            f"{kind.__name__} ({name!r}) computes attention by hand (softmax of a matmul): "
            "no fused kernel, the attention weights are materialised",
            f"use F.scaled_dot_product_attention(q, k, v) in {kind.__name__}",
        )


def _check_functions(kinds: set[type], report: _Report) -> None:
    """Custom autograd Functions in the Python modules defining the model's classes."""
    found: dict[type, str] = {}
    for kind in kinds:
        if kind.__module__.startswith("torch"):
            continue
        namespace = vars(sys.modules[kind.__module__]) if kind.__module__ in sys.modules else {}
        for value in namespace.values():
            if (
                isinstance(value, type)
                and issubclass(value, torch.autograd.Function)
                and not value.__module__.startswith("torch")
            ):
                found[value] = kind.__module__
    for function, module in sorted(found.items(), key=lambda kv: kv[0].__qualname__):
        if not hasattr(getattr(function, "forward", None), "__wrapped__"):  # custom_fwd wraps it
            report.warn(
                f"custom autograd Function {function.__qualname__} (module {module}) has no "
                "torch.amp.custom_fwd: under autocast its forward gets mixed dtypes",
                f"decorate {function.__qualname__}.forward with @torch.amp.custom_fwd("
                "device_type=..., cast_inputs=torch.float32) and backward with "
                "@torch.amp.custom_bwd(device_type=...)",
            )


def _source(kind: type) -> str | None:
    try:
        return inspect.getsource(kind)
    except (OSError, TypeError):
        return None


def _names(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
