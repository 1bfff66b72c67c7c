"""``core.trainer.process.shared`` and ``handback``: objects cross through one block of shared
memory (the structure pickled, no tensor data), and the trained weights come back the same way."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

from core import ConfigError, create_optimized_training_optimizer
from core.trainer.process import shared
from core.trainer.process.handback import HandBack
from core.trainer.process.shared import pack, structure_of
from tests import isolation_parts as parts


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 1000, bias=False)
        self.head.weight = self.embedding.weight  # one storage, two names
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.transposed = nn.Parameter(torch.randn(32, 16).t())  # a strided view

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embedding(tokens))
        return out


def trained_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.arange(8)).sum().backward()
    optimizer.step()
    return optimizer


def test_objects_cross_as_views_of_one_block_with_their_sharing_kept() -> None:
    model = Tied()
    optimizer = trained_optimizer(model)
    packed = pack({"model": model, "optimizer": optimizer}, model)
    weights = sum(t.nbytes for t in model.state_dict().values())
    assert len(packed.structure) < weights / 20  # the structure, not the tensor bytes
    crossed = packed.unpack()
    twin, twin_optimizer = crossed["model"], crossed["optimizer"]
    assert twin.head.weight is twin.embedding.weight
    held = twin_optimizer.param_groups[0]["params"]
    assert [id(p) for p in held] == [id(p) for p in twin.parameters()]
    assert twin.transposed.stride() == model.transposed.stride()
    for name, value in model.state_dict().items():
        assert torch.equal(twin.state_dict()[name], value), name
    ours, theirs = optimizer.state_dict()["state"], twin_optimizer.state_dict()["state"]
    assert all(torch.equal(ours[i][k], theirs[i][k]) for i in ours for k in ours[i])
    with torch.no_grad():
        twin.embedding.weight.add_(1.0)  # the other side trains on its own copy...
    assert not torch.equal(twin.embedding.weight, model.embedding.weight)
    slot = packed.model["embedding.weight"].view(packed.block)
    assert torch.equal(slot, twin.embedding.weight)  # ...which is the shared block


def test_a_private_copy_leaves_the_block_alone() -> None:
    model = Tied()
    packed = pack({"model": model}, model)
    private = packed.unpack(private=True)["model"]
    with torch.no_grad():
        private.embedding.weight.zero_()
    assert torch.equal(packed.model["embedding.weight"].view(packed.block), model.embedding.weight)


def test_the_trained_weights_come_back_into_the_given_model_in_place() -> None:
    given = Tied()
    packed = pack({"model": given}, given)
    trained = packed.unpack()["model"]
    trained_optimizer(trained)
    parameter = given.embedding.weight
    assert HandBack(packed).write(trained.state_dict())  # nothing to copy: trained in place
    HandBack(packed).load_into(given)
    assert given.embedding.weight is parameter
    for name, value in trained.state_dict().items():
        assert torch.equal(given.state_dict()[name], value), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_REMOVE is Linux's")
def test_released_memory_goes_back_to_the_system_and_the_given_model_keeps_its_weights() -> None:
    """The block's pages are freed by ``release`` itself (off the event loop, the lock
    released), not later by the deallocation that holds the lock: shared memory read after
    it is the kernel's fresh zero pages."""
    given = Tied()
    packed = pack({"model": given}, given)
    trained = packed.unpack()["model"]
    before = given.embedding.weight.detach().clone()
    assert torch.equal(trained.embedding.weight, before) and before.abs().sum() > 0
    packed.release()
    assert trained.embedding.weight.abs().sum() == 0  # its pages are gone
    assert torch.equal(given.embedding.weight, before)  # the caller's own memory is untouched


def test_a_model_built_elsewhere_comes_back_through_ranges_of_its_own() -> None:
    given = parts.make_model()
    packed = pack({"names": "tests.isolation_parts:make_model"}, given)  # the model not pickled
    elsewhere = parts.make_model()
    with torch.no_grad():
        for p in elsewhere.parameters():
            p.mul_(3.0)
    wrapped = {f"_orig_mod.{k}": v for k, v in elsewhere.state_dict().items()}
    assert HandBack(packed).write(wrapped)  # wrapper prefixes are not names of their own
    HandBack(packed).load_into(given)
    assert all(torch.equal(given.state_dict()[k], v) for k, v in elsewhere.state_dict().items())
    assert not HandBack(packed).write(nn.Linear(8, 3).state_dict())  # does not fit: a checkpoint


def test_the_check_reports_classes_of_an_unimportable_main(monkeypatch: pytest.MonkeyPatch) -> None:
    class Net(nn.Linear):
        pass

    Net.__module__, Net.__qualname__ = "__main__", "Net"
    assert structure_of(parts.make_model()) == []
    monkeypatch.setattr(shared, "main_is_importable", lambda: False)
    assert structure_of(Net(8, 2)) == ["Net"]
    settings: dict[str, Any] = {"train_loader": parts.make_loader(), "isolation": "process"}
    with pytest.raises(
        ConfigError,
        match=r"model=Net\(.*needs Net, defined in __main__.*Fix: "
        r"move Net into a module",
    ):
        create_optimized_training_optimizer(model=Net(8, 2), **settings)


def test_portable_objects_keep_their_sharing_and_their_bytes_travel_beside_the_pickle() -> None:
    """The form that crosses to a Ray actor: numpy arrays beside a pickle of the structure,
    unpacked into storages of their own (the object store's buffers are read-only)."""
    pytest.importorskip("numpy")
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    crossed = shared.portable({"model": model, "optimizer": optimizer})
    assert sum(p.numel() * 4 for p in model.parameters()) == crossed.tensor_bytes
    assert all(not isinstance(b, bytes) for b in crossed.buffers)  # arrays, not in the pickle
    assert len(crossed.structure) < crossed.tensor_bytes / 20  # the structure only
    there = crossed.unpack()
    parameters = list(there["model"].parameters())
    assert there["optimizer"].param_groups[0]["params"][0] is parameters[0]  # still shared
    for mine, theirs in zip(parameters, model.parameters(), strict=True):
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr()
    with torch.no_grad():
        parameters[0].add_(1.0)  # writable, and the given model is left alone
    assert not torch.equal(parameters[0], next(model.parameters()))
