"""A checkpoint's manifest: what it must say, and the check that every file agrees with it. It
is read as untrusted input: exact schema, plain relative names, no symlink, no unlisted file,
sizes (compared before hashing) and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from core.errors import CheckpointError

__all__ = (
    "MANIFEST",
    "VERSION",
    "file_entries",
    "followed",
    "hash_file",
    "is_checkpoint",
    "other_version",
    "read_verified",
)

MANIFEST = "manifest.json"
VERSION = 2
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "model_factory": (dict,),  # how the run made its model (core.load_model)
    "lineage": (str,),  # the lineage it belongs to (absent before lineages: its run_id)
    "fingerprint": (dict,),  # the settings its state depends on (a copy of state.pt's)
    "sequence": (int,),  # its place in commit order (absent before: core.checkpointing.order)
}
_FIELDS: dict[str, tuple[type, ...]] = {
    "manifest_version": (int,),
    "step": (int,),
    "epoch": (int,),
    "reason": (str,),
    "run_id": (str,),
    "parent": (str, type(None)),
    "committed_at_ns": (int,),
    "files": (dict,),
}


def followed(path: Path) -> Path:
    """``path``, or the checkpoint the ``last`` link names; any other link is left (refused)."""
    if path.is_symlink() and path.name == "last":
        target = os.readlink(path)
        if "/" not in target and target not in ("", ".", ".."):
            return path.parent / target
    return path


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` has a manifest (not verified: see :func:`read_verified`)."""
    return (path / MANIFEST).is_file()


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    for directory, subdirs, files in os.walk(root, followlinks=False):
        for name in [*subdirs, *files]:
            path = Path(directory) / name
            yield path.relative_to(root).as_posix(), path


def file_entries(
    root: Path, known: Mapping[Path, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """The ``files`` section of a manifest; ``known``: entries hashed as written."""
    known = known or {}
    return {
        name: dict(known[path])
        if path in known
        else {"sha256": hash_file(path), "bytes": path.stat().st_size}
        for name, path in sorted(_walk(root))
        if path.is_file() and name != MANIFEST
    }


def _invalid(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is rejected: {why}")


def other_version(manifest: Mapping[str, Any]) -> str | None:
    """Why a manifest of another ``manifest_version`` is foreign; None for this version's."""
    version = manifest.get("manifest_version")
    if version == VERSION or not isinstance(version, int) or isinstance(version, bool):
        return None
    return (
        f"manifest_version {version}, and this version of core reads manifest_version "
        f"{VERSION} (it was written by another version of core)"
    )


def _check_schema(path: Path, manifest: object) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise _invalid(path, f"its manifest is a {type(manifest).__name__}, not an object")
    if (other := other_version(manifest)) is not None:  # before its keys: theirs differ
        raise _invalid(path, other)
    missing = sorted(set(_FIELDS) - set(manifest))
    extra = sorted(set(manifest) - set(_FIELDS) - set(_OPTIONAL))
    if missing or extra:
        raise _invalid(path, f"manifest keys missing {missing}, unexpected {extra}")
    for key, types in _FIELDS.items():
        value = manifest[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise _invalid(path, f"manifest field {key}={value!r} has the wrong type")
    for key, types in _OPTIONAL.items():
        if key in manifest and not isinstance(manifest[key], types):
            raise _invalid(path, f"manifest field {key}={manifest[key]!r} has the wrong type")
    if not manifest["files"]:
        raise _invalid(path, "its manifest lists no file")
    for name, entry in manifest["files"].items():
        _check_entry(path, name, entry)
    return manifest


def _check_entry(path: Path, name: object, entry: object) -> None:
    if not isinstance(name, str) or not name:
        raise _invalid(path, f"file name {name!r} is not a string")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name or name == MANIFEST:
        raise _invalid(path, f"file name {name!r} points outside the checkpoint")
    if not (isinstance(entry, dict) and set(entry) == {"sha256", "bytes"}):
        raise _invalid(path, f"entry of {name} must be {{'sha256', 'bytes'}}, got {entry!r}")
    digest, size = entry["sha256"], entry["bytes"]
    if not (isinstance(digest, str) and _SHA256.match(digest)):
        raise _invalid(path, f"sha256 of {name} is {digest!r}, not 64 hex digits")
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        raise _invalid(path, f"size of {name} is {size!r}, not a byte count")


def read_verified(path: Path) -> dict[str, Any]:
    """The manifest of ``path`` once it checks out, else :class:`~core.errors.CheckpointError`."""
    if path.is_symlink() or not path.is_dir():
        raise _invalid(path, "it is not a plain directory")
    manifest_path = path / MANIFEST
    if manifest_path.is_symlink():
        raise _invalid(path, "its manifest is a symlink")
    try:
        manifest = _check_schema(path, json.loads(manifest_path.read_text()))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable manifest: {exc}") from None
    listed: dict[str, dict[str, Any]] = manifest["files"]
    present: set[str] = set()
    for name, entry in _walk(path):
        if entry.is_symlink():
            raise _invalid(path, f"{name} is a symlink")
        if entry.is_file() and name != MANIFEST:
            if name not in listed:
                raise _invalid(path, f"{name} is present but not in the manifest")
            present.add(name)
    for name, expected in listed.items():
        if name not in present:
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        file = path / name
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise _invalid(path, f"{name} has {size} bytes, the manifest says {expected['bytes']}")
        actual = hash_file(file)
        if actual != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} has sha256 {actual[:12]}..., the manifest "
                f"says {expected['sha256'][:12]}... (truncated or altered)"
            )
    return manifest
