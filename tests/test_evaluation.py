"""evaluate() with metrics on real tiny models: the numbers of a hand loop, one all-reduce,
the padding trim, dict batches (Hugging Face style) and their accuracy."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core.distributed import Strategy
from core.loop.evaluation import evaluate
from core.loop.objective import DefaultObjective, Objective
from core.loop.recovery import ErrorHandler
from core.metrics import Accuracy, F1Score, MeanAbsoluteError, MetricSet, Perplexity
from core.precision.plugins import FP32
from tests.helpers import make_model

CPU = torch.device("cpu")


class CountingStrategy(Strategy):
    """One process on the CPU that counts its all-reduces and, like a sharded loader's
    padding, may declare only the first ``limit`` samples real."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(CPU)
        self.limit, self.reduces = limit, 0

    def eval_sample_limit(self, loader: Any) -> int | None:
        return self.limit

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        self.reduces += 1
        return super().all_reduce_sum(tensor)


def run(model: nn.Module, loader: Any, strategy: Strategy, **kwargs: Any) -> Any:
    return evaluate(
        model,
        loader,
        epoch=0,
        stop=threading.Event(),
        precision=FP32(),
        strategy=strategy,
        objective=kwargs.pop("objective", DefaultObjective()),
        errors=ErrorHandler(),
        **kwargs,
    )


def three_classes(n: int = 50) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 8, generator=generator)
    return TensorDataset(x, torch.randint(0, 3, (n,), generator=generator))


def hand_metrics(model: nn.Module, data: TensorDataset, n: int) -> dict[str, float]:
    """The same numbers from every sample at once, by plain tensor arithmetic."""
    x, y = data.tensors[0][:n], data.tensors[1][:n]
    with torch.no_grad():
        logits = model(x)
    predicted = logits.argmax(1)
    top2 = (logits.topk(2, 1).indices == y[:, None]).any(1)
    f1s = []
    for c in range(3):
        tp = int(((predicted == c) & (y == c)).sum())
        fp, fn = int(((predicted == c) & (y != c)).sum()), int(((predicted != c) & (y == c)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return {
        "loss": float(nn.functional.cross_entropy(logits, y)),
        "accuracy": float((predicted == y).double().mean()),
        "top2": float(top2.double().mean()),
        "f1": sum(f1s) / 3,
        "confidence": float(logits.softmax(1).amax(1).double().mean()),
    }


def metric_set() -> MetricSet:
    return MetricSet(
        {
            "top2": Accuracy(top_k=2),
            "f1": F1Score(num_classes=3),
            "confidence": lambda logits, targets: logits.softmax(1).amax(1),
        }
    )


@pytest.mark.parametrize("limit", [None, 37])
def test_metrics_equal_a_hand_loop_with_one_all_reduce(limit: int | None) -> None:
    data, model = three_classes(), make_model(classes=3)
    strategy = CountingStrategy(limit)
    stats = run(model, DataLoader(data, batch_size=8), strategy, metrics=metric_set())
    hand = hand_metrics(model, data, limit or 50)
    assert strategy.reduces == 1
    assert stats.samples == (limit or 50)
    assert stats.loss == pytest.approx(hand["loss"], rel=1e-6)
    assert stats.accuracy == pytest.approx(hand["accuracy"])
    assert stats.metrics == {
        "top2": pytest.approx(hand["top2"]),
        "f1": pytest.approx(hand["f1"]),
        "confidence": pytest.approx(hand["confidence"], rel=1e-6),
    }


def test_metrics_restart_at_every_evaluation_and_default_to_none() -> None:
    data, model = three_classes(), make_model(classes=3)
    metrics = metric_set()
    first = run(model, DataLoader(data, batch_size=16), Strategy(CPU), metrics=metrics)
    again = run(model, DataLoader(data, batch_size=16), Strategy(CPU), metrics=metrics)
    assert again.metrics == first.metrics
    assert run(model, DataLoader(data, batch_size=16), Strategy(CPU)).metrics == {}


def test_a_stopped_evaluation_reports_the_batches_it_saw() -> None:
    data, model = three_classes(), make_model(classes=3)
    stop = threading.Event()
    stop.set()
    stats = evaluate(
        model,
        DataLoader(data, batch_size=10),
        epoch=0,
        stop=stop,
        precision=FP32(),
        strategy=Strategy(CPU),
        objective=DefaultObjective(),
        errors=ErrorHandler(),
        metrics=metric_set(),
    )
    assert stats.interrupted and stats.samples == 10
    assert stats.metrics["top2"] == pytest.approx(
        hand_metrics(model, TensorDataset(*(t[:10] for t in data.tensors)), 10)["top2"]
    )


class TinyBert(nn.Module):
    """A sequence classifier called the Hugging Face way: ``model(input_ids=, labels=)``
    returning ``{"loss", "logits"}``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(30, 16), nn.Linear(16, 4)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def dict_batches() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    batches = []
    for size in (8, 8, 5):
        batch = {"input_ids": torch.randint(0, 30, (size, 6), generator=generator)}
        batch["labels"] = torch.randint(0, 4, (size,), generator=generator)
        batches.append(batch)
    return batches


def test_dict_batches_report_accuracy_and_metrics_of_the_logits() -> None:
    model, batches = TinyBert(), dict_batches()
    stats = run(
        model,
        batches,
        Strategy(CPU),
        metrics=MetricSet({"f1": F1Score(num_classes=4, average="micro")}),
    )
    with torch.no_grad():
        hits = [model(**b)["logits"].argmax(-1) == b["labels"] for b in batches]
    hand = float(torch.cat(hits).double().mean())
    assert stats.accuracy is not None
    assert stats.accuracy == pytest.approx(hand)
    assert stats.metrics == {"f1": pytest.approx(hand)}  # micro F1 of one label each


class NoLabelsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(features)
        return {"loss": logits.logsumexp(-1).mean(), "logits": logits}


def test_dict_batches_without_labels_have_no_accuracy_or_metrics() -> None:
    batches = [{"features": torch.randn(3, 4)}, {"features": torch.randn(2, 4)}]
    metrics = MetricSet({"accuracy": Accuracy(), "mae": MeanAbsoluteError()})
    stats = run(NoLabelsModel(), batches, Strategy(CPU), metrics=metrics)
    assert stats.samples == 5 and stats.accuracy is None
    assert stats.metrics == {"accuracy": None, "mae": None}


def test_token_labels_skip_padding_and_causal_lm_outputs_are_left_out() -> None:
    logits = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]])  # (B=1, T=3, C=2)
    batch = {"input_ids": torch.zeros(1, 3), "labels": torch.tensor([[0, 0, -100]])}
    correct = Objective(nn.CrossEntropyLoss()).correct({"logits": logits}, batch)
    assert correct is not None and [int(t) for t in correct] == [1, 2]

    class CausalLMOutputWithPast(dict[str, Any]):
        """Stands in for Hugging Face's causal LM output: the model shifts the labels."""

    causal = CausalLMOutputWithPast(logits=logits, loss=torch.tensor(0.0))
    assert Objective(nn.CrossEntropyLoss()).correct(causal, batch) is None
    perplexity = MetricSet({"perplexity": Perplexity(shift=True)})
    perplexity.update(causal, batch)  # scores position 0 against label 1 only
    expected = float(torch.exp(-logits[0, 0].log_softmax(-1)[0]))
    assert perplexity.compute(perplexity.state())["perplexity"] == pytest.approx(expected)


def test_pair_batch_accuracy_is_unchanged() -> None:
    outputs, targets = (
        torch.tensor([[0.2, 0.8], [0.7, 0.3], [0.4, 0.6]]),
        torch.tensor([1, 1, -100]),
    )
    plain = Objective(nn.MSELoss()).correct(outputs, (None, targets))
    ignoring = DefaultObjective().correct(outputs, (None, targets))
    assert plain is not None and [int(t) for t in plain] == [1, 3]
    assert ignoring is not None and [int(t) for t in ignoring] == [1, 2]
    assert DefaultObjective().correct(outputs, (None, targets.float())) is None
    assert DefaultObjective().correct({"logits": outputs}, (None, targets)) is None
