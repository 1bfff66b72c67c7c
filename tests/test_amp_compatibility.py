"""check_amp_compatibility on small real models: what it blocks, what it warns about, and
that the fixes it names silence it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.mixed_precision_training import check_amp_compatibility


class Square(torch.autograd.Function):
    """A custom Function without autocast decorators."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class UsesSquare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = Square.apply(self.linear(x))
        return out


class HandAttention(nn.Module):
    """softmax(QK^T)V written out: no fused kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1) @ v


class FusedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v)


class MhaDefault(nn.Module):
    """nn.MultiheadAttention called with need_weights left at its default (True)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.attn(x, x, x)[0]
        return out


def joined(report: dict[str, Any], key: str) -> str:
    return "\n".join(report[key])


def test_batch_norm_is_reported_as_fine_and_fp16_without_a_scaler_is_warned() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    report = check_amp_compatibility(model, device="cpu", dtype="bf16")
    assert report["compatible"] and report["dtype"] == "bf16" and report["blockers"] == []
    assert "BatchNorm layers (1)" in joined(report, "warnings")
    assert "fine, nothing to do" in joined(report, "warnings")
    unscaled = check_amp_compatibility(model, dtype=torch.float16, loss_scaling=False)
    assert unscaled["compatible"]
    assert "fp16 without a loss scaler" in joined(unscaled, "warnings")
    assert "enable_grad_scaler=True" in joined(unscaled, "recommendations")
    scaled = check_amp_compatibility(model, dtype=torch.float16)
    assert "loss scaler" not in joined(scaled, "warnings")


def test_float64_and_complex_tensors_block_autocast_but_not_fp32() -> None:
    report = check_amp_compatibility(nn.Linear(4, 2).double(), dtype="bf16")
    assert report["compatible"] is False
    assert "float64 tensors (weight, bias)" in joined(report, "blockers")
    assert "model.float()" in joined(report, "recommendations")
    prevented = pytest.raises(RuntimeError, match="same dtype")  # what the blocker prevents
    with prevented, torch.autocast("cpu", dtype=torch.bfloat16):
        nn.Linear(4, 2).double()(torch.randn(3, 4))
    complex_model = nn.Linear(2, 2)
    complex_model.weight = nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))
    assert "complex tensors" in joined(
        check_amp_compatibility(complex_model, dtype="fp16"), "blockers"
    )
    fp32 = check_amp_compatibility(nn.Linear(4, 2).double(), dtype="fp32")
    assert fp32["compatible"] and fp32["notes"] == ["fp32: autocast is off, nothing to check"]


def test_half_parameters_are_warned() -> None:
    report = check_amp_compatibility(nn.Linear(4, 2).half(), dtype="fp16")
    assert report["compatible"] and "fp16 parameters (weight, bias)" in joined(report, "warnings")


def test_attention_that_misses_the_fused_kernels_is_named_with_its_fix() -> None:
    report = check_amp_compatibility(
        nn.ModuleDict({"block": MhaDefault(), "hand": HandAttention(), "ok": FusedAttention()}),
        dtype="bf16",
    )
    warnings = joined(report, "warnings")
    assert "nn.MultiheadAttention 'block.attn'" in warnings
    assert "never passes need_weights=False" in warnings and "batch_first=False" in warnings
    assert "call block.attn(q, k, v, need_weights=False)" in joined(report, "recommendations")
    assert "HandAttention ('hand') computes attention by hand" in warnings
    assert "FusedAttention" not in warnings
    # torch's encoder layer passes need_weights=False: it reaches the fused kernels.
    layer = nn.TransformerEncoderLayer(8, 2, batch_first=True)
    assert check_amp_compatibility(layer, dtype="bf16")["warnings"] == []


def test_custom_autograd_functions_need_custom_fwd() -> None:
    report = check_amp_compatibility(UsesSquare(), dtype="bf16")
    assert "custom autograd Function Square" in joined(report, "warnings")
    assert "@torch.amp.custom_fwd" in joined(report, "recommendations")
    original = Square.forward
    try:
        Square.forward = staticmethod(  # type: ignore[method-assign]
            torch.amp.custom_fwd(original, device_type="cpu", cast_inputs=torch.float32)
        )
        assert "Square" not in joined(
            check_amp_compatibility(UsesSquare(), dtype="bf16"), "warnings"
        )
    finally:
        Square.forward = staticmethod(original)  # type: ignore[method-assign]
