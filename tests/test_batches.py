from __future__ import annotations

import pytest
import torch

from core import BatchFormatError
from core.data.batches import count_samples, split_batch, to_device


def test_count_samples_prefers_targets_and_handles_dicts() -> None:
    assert count_samples((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert count_samples(({"a": torch.zeros(4, 2)}, torch.zeros(4))) == 4
    assert count_samples({"ids": torch.zeros(6, 9), "mask": torch.ones(6, 9)}) == 6
    with pytest.raises(BatchFormatError, match="holds no tensor"):
        count_samples(("text", "label"))


def test_split_batch_keeps_order_and_shares_non_batch_values() -> None:
    x = torch.arange(10).reshape(10, 1)
    batch = ({"x": x, "scale": torch.tensor(2.0)}, torch.arange(10))
    parts = split_batch(batch, 4)
    assert [count_samples(p) for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat([p[0]["x"] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), torch.arange(10))
    assert all(p[0]["scale"] is batch[0]["scale"] for p in parts)
    assert split_batch(batch, 10) == [batch]


def test_to_device_keeps_structure() -> None:
    batch = {"a": [torch.zeros(1), (torch.ones(1), "keep")]}
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple)
    assert moved["a"][1][1] == "keep"
