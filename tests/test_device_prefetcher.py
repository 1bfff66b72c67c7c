"""DevicePrefetcher: pass-through on CPU, len and attribute delegation, nested batches, the
order of the CUDA path (copy of batch N+1 started before batch N is used; a stream wait
before each use) with stand-ins for the CUDA stream calls, and a real CUDA run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import core.data.prefetch as prefetch
from core.data import DevicePrefetcher, LoaderConfig, prefetch_to_device
from core.hardware.device import CudaDevice

CPU = torch.device("cpu")


def nested_batches(n: int = 3) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    out: list[Any] = []
    for i in range(n):
        x, y = torch.randn(4, 3, generator=g), torch.arange(4) + i
        out += [
            (x, y),  # a pair
            [x, {"mask": y > 1, "extra": [x * 2, "label"]}],  # a list holding a dict
            {"input_ids": y, "pixel_values": (x, x + 1)},  # a dict for a model computing its loss
        ]
    return out


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_on_cpu_the_loaders_batches_pass_through_unchanged() -> None:
    source = nested_batches()
    seen = list(DevicePrefetcher(source, CPU))
    assert len(seen) == len(source)
    assert all(got is original for got, original in zip(seen, source, strict=True))  # no copies


def test_len_and_the_loaders_attributes_are_read_through_the_wrapper() -> None:
    data = TensorDataset(torch.arange(10.0))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert prefetcher.loader is loader and len(prefetcher) == len(loader) == 3
    assert prefetcher.sampler is sampler and prefetcher.dataset is data
    assert prefetcher.batch_size == 2 and prefetcher.drop_last is False
    # What a distributed strategy does at each epoch start reaches the real sampler.
    prefetcher.sampler.set_epoch(3)
    assert sampler.epoch == 3
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        _ = prefetcher.no_such_thing


def test_a_loader_without_len_gives_a_prefetcher_without_len() -> None:
    prefetcher = DevicePrefetcher(iter(nested_batches()), CPU)
    with pytest.raises(TypeError, match="has no len"):
        len(prefetcher)
    assert len(list(prefetcher)) == 9


def test_prefetching_is_chosen_by_the_config_and_device() -> None:
    loader = nested_batches()
    assert prefetch_to_device(loader, CPU) is loader  # auto: nothing on CPU
    forced = prefetch_to_device(loader, CPU, LoaderConfig(device_prefetch=True))
    assert isinstance(forced, DevicePrefetcher) and list(forced) == loader
    assert isinstance(prefetch_to_device(loader, "cuda"), DevicePrefetcher)  # auto: on CUDA
    off = LoaderConfig(device_prefetch=False)
    assert prefetch_to_device(loader, "cuda", off) is loader


class FakeStream:
    """Stands in for ``torch.cuda.Stream`` (needs a GPU): records the calls made on it."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


def fake_cuda(
    monkeypatch: pytest.MonkeyPatch, log: list[str], on_stream: Any, consumer: FakeStream
) -> None:
    monkeypatch.setattr(prefetch, "device_of", lambda device: CudaDevice(torch.device(device)))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream(log, "side"))
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: consumer)


def test_batches_already_on_the_device_pass_without_stream_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []

    @contextmanager
    def on_stream(stream: FakeStream) -> Iterator[None]:
        log.append(f"copy on {stream.name}")
        yield

    fake_cuda(monkeypatch, log, on_stream, FakeStream(log, "main"))
    source = nested_batches(1)  # on the CPU, which is the prefetcher's device here
    assert all(a is b for a, b in zip(DevicePrefetcher(source, CPU), source, strict=True))
    assert log == []  # no copy, no wait_stream, no record_stream


def test_the_cuda_path_copies_one_batch_ahead_and_waits_before_each_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    consumer = FakeStream(log, "main")

    @contextmanager
    def on_stream(stream: FakeStream) -> Iterator[None]:
        log.append(f"copy on {stream.name}")
        yield

    fake_cuda(monkeypatch, log, on_stream, consumer)
    monkeypatch.setattr(prefetch, "_resident", lambda batch, device: False)  # as from a loader
    source = nested_batches(1)

    def loader() -> Iterator[Any]:
        for i, batch in enumerate(source):
            log.append(f"load {i}")
            yield batch

    # The device stays the CPU, so the copies are no-ops and the structure is kept.
    prefetcher = DevicePrefetcher(loader(), CPU)
    for i, batch in enumerate(prefetcher):
        log.append(f"use {i}")
        assert_same(batch, source[i])
    assert log == [
        "load 0",
        "copy on side",
        "main waits for side",
        "load 1",
        "copy on side",
        "use 0",
        "main waits for side",
        "load 2",
        "copy on side",
        "use 1",
        "main waits for side",
        "use 2",
    ]


def pinned(value: Any) -> Any:
    """The batch with every tensor in page-locked memory (what ``pin_memory=True`` gives)."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {key: pinned(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(pinned(item) for item in value)
    return value


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_batches_arrive_on_the_device_with_equal_values() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    source = nested_batches()
    seen = 0
    prefetcher = DevicePrefetcher([pinned(b) for b in source], device)
    for batch, original in zip(prefetcher, source, strict=True):
        tensors = list(prefetch._tensors(batch))
        assert tensors and all(t.device == device for t in tensors)
        assert_same(batch, original)  # compared on the host: .cpu() waits for the copy
        seen += 1
    assert seen == len(source)
