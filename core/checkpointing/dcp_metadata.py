"""Reading a sharded checkpoint's ``.metadata`` as untrusted input, before torch does.

``torch.distributed.checkpoint`` unpickles it with plain ``pickle``; an unpickler that builds
only metadata's own types (its dataclasses and enums, ``torch.Size``, dtypes, layouts, paths)
reads it first.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pickle
from pathlib import Path
from typing import Any

import torch

from core.errors import UnsafeCheckpointError

__all__ = ("check_metadata",)

METADATA = ".metadata"
_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_ALLOWED: dict[str, frozenset[str]] = {
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


def _allowed(module: str, name: str) -> bool:
    if name in _ALLOWED.get(module, ()):
        return True
    if module == "torch":
        return isinstance(getattr(torch, name, None), (torch.dtype, torch.layout))
    if module in _DCP_MODULES:
        found = getattr(importlib.import_module(module), name, None)
        return isinstance(found, type) and (
            dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
        )
    return False


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise pickle.UnpicklingError(f"{module}.{name} is not distributed-checkpoint metadata")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent references are not metadata")


def check_metadata(sharded: Path) -> None:
    """Refuse ``sharded/.metadata`` unless it holds only distributed-checkpoint metadata."""
    file = sharded / METADATA
    if not file.exists():
        return
    try:
        with file.open("rb") as handle:
            _MetadataUnpickler(handle).load()
    except Exception as exc:
        raise UnsafeCheckpointError(
            f"refused to load {file}: it is not plain distributed-checkpoint metadata, and "
            f"nothing in it was run ({exc}). Fix: load only sharded checkpoints you wrote."
        ) from None
