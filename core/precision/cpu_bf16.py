"""Whether this CPU computes bf16 in hardware, and the warning a run gets when it asks for bf16
on one that does not. Emulated bf16 runs several times slower (docs/memory-and-speed.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
import torch

__all__ = (
    "EMULATED_BF16_NOTE",
    "cpu_has_native_bf16",
    "emulated_bf16_note",
    "warn_if_emulated_bf16",
)

_log = structlog.get_logger("core")

# The capability flags of torch.cpu.get_capabilities() that mean bf16 arithmetic in hardware
# (without them autocast emulates bf16: 6-25x slower than fp32 was measured on one CPU).
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")

EMULATED_BF16_NOTE = (
    "bf16 on this CPU is emulated (no AVX512-BF16, AMX or ARM BF16 instructions): steps run "
    "several times slower than fp32. Fix: dtype='auto' (fp32 on CPUs) or dtype='float32'."
)
"""What the warning (and the start banner's precision line) says."""


def _capabilities() -> Mapping[str, Any] | None:
    probe = getattr(torch.cpu, "get_capabilities", None)  # torch >= 2.9
    if probe is None:
        return None
    try:
        found: Mapping[str, Any] = probe()
    except RuntimeError:  # cpuinfo could not read this CPU
        return None
    return found


def cpu_has_native_bf16() -> bool | None:
    """True when this CPU has bf16 instructions, False when it lacks them, None when torch
    cannot tell (the warning is then left out).

    >>> cpu_has_native_bf16() in (True, False, None)
    True
    """
    capabilities = _capabilities()
    if capabilities is not None:
        return any(capabilities.get(flag) is True for flag in _NATIVE_BF16_FLAGS)
    # Older torch: the x86 probes only (an ARM CPU without get_capabilities is unknown).
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if avx512_bf16 is None or amx is None:
        return None
    return bool(avx512_bf16()) or bool(amx())


def emulated_bf16_note(dtype: torch.dtype | None, device: torch.device) -> str | None:
    """:data:`EMULATED_BF16_NOTE` when ``dtype`` is bf16 on a CPU without bf16 instructions;
    None otherwise (another dtype or device, a CPU with them, or one torch cannot tell).

    >>> emulated_bf16_note(torch.float32, torch.device("cpu")) is None
    True
    """
    if dtype != torch.bfloat16 or device.type != "cpu" or cpu_has_native_bf16() is not False:
        return None
    return EMULATED_BF16_NOTE


def warn_if_emulated_bf16(dtype: torch.dtype | None, device: torch.device) -> str | None:
    """Log one ``bf16_emulated`` warning when :func:`emulated_bf16_note` has a note, and
    return the note."""
    note = emulated_bf16_note(dtype, device)
    if note is not None:
        _log.warning("bf16_emulated", device=str(device), advice=note)
    return note
