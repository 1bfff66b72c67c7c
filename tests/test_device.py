"""The device object: what differs between CPU and CUDA, asked in one place."""

from __future__ import annotations

import pytest
import torch

from core.hardware.device import CudaDevice, Device, device_of
from core.precision import policy
from core.precision.config import MixedPrecisionConfig
from core.precision.plugins import FP32, Autocast
from core.precision.policy import fallback_precision, resolve_precision


def test_a_cpu_device_has_no_accelerator_extras() -> None:
    cpu = device_of("cpu")
    assert type(cpu) is Device and not cpu.is_cuda
    assert cpu.indices() == [] and cpu.allocated_and_peak() == (None, None)
    assert cpu.max_allocated() is None
    assert cpu.auto_dtype() == torch.float32 and cpu.supports_bf16()
    cpu.make_current()
    cpu.empty_cache()  # nothing to do, and no error


@pytest.mark.parametrize("native_bf16", [True, None, False])
def test_precision_asks_the_device_what_auto_and_fallback_mean(
    native_bf16: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 falls back to bf16 on a CPU with bf16 instructions (or where nobody can tell),
    to fp32 on one that would only emulate it (as slow as fp32, and less precise)."""
    monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda: native_bf16)
    cpu = torch.device("cpu")
    assert type(resolve_precision(MixedPrecisionConfig(), cpu)) is FP32
    fallback = fallback_precision(MixedPrecisionConfig(), cpu)
    if native_bf16 is False:
        assert type(fallback) is FP32
    else:
        assert isinstance(fallback, Autocast) and fallback.dtype == torch.bfloat16


def test_a_cuda_device_names_its_index_without_touching_a_gpu() -> None:
    cuda = device_of(torch.device("cuda", 3))
    assert type(cuda) is CudaDevice and cuda.is_cuda and cuda.indices() == [3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_device_reads_its_allocator_and_bf16_support() -> None:
    cuda = device_of(torch.device("cuda", 0))
    before, _ = cuda.allocated_and_peak()
    block = torch.empty(1 << 20, device="cuda")
    allocated, peak = cuda.allocated_and_peak()
    assert allocated == torch.cuda.memory_allocated() >= (before or 0) + block.numel() * 4
    assert peak == torch.cuda.max_memory_allocated() >= allocated
    assert cuda.auto_dtype() == (torch.bfloat16 if cuda.supports_bf16() else torch.float16)
