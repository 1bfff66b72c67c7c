"""CachedDataset: samples equal to applying the transforms directly, cache_transform run once
per index however many epochs (counted, not timed), workers starting from a warmed cache, and
the memory the cache reports."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from core.data import CachedDataset, LoaderConfig, create_dataloader
from core.errors import ConfigError

N = 12


def raw_images(n: int = N) -> TensorDataset:
    """Samples as a loader reads them: (uint8 image, label)."""
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8), torch.arange(n)
    )


class Decode:
    """The deterministic part ("decode + resize"): counts its calls, across processes too."""

    def __init__(self) -> None:
        self.calls = multiprocessing.get_context("fork").Value("i", 0)

    def __call__(self, sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        with self.calls.get_lock():
            self.calls.value += 1
        image, label = sample
        small = torch.nn.functional.avg_pool2d(image.float().unsqueeze(0) / 255, 2)[0]
        return small, label

    @property
    def count(self) -> int:
        return int(self.calls.value)


def flip(sample: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, Any]:
    image, label = sample
    return image.flip(-1), label


def noisy(sample: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, Any]:
    image, label = sample
    return image + 0.1 * torch.randn_like(image), label


def direct(base: TensorDataset, augment: Any) -> list[tuple[torch.Tensor, Any]]:
    decode = Decode()
    return [augment(decode(base[i])) for i in range(len(base))]


def assert_samples_equal(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b, strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)


def test_samples_equal_the_transforms_applied_directly_with_a_deterministic_augment() -> None:
    base = raw_images()
    data = CachedDataset(base, cache_transform=Decode(), augment=flip)
    for _ in range(2):  # the first epoch fills the cache, the second reads it
        assert_samples_equal([data[i] for i in range(N)], direct(base, flip))


def test_a_random_augment_runs_on_every_access_under_the_same_seed() -> None:
    base = raw_images()
    data = CachedDataset(base, cache_transform=Decode(), augment=noisy)
    torch.manual_seed(0)
    epoch1 = [data[i] for i in range(N)]
    epoch2 = [data[i] for i in range(N)]
    torch.manual_seed(0)
    expected1, expected2 = direct(base, noisy), direct(base, noisy)
    assert_samples_equal(epoch1, expected1)
    assert_samples_equal(epoch2, expected2)  # cached epoch: same draws as recomputing
    assert not torch.equal(epoch1[0][0], epoch2[0][0])  # a new augmentation each epoch


def test_cache_transform_runs_once_per_index_across_two_shuffled_epochs() -> None:
    decode = Decode()
    data = CachedDataset(raw_images(), cache_transform=decode, augment=flip)
    loader = DataLoader(data, batch_size=5, shuffle=True)
    labels = [torch.cat([y for _, y in loader]).tolist() for _ in range(2)]
    assert sorted(labels[0]) == sorted(labels[1]) == list(range(N))
    assert decode.count == N and data.cached == N


def test_the_saving_counted_in_calls_of_a_slow_cache_transform() -> None:
    """Three epochs: N calls of the slow transform with the cache, 3N without."""

    class Uncached(Dataset[Any]):
        def __init__(self, decode: Decode) -> None:
            self.base, self.decode = raw_images(), decode

        def __len__(self) -> int:
            return len(self.base)

        def __getitem__(self, index: int) -> Any:
            return flip(self.decode(self.base[index]))

    slow_plain, slow_cached = Decode(), Decode()
    plain = Uncached(slow_plain)
    cached = CachedDataset(raw_images(), cache_transform=slow_cached, augment=flip)
    for _ in range(3):
        assert_samples_equal([cached[i] for i in range(N)], [plain[i] for i in range(N)])
    assert (slow_plain.count, slow_cached.count) == (3 * N, N)


def test_workers_start_from_a_cache_warmed_in_the_training_process() -> None:
    decode = Decode()
    data = CachedDataset(raw_images(), cache_transform=decode, augment=flip).warm()
    assert decode.count == N
    config = LoaderConfig(num_workers=2, persistent_workers=False)
    for _ in range(2):
        labels = torch.cat([y for _, y in create_dataloader(data, 4, config=config)])
        assert labels.tolist() == list(range(N))
    assert decode.count == N  # no worker ran cache_transform


def test_a_cold_cache_is_filled_by_each_worker_for_itself() -> None:
    decode = Decode()
    data = CachedDataset(raw_images(), cache_transform=decode)
    config = LoaderConfig(num_workers=2, persistent_workers=False)
    for _ in range(2):
        list(create_dataloader(data, 4, config=config))
    # The workers' copies died with them: every epoch paid again, and this process has none.
    assert (decode.count, data.cached) == (2 * N, 0)


def test_eager_filling_indexing_and_clearing() -> None:
    decode = Decode()
    data = CachedDataset(raw_images(), cache_transform=decode, eager=True)
    assert (decode.count, data.cached, len(data)) == (N, N, N)
    assert data.warm() is data and decode.count == N  # nothing left to fill
    assert torch.equal(data[-1][0], data[N - 1][0]) and decode.count == N  # one entry
    with pytest.raises(IndexError, match=f"index {N} is out of range for a dataset of {N}"):
        data[N]
    data.clear()
    assert data.cached == 0
    data[0]
    assert decode.count == N + 1


def test_nbytes_counts_the_cached_tensors_once_each() -> None:
    data = CachedDataset(raw_images(), cache_transform=Decode())
    assert data.nbytes() == 0
    data.warm()
    # float32 3x8x8 images and int64 labels (TensorDataset labels are views of one storage,
    # but Decode keeps them as they come: one storage of N int64 for all labels).
    assert data.nbytes() == N * 3 * 8 * 8 * 4 + N * 8
    whole = torch.zeros(N, 4)
    views = CachedDataset(TensorDataset(whole), eager=True)
    assert views.nbytes() == whole.numel() * 4  # N views of one storage: counted once


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigError, match=r"dataset=.* is invalid; allowed: a map-style dataset"):
        CachedDataset(Stream())
    with pytest.raises(ConfigError, match=r"augment=3 is invalid; allowed: a callable"):
        CachedDataset(raw_images(), augment=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"eager='yes' is invalid"):
        CachedDataset(raw_images(), eager="yes")  # type: ignore[arg-type]
