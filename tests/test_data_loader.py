"""create_dataloader and LoaderConfig: the auto worker rule, validation messages, the same
samples in the same order with and without workers, reproducible worker seeding, pinned
memory on CUDA only."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, SequentialSampler, TensorDataset

from core.data import LoaderConfig, auto_num_workers, create_dataloader, usable_cores
from core.errors import ConfigError

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def images(n: int = 40) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 4, 4, generator=g), torch.arange(n))


def batches(loader: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


# -- the auto worker rule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "world_size", "device", "workers"),
    [
        (1, 1, CPU, 0),  # a single core: load in the training process
        (1, 1, CUDA, 0),
        (2, 1, CPU, 1),  # one core stays with the training process
        (2, 1, CUDA, 1),
        (4, 1, CPU, 2),  # CPU: half the share, the model needs the rest
        (4, 1, CUDA, 3),  # CUDA: all but one
        (16, 1, CPU, 4),  # capped at 4 on CPU...
        (16, 1, CUDA, 8),  # ...and 8 on CUDA
        (16, 2, CUDA, 7),  # two local ranks share the cores
        (16, 8, CUDA, 1),
        (16, 16, CUDA, 0),
        (3, 2, CPU, 0),
    ],
)
def test_auto_workers_follow_the_documented_rule(
    cores: int, world_size: int, device: torch.device, workers: int
) -> None:
    assert auto_num_workers(device, world_size=world_size, cores=cores) == workers


def test_auto_workers_count_the_cores_this_process_may_use() -> None:
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() == len(os.sched_getaffinity(0))
    assert auto_num_workers(CPU) == auto_num_workers(CPU, cores=usable_cores())


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_process_pinned_to_one_core_gets_no_workers() -> None:
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert usable_cores() == 1
        assert auto_num_workers(CUDA) == 0
        assert create_dataloader(images(), 8).num_workers == 0
    finally:
        os.sched_setaffinity(0, allowed)


def test_auto_workers_reject_a_bad_world_size() -> None:
    with pytest.raises(ConfigError, match=r"world_size=0 is invalid; allowed: an integer >= 1"):
        auto_num_workers(CPU, world_size=0)
    with pytest.raises(ConfigError, match=r"world_size=0 is invalid"):
        create_dataloader(images(), 8, world_size=0)


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"num_workers": -2}, r"num_workers=-2 is invalid; allowed: -1 \(auto\) or an integer"),
        ({"num_workers": 2.0}, r"num_workers=2\.0 is invalid"),
        ({"num_workers": True}, r"num_workers=True is invalid"),
        ({"prefetch_factor": 0}, r"prefetch_factor=0 is invalid; allowed: None"),
        ({"pin_memory": "yes"}, r"pin_memory='yes' is invalid; allowed: 'auto', True, False"),
        ({"device_prefetch": "on"}, r"device_prefetch='on' is invalid; .* Fix: pass"),
        ({"persistent_workers": "no"}, r"persistent_workers='no' is invalid"),
    ],
)
def test_a_bad_config_field_is_named_with_its_value(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LoaderConfig(**fields)


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"batch_size": 0}, r"batch_size=0 is invalid; allowed: an integer >= 1"),
        ({"batch_size": "32"}, r"batch_size='32' is invalid"),
        (
            {"shuffle": True, "sampler": SequentialSampler(range(40))},
            r"shuffle=True is invalid; allowed: False when a sampler is given.* Fix: drop",
        ),
        ({"shuffle": 1}, r"shuffle=1 is invalid; allowed: True, False"),
        ({"batch_sampler": [[0, 1]]}, r"batch_sampler=\[\[0, 1\]\] is invalid"),
        ({"config": {"num_workers": 2}}, r"config=\{'num_workers': 2\} is invalid"),
        ({"num_workers": -3}, r"num_workers=-3 is invalid"),  # a keyword overrides config
    ],
)
def test_bad_arguments_fail_before_a_loader_exists(arguments: dict[str, Any], match: str) -> None:
    batch_size = arguments.pop("batch_size", 8)
    with pytest.raises(ConfigError, match=match):
        create_dataloader(images(), batch_size, **arguments)


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


def test_an_iterable_dataset_sets_its_own_order_and_loads_in_process_by_default() -> None:
    with pytest.raises(ConfigError, match=r"shuffle=True is invalid; .*IterableDataset"):
        create_dataloader(Stream(), 4, shuffle=True)
    # Workers would each run the whole __iter__ (duplicates): auto stays in-process.
    loader = create_dataloader(Stream(), 4)
    assert loader.num_workers == 0
    assert torch.cat(list(loader)).tolist() == list(range(10))


# -- the config applied -----------------------------------------------------------------


def test_the_config_reaches_the_loader_and_worker_only_options_need_workers() -> None:
    loader = create_dataloader(
        images(), 8, config=LoaderConfig(num_workers=2, prefetch_factor=3, persistent_workers=False)
    )
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, False)
    assert create_dataloader(images(), 8, config=LoaderConfig(num_workers=1)).prefetch_factor == 2
    # Without workers, torch rejects both options: they are dropped, not passed on.
    inline = create_dataloader(images(), 8, config=LoaderConfig(num_workers=0, prefetch_factor=4))
    assert (inline.prefetch_factor, inline.persistent_workers) == (None, False)
    assert create_dataloader(images(), 8, num_workers=0).num_workers == 0  # keyword override


@pytest.mark.parametrize("pin_memory", ["auto", True])
def test_pinned_memory_stays_off_on_cpu_and_is_on_for_cuda(pin_memory: Any) -> None:
    config = LoaderConfig(num_workers=0, pin_memory=pin_memory)
    assert create_dataloader(images(), 8, config=config).pin_memory is False
    assert create_dataloader(images(), 8, device="cpu", config=config).pin_memory is False
    assert create_dataloader(images(), 8, device=CUDA, config=config).pin_memory is True
    off = LoaderConfig(num_workers=0, pin_memory=False)
    assert create_dataloader(images(), 8, device=CUDA, config=off).pin_memory is False


# -- same samples, same order -----------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_workers_yield_the_same_batches_in_the_same_order(shuffle: bool) -> None:
    def run(workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = create_dataloader(
            images(),
            6,
            shuffle=shuffle,
            generator=torch.Generator().manual_seed(7),
            config=LoaderConfig(num_workers=workers, persistent_workers=False),
        )
        return batches(loader)

    inline, parallel = run(0), run(2)
    assert [y.tolist() for _, y in parallel] == [y.tolist() for _, y in inline]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(inline, parallel, strict=True))
    order = torch.cat([y for _, y in inline]).tolist()
    assert (order == list(range(40))) is not shuffle
    assert sorted(order) == list(range(40))


# -- worker seeding ---------------------------------------------------------------------

_TAG = {"worker": -1}  # set in each worker process by the user's worker_init_fn


def tag_worker(worker_id: int) -> None:
    _TAG["worker"] = 100 + worker_id


class Draws(Dataset[tuple[float, float, float, int]]):
    """Each sample draws from Python's, NumPy's and torch's global generators."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[float, float, float, int]:
        return random.random(), float(np.random.rand()), float(torch.rand(())), _TAG["worker"]


def draws(seed: int) -> list[list[float]]:
    loader = create_dataloader(
        Draws(),
        1,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=tag_worker,
        config=LoaderConfig(num_workers=2, persistent_workers=False),
    )
    return [[float(v) for v in sample] for sample in loader]


def test_workers_seed_every_generator_reproducibly_and_differently() -> None:
    first, again, other = draws(0), draws(0), draws(1)
    assert first == again  # same loader seed: same draws from random, NumPy and torch
    assert first != other
    worker0, worker1 = first[0], first[1]  # batches alternate between the two workers
    assert all(a != b for a, b in zip(worker0[:3], worker1[:3], strict=True))
    assert [sample[3] for sample in first] == [100, 101, 100, 101]  # the user's init ran too
