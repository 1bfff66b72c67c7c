"""predict: per-batch outputs on the CPU, in loader order, as a hand-written loop gives them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core.distributed import Strategy
from core.errors import BatchFormatError
from core.loop.prediction import predict
from core.precision.plugins import FP32, Autocast
from tests.helpers import make_classification, make_model

CPU = Strategy(torch.device("cpu"))


def hand_loop(model: nn.Module, inputs: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in inputs]


def test_pairs_give_what_a_hand_loop_gives_in_loader_order() -> None:
    model = make_model().eval()
    loader = DataLoader(make_classification(40), batch_size=16)  # 16, 16, 8
    outputs = predict(model.train(), loader, precision=FP32(), strategy=CPU)
    expected = hand_loop(model.eval(), (x for x, _ in loader))
    assert [o.shape[0] for o in outputs] == [16, 16, 8]
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))
    assert not any(o.requires_grad for o in outputs)


def test_a_bare_tensor_loader_and_training_mode_restored() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    x = make_classification(20).tensors[0]
    loader = DataLoader(x, batch_size=8)  # yields bare tensors
    outputs = predict(model, loader, precision=FP32(), strategy=CPU)
    assert model.training  # restored
    assert all(
        torch.equal(a, b) for a, b in zip(outputs, hand_loop(model.eval(), loader), strict=True)
    )
    model.eval()
    predict(model, loader, precision=FP32(), strategy=CPU)
    assert not model.training  # restored to eval, too


class Output(NamedTuple):
    logits: torch.Tensor
    hidden: list[torch.Tensor]


@dataclass
class ModelOutput(OrderedDict[str, Any]):
    """Like Hugging Face's ModelOutput: a dict subclass whose keys are also attributes."""

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("logits", "loss"):
            if getattr(self, name) is not None:
                self[name] = getattr(self, name)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)


class KeywordModel(nn.Module):
    """Called with a mapping batch: ``model(tokens=..., labels=...)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> ModelOutput:
        logits = self.head(self.embed(tokens))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return ModelOutput(logits=logits, loss=loss)


def test_mapping_batches_call_the_model_with_keywords_and_keep_the_output_type() -> None:
    torch.manual_seed(0)
    model = KeywordModel()
    batches = [
        {"tokens": torch.randint(0, 10, (n, 5)), "labels": torch.randint(0, 3, (n, 5))}
        for n in (4, 3)
    ]
    outputs = predict(model, batches, precision=FP32(), strategy=CPU)
    for output, batch in zip(outputs, batches, strict=True):
        with torch.no_grad():
            expected = model(**batch)
        assert type(output) is ModelOutput and list(output) == ["logits", "loss"]
        assert output.logits is output["logits"]  # attributes follow the keys
        assert torch.equal(output.logits, expected.logits)
        assert torch.equal(output["loss"], expected.loss)


def test_nested_outputs_are_detached_and_keep_their_containers() -> None:
    class Tree(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> dict[str, Any]:
            y = self.linear(x)
            return {"out": Output(y, [y * 2, y * 3]), "n": 7}

    model = Tree()
    (output,) = predict(model, [(torch.ones(2, 3),)], precision=FP32(), strategy=CPU)
    assert output["n"] == 7 and isinstance(output["out"], Output)
    assert isinstance(output["out"].hidden, list)
    expected = model.linear(torch.ones(2, 3)).detach()
    assert torch.equal(output["out"].hidden[1], expected * 3)
    assert not output["out"].logits.requires_grad


def test_bf16_autocast_applies() -> None:
    model = make_model()
    (output,) = predict(
        model, [torch.randn(4, 8)], precision=Autocast(torch.bfloat16, "cpu"), strategy=CPU
    )
    assert output.dtype == torch.bfloat16


class PaddedShard(Strategy):
    """Stands in for a distributed strategy whose shard's last 3 samples are padding."""

    def eval_sample_limit(self, loader: Iterable[Any]) -> int | None:
        return 13


def test_samples_that_only_pad_a_shard_are_dropped() -> None:
    model = make_model()
    x = make_classification(20).tensors[0]
    loader = DataLoader(TensorDataset(x), batch_size=8)  # 8, 8, 4 -> keep 8, 5, none
    outputs = predict(model, loader, precision=FP32(), strategy=PaddedShard(torch.device("cpu")))
    assert [o.shape[0] for o in outputs] == [8, 5]
    expected = hand_loop(model, [x[:8], x[8:13]])
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))


def test_a_stop_request_ends_the_pass_with_the_outputs_so_far() -> None:
    stop = threading.Event()
    model = make_model()

    def batches() -> Iterable[torch.Tensor]:
        for i in range(5):
            if i == 2:
                stop.set()
            yield torch.randn(2, 8)

    outputs = predict(model, batches(), precision=FP32(), strategy=CPU, stop=stop)
    assert len(outputs) == 3


def test_a_batch_of_another_kind_is_a_batch_format_error() -> None:
    with pytest.raises(BatchFormatError, match=r"cannot predict on batch int: allowed: a tensor"):
        predict(make_model(), [3], precision=FP32(), strategy=CPU, prepare_batch=lambda b: b)
