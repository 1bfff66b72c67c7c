"""Objects holding tensors, crossing into another process through one block of shared memory.

The pickle holds only the structure; each storage is copied once into the block, and on the
other side every tensor is a view of it. Shared storages stay shared (tied weights, the
optimizer's parameters). :func:`portable` gives numpy arrays instead, for Ray's object store.
"""

from __future__ import annotations

import ctypes
import functools
import io
import mmap
import os
import pickle
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch.multiprocessing import get_sharing_strategy

__all__ = (
    "ALIGN",
    "Packed",
    "Portable",
    "SharedBlock",
    "Slot",
    "main_is_importable",
    "pack",
    "portable",
    "structure_of",
)

ALIGN = 64  # byte alignment of each storage in the block (any element size divides it)
_MADV_REMOVE = 9  # Linux's madvise advice: free a shared mapping's pages and their memory


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class SharedBlock:
    """One block of shared memory holding many storages, each a byte range of it (pickled
    as a file descriptor of the same memory, never as its bytes)."""

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self._storage = storage

    @classmethod
    def allocate(cls, nbytes: int) -> SharedBlock:
        """A new, uninitialised block of ``nbytes``, its memory reserved at once (a machine out
        of shared memory fails here, not with a SIGBUS on first use)."""
        size = max(nbytes, 1)
        if not hasattr(os, "memfd_create") or get_sharing_strategy() != "file_descriptor":
            return cls(torch.UntypedStorage._new_shared(size))
        fd = os.memfd_create("core-shared-block", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            # Reserved without the interpreter lock: torch's _new_shared holds it, 40 ms per
            # 130 MB on a 2-core CPU, a stall of the event loop's thread.
            os.posix_fallocate(fd, 0, size)
            mapped = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
            return cls(mapped)  # it maps a duplicate of fd
        finally:
            os.close(fd)

    @property
    def nbytes(self) -> int:
        return self._storage.nbytes()

    def storage(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        """Bytes ``offset .. offset + nbytes`` as a storage of their own (the same memory)."""
        part: torch.UntypedStorage = self._storage[offset : offset + nbytes]
        return part

    def bytes_view(self, offset: int, nbytes: int) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8).set_(self.storage(offset, nbytes))

    def release(self) -> None:
        """Give the block's memory back now, without the interpreter lock (a worker thread's
        call, once nothing reads the block). Freeing a 58M-parameter model's pages takes ~50 ms
        of kernel time the deallocation would spend holding the lock. Best effort (Linux)."""
        page = mmap.PAGESIZE
        start = -(-self._storage.data_ptr() // page) * page  # past a header the mapping has
        end = -(-(self._storage.data_ptr() + self._storage.nbytes()) // page) * page  # its end
        if sys.platform == "linux" and end > start:
            libc = ctypes.CDLL(None, use_errno=True)  # a foreign call: the lock is released
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise(start, end - start, _MADV_REMOVE)
        # Unmapped and its file descriptor closed now, not whenever the last object that
        # refers to this block is collected (views of it, if any, keep the mapping).
        self._storage = torch.UntypedStorage(0)

    def private_copy(self) -> SharedBlock:
        """A copy in this process's own memory (for a rank of several)."""
        return SharedBlock(self._storage.clone())


@dataclass(frozen=True)
class Slot:
    """Where one tensor of the model's state dict lies in the block."""

    offset: int  # its storage's byte range in the block
    nbytes: int
    dtype: torch.dtype
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def view(self, block: SharedBlock) -> torch.Tensor:
        """The tensor, as a view of ``block``."""
        storage = block.storage(self.offset, self.nbytes)
        empty = torch.empty(0, dtype=self.dtype)
        return empty.set_(storage, self.storage_offset, self.size, self.stride)


@dataclass(frozen=True)
class _Range:
    """One storage's bytes in the block, and the device it lives on."""

    offset: int
    nbytes: int
    device: torch.device


@dataclass(frozen=True)
class Packed:
    """What crosses: the pickled structure, the block its storages lie in, and where each
    entry of the given model's state dict lies."""

    structure: bytes
    block: SharedBlock
    ranges: tuple[_Range, ...]
    model: Mapping[str, Slot]

    @property
    def tensor_bytes(self) -> int:
        return self.block.nbytes

    def release(self) -> None:
        """Free the block's memory now; read nothing after."""
        self.block.release()

    def unpack(self, *, private: bool = False) -> Any:
        """The objects, their tensors views of the block (of a copy of it with ``private``)."""
        block = self.block.private_copy() if private else self.block

        @functools.cache  # one storage per range: views of one storage stay views of one
        def storage(index: int) -> torch.UntypedStorage:
            where = self.ranges[index]
            bytes_ = block.bytes_view(where.offset, where.nbytes)
            if where.device.type != "cpu":  # crossed through host memory: back on its device
                bytes_ = bytes_.to(where.device)
            return bytes_.untyped_storage()

        return _Unpickler(io.BytesIO(self.structure), storage).load()


def main_is_importable() -> bool:
    """Whether a process started by ``multiprocessing`` can import this program's ``__main__``
    (not under ``python -c``, standard input, an interactive session or a notebook)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and Path(path).is_file()


class _StructurePickler(pickle.Pickler):
    """Pickles the structure, each storage as its index in :attr:`storages`; collects the
    classes and functions of an unimportable ``__main__`` in :attr:`unimportable`."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.storages: list[torch.UntypedStorage] = []
        self.unimportable: list[str] = []
        self._index: dict[int, int] = {}
        self._main_importable = main_is_importable()

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.storage.TypedStorage):
            return ("storage", self.add(obj._untyped_storage), obj.dtype)  # as torch.save does
        if (
            not self._main_importable
            and isinstance(obj, (type, types.FunctionType))
            and obj.__module__ == "__main__"
        ):
            self.unimportable.append(obj.__qualname__)
        return None

    def add(self, untyped: torch.UntypedStorage) -> int:
        """The index of ``untyped`` (one per storage, however many tensors view it)."""
        key = untyped._cdata
        if key not in self._index:
            self._index[key] = len(self.storages)
            self.storages.append(untyped)
        return self._index[key]


class _Discard(io.RawIOBase):
    def write(self, data: Any) -> int:
        return len(data)


def structure_of(objects: object) -> list[str]:
    """Pickle ``objects``' structure (no tensor data); the names it needs from an unimportable
    ``__main__`` (even if pickling then failed), or what pickling raised."""
    pickler = _StructurePickler(_Discard())  # type: ignore[arg-type]
    try:
        pickler.dump(objects)
    except Exception:
        if pickler.unimportable:
            return pickler.unimportable
        raise
    return pickler.unimportable


def pack(objects: object, model: torch.nn.Module | None) -> Packed:
    """``objects`` as they cross; with ``model``, its state dict laid out in the block too, for
    the way back (a storage ``objects`` did not hold gets a range, left unwritten)."""
    # A plain pickle writes every weight into its bytes and copies them out again: a
    # 58M-parameter model was copied four times on its way into a training process and back.
    buffer = io.BytesIO()
    pickler = _StructurePickler(buffer)
    pickler.dump(objects)
    crossing = len(pickler.storages)
    state = model.state_dict() if model is not None else {}
    indices = {key: pickler.add(tensor.untyped_storage()) for key, tensor in state.items()}
    ranges, offset = [], 0
    for untyped in pickler.storages:
        ranges.append(_Range(offset, untyped.nbytes(), untyped.device))
        offset += _aligned(untyped.nbytes())
    block = SharedBlock.allocate(offset)
    for untyped, where in zip(pickler.storages[:crossing], ranges, strict=False):
        source = torch.empty(0, dtype=torch.uint8, device=untyped.device).set_(untyped)
        block.bytes_view(where.offset, where.nbytes).copy_(source)
    slots = {key: _slot(ranges[indices[key]], tensor) for key, tensor in state.items()}
    return Packed(buffer.getvalue(), block, tuple(ranges), slots)


def _slot(where: _Range, tensor: torch.Tensor) -> Slot:
    return Slot(
        where.offset,
        where.nbytes,
        tensor.dtype,
        int(tensor.storage_offset()),
        tuple(tensor.size()),
        tuple(tensor.stride()),
    )


class _Unpickler(pickle.Unpickler):
    """Resolves each storage reference, its index, to ``storage(index)``."""

    def __init__(self, file: IO[bytes], storage: Callable[[int], torch.UntypedStorage]) -> None:
        super().__init__(file)
        self._storage = storage

    def persistent_load(self, pid: Any) -> Any:
        _, index, dtype = pid
        untyped = self._storage(index)
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


@dataclass(frozen=True)
class Portable:
    """Objects as they cross to another machine: their structure pickled, each storage's
    bytes a numpy array beside it (read-only where Ray's object store maps it)."""

    structure: bytes
    buffers: tuple[Any, ...]
    devices: tuple[torch.device, ...]

    @property
    def tensor_bytes(self) -> int:
        return sum(int(buffer.nbytes) for buffer in self.buffers)

    def unpack(self, *, read_only: bool = False) -> Any:
        """The objects, on the devices they came from, each buffer copied once (``read_only``:
        views of the buffers, for what is only read, such as weights loaded into a model)."""
        storages = []
        for buffer, device in zip(self.buffers, self.devices, strict=True):
            if read_only:
                bytes_ = _view(buffer)
            else:
                bytes_ = torch.frombuffer(bytearray(buffer), dtype=torch.uint8)
            if device.type != "cpu":
                bytes_ = bytes_.to(device)
            storages.append(bytes_.untyped_storage())
        return _Unpickler(io.BytesIO(self.structure), storages.__getitem__).load()


def _view(buffer: Any) -> torch.Tensor:
    """A read-only buffer's bytes as a tensor, without a copy."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(buffer, dtype=torch.uint8)


def portable(objects: object) -> Portable:
    """``objects`` as :class:`Portable` (the arrays view the storages: put them in the object
    store, which copies them, before the objects change)."""
    # Ray carries arrays beside the pickle; pickled tensors would be written into the pickle's
    # bytes while the interpreter lock is held, stalling the service's event loop.
    buffer = io.BytesIO()
    pickler = _StructurePickler(buffer)
    pickler.dump(objects)
    arrays = []
    for untyped in pickler.storages:
        bytes_ = torch.empty(0, dtype=torch.uint8, device=untyped.device).set_(untyped)
        arrays.append(bytes_.cpu().numpy())
    devices = tuple(untyped.device for untyped in pickler.storages)
    return Portable(buffer.getvalue(), tuple(arrays), devices)
