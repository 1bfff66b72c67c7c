"""Loading only the model weights of a run's checkpoint into a model, for inference or
fine-tuning: no optimizer, RNG or trainer state, no process group. Wrapper prefixes
(``module.``, ``_orig_mod.``, ...) are matched.

    loaded = load_weights("logs/exp/checkpoints/step-000000120-20261122-031500.123-a1b2c3", model)
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpointing.manifest import MANIFEST, followed, read_verified
from core.checkpointing.store import STATE, CheckpointStore
from core.errors import CheckpointError, IncompatibleCheckpointError

__all__ = ("LoadedWeights", "load_weights", "plain_name")

_LEADING = re.compile(r"^(?:module\.)+")
_INNER = re.compile(r"(?:^|(?<=\.))(?:_orig_mod|_checkpoint_wrapped_module|_fsdp_wrapped_module)\.")
_LAYOUT = (
    "a checkpoint directory (step-000000123-<run_id>/, under <log_dir>/<experiment>/"
    "checkpoints/) holds manifest.json, state.pt and, for FSDP2, sharded/"
)


@dataclass(frozen=True, kw_only=True)
class LoadedWeights:
    """What :func:`load_weights` loaded; with ``strict=False``, the names it left out (a name
    whose shape differs is in both)."""

    path: Path
    step: int
    epoch: int
    missing_keys: tuple[str, ...] = ()
    unexpected_keys: tuple[str, ...] = ()


def plain_name(name: str) -> str:
    """A parameter name without the prefixes wrappers add."""
    return _INNER.sub("", _LEADING.sub("", name))


def _shape(value: object) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    size = getattr(value, "size", None)
    return tuple(size) if isinstance(size, torch.Size) else None


def _match(saved: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, str]:
    """Saved name -> model name: equal names first, then equal plain names."""
    plain = {plain_name(name): name for name in target}
    mapping = {}
    for name in saved:
        if name in target:
            mapping[name] = name
        elif plain_name(name) in plain and plain[plain_name(name)] not in saved:
            mapping[name] = plain[plain_name(name)]
    return mapping


def _not_a_checkpoint(path: Path) -> CheckpointError:
    inside = sorted(p.name for p in path.glob("step-*") if p.is_dir()) if path.is_dir() else []
    fix = (
        f"pass one of its step-... directories, e.g. {str(path / inside[-1])!r}"
        if inside
        else "pass a step-... directory a run wrote"
    )
    return CheckpointError(f"{path} is not a checkpoint: {_LAYOUT}. Fix: {fix}.")


def _differ(path: Path, name: str, saved: object, current: object) -> IncompatibleCheckpointError:
    def text(shape: tuple[int, ...] | None) -> str:
        return "absent" if shape is None else f"shape {list(shape)}"

    return IncompatibleCheckpointError(
        f"cannot load the weights of {path}: the model differs at {name!r} (checkpoint "
        f"{text(_shape(saved))}, model {text(_shape(current))}). Fix: build the model the "
        "checkpoint was written with, or pass strict=False to load the weights that match."
    )


def _plan(
    path: Path, saved: Mapping[str, Any], target: Mapping[str, Any], strict: bool
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """Saved name -> model name, and the names each side left out."""
    mapping = _match(saved, target)
    for name, model_name in list(mapping.items()):
        if _shape(saved[name]) != _shape(target[model_name]):
            if strict:
                raise _differ(path, model_name, saved[name], target[model_name])
            del mapping[name]
    loaded = set(mapping.values())
    missing = tuple(name for name in target if name not in loaded)
    unexpected = tuple(name for name in saved if name not in mapping)
    if strict and missing:
        raise _differ(path, missing[0], None, target[missing[0]])
    if strict and unexpected:
        raise _differ(path, unexpected[0], saved[unexpected[0]], None)
    return mapping, missing, unexpected


def _sharded_model_entries(sharded: Path) -> dict[str, Any]:
    """The model's tensors in a sharded checkpoint's (already checked) metadata."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(sharded)).read_metadata()
    return {
        name.removeprefix("model."): entry
        for name, entry in metadata.state_dict_metadata.items()
        if name.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }


def _load_sharded(sharded: Path, model: nn.Module, mapping: dict[str, str]) -> None:
    from torch.distributed.checkpoint.state_dict_loader import load

    current = model.state_dict()
    target = {"model": {name: current[model_name] for name, model_name in mapping.items()}}
    with warnings.catch_warnings():  # "...assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        load(target, checkpoint_id=str(sharded), no_dist=True)


def load_weights(
    path: str | Path, model: nn.Module, *, strict: bool = True, safe_globals: Sequence[Any] = ()
) -> LoadedWeights:
    """Load the weights of checkpoint ``path`` (a ``step-...`` directory) into ``model``, in
    place, on its device and in its dtype, after verifying it.

    Raises :class:`~core.errors.CheckpointError` (not a checkpoint, a file missing or
    altered), :class:`~core.errors.UnsafeCheckpointError` (pickled code; see
    ``safe_globals``), and with ``strict=True``
    :class:`~core.errors.IncompatibleCheckpointError` at the first name or shape that
    differs, loading nothing; ``strict=False`` loads what matches.

    >>> load_weights(run.last_checkpoint, model).step  # doctest: +SKIP
    """
    path = followed(Path(path))
    if path.is_symlink() or not path.is_dir() or not (path / MANIFEST).is_file():
        raise _not_a_checkpoint(path)
    manifest = read_verified(path)
    payload = CheckpointStore(path.parent, keep_last_n=1, safe_globals=safe_globals).load_state(
        path
    )
    target = model.state_dict()
    sharded = path / "sharded"
    if isinstance(payload.get("model"), dict):
        saved: dict[str, Any] = payload["model"]
        mapping, missing, unexpected = _plan(path, saved, target, strict)
        renamed = {model_name: saved[name] for name, model_name in mapping.items()}
        model.load_state_dict(renamed, strict=False)  # copies onto the model's device, dtype
    elif sharded.is_dir():
        entries = _sharded_model_entries(sharded)
        mapping, missing, unexpected = _plan(path, entries, target, strict)
        _load_sharded(sharded, model, mapping)
    else:
        raise CheckpointError(
            f"{path} holds no model weights: {STATE} has no 'model' entry and there is no "
            f"sharded/ directory; {_LAYOUT}. Fix: pass a checkpoint a training run wrote."
        )
    return LoadedWeights(
        path=path,
        step=int(manifest["step"]),
        epoch=int(manifest["epoch"]),
        missing_keys=missing,
        unexpected_keys=unexpected,
    )
