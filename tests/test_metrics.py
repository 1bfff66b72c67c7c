"""core.metrics: each built-in against a hand computation, additive states, callables,
MetricSet on pair and dict batches, and the errors on bad arguments."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from core.metrics import (
    Accuracy,
    F1Score,
    MeanAbsoluteError,
    MeanOf,
    Metric,
    MetricSet,
    Perplexity,
    check_metrics,
    logits_of,
)


def value(metric: Metric, outputs: Any, targets: Any) -> float | None:
    metric.reset()
    metric.update(outputs, targets)
    return metric.compute(metric.state())


def one_hot_scores(predictions: list[int], classes: int) -> torch.Tensor:
    return nn.functional.one_hot(torch.tensor(predictions), classes).float()


# -- built-ins against hand computations ------------------------------------------------
SCORES = torch.tensor(
    [[0.1, 0.5, 0.3, 0.1], [0.7, 0.1, 0.1, 0.1], [0.2, 0.2, 0.5, 0.1], [0.1, 0.2, 0.3, 0.4]]
)
# ranks of each row's classes: row 0: 1, 2, 0|3; row 1: 0, ...; row 2: 2, 0|1; row 3: 3, 2, 1
TARGETS = torch.tensor([2, 0, 3, 1])


def test_top_k_accuracy_counts_targets_among_the_k_best_scores() -> None:
    assert value(Accuracy(), SCORES, TARGETS) == 1 / 4  # only row 1
    assert value(Accuracy(top_k=2), SCORES, TARGETS) == 2 / 4  # rows 0 and 1
    assert value(Accuracy(top_k=3), SCORES, TARGETS) == 3 / 4  # row 3's target ranks third
    assert value(Accuracy(top_k=4), SCORES, TARGETS) == 1.0


def test_accuracy_skips_ignored_targets_and_reads_class_dim_1_of_sequences() -> None:
    targets = torch.tensor([2, 0, -100, -100])
    assert value(Accuracy(), SCORES, targets) == 1 / 2
    assert value(Accuracy(ignore_index=None), SCORES, targets) == 1 / 4
    sequences = SCORES.T.reshape(1, 4, 4)  # (N=1, C=4, T=4): position t holds row t
    assert value(Accuracy(), sequences, TARGETS.reshape(1, 4)) == 1 / 4
    assert value(Accuracy(class_dim=-1), SCORES.reshape(1, 4, 4), TARGETS.reshape(1, 4)) == 1 / 4
    assert value(Accuracy(), SCORES, torch.full((4,), -100)) is None


def test_mean_absolute_error_is_the_mean_over_elements() -> None:
    outputs, targets = (
        torch.tensor([[1.0, 2.0], [3.0, 5.0]]),
        torch.tensor([[0.0, 2.0], [4.0, 1.0]]),
    )
    assert value(MeanAbsoluteError(), outputs, targets) == (1 + 0 + 1 + 4) / 4
    column = torch.tensor([[1.0], [-1.0], [0.5]])
    assert value(MeanAbsoluteError(), column, torch.tensor([0.0, 0.0, 0.0])) == 2.5 / 3


def hand_perplexity(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> float:
    """exp of the mean of -log softmax(logits)[label] over the labels that are not -100."""
    losses = []
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1] - shift):
            label = int(labels[b, t + shift])
            if label != -100:
                losses.append(-float(logits[b, t].log_softmax(-1)[label]))
    return math.exp(sum(losses) / len(losses))


@pytest.mark.parametrize("shift", [False, True])
def test_perplexity_is_exp_of_the_mean_token_cross_entropy(shift: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[0, 3:] = -100
    labels[1, 0] = -100
    got = value(Perplexity(shift=shift), logits, labels)
    assert got == pytest.approx(hand_perplexity(logits, labels, shift), rel=1e-6)
    shifted = value(Perplexity(), logits[:, :-1], labels[:, 1:])  # pre-shifted pairs
    assert value(Perplexity(shift=True), logits, labels) == pytest.approx(shifted, rel=1e-9)


def test_perplexity_honours_its_ignore_index_and_reads_bf16_logits() -> None:
    logits = torch.zeros(1, 3, 4)
    assert value(Perplexity(ignore_index=0), logits, torch.tensor([[0, 0, 3]])) == pytest.approx(4)
    assert value(Perplexity(), logits, torch.full((1, 3), -100)) is None
    bf16 = torch.randn(2, 3, 5).bfloat16()
    labels = torch.tensor([[1, 2, 3], [4, 0, 1]])
    assert value(Perplexity(), bf16, labels) == pytest.approx(
        hand_perplexity(bf16.float(), labels, False), rel=1e-6
    )


# predictions 0 1 2 2 1 0 2 against targets 0 2 2 1 1 0 0; the confusion matrix by hand:
# class 0: tp 2 (0, 5), fp 0, fn 1 (6)        -> F1 = 4 / 5
# class 1: tp 1 (4), fp 1 (1), fn 1 (3)       -> F1 = 2 / 4
# class 2: tp 1 (2), fp 2 (3, 6), fn 1 (1)    -> F1 = 2 / 5
PREDICTED, TRUE = [0, 1, 2, 2, 1, 0, 2], torch.tensor([0, 2, 2, 1, 1, 0, 0])


@pytest.mark.parametrize(
    ("classes", "average", "expected"),
    [
        (3, "macro", (4 / 5 + 2 / 4 + 2 / 5) / 3),
        (3, "micro", 2 * 4 / (2 * 4 + 3 + 3)),  # tp 4, fp 3, fn 3: the accuracy, 4 / 7
        (5, "macro", (4 / 5 + 2 / 4 + 2 / 5) / 3),  # classes 3 and 4 never occur: left out
    ],
)
def test_f1_matches_the_hand_computed_confusion_matrix(
    classes: int, average: Any, expected: float
) -> None:
    scores = one_hot_scores(PREDICTED, classes)
    assert value(F1Score(classes, average), scores, TRUE) == pytest.approx(expected)


def test_binary_f1_is_the_f1_of_class_1_and_skips_ignored_targets() -> None:
    # predictions 1 0 1 1 0 against 1 1 0 1 0: tp 2, fp 1, fn 1
    scores = one_hot_scores([1, 0, 1, 1, 0], 2)
    f1 = F1Score(num_classes=2, average="binary")
    assert value(f1, scores, torch.tensor([1, 1, 0, 1, 0])) == pytest.approx(4 / 6)
    assert value(f1, scores, torch.tensor([1, 1, -100, 1, 0])) == pytest.approx(4 / 5)
    assert value(f1, scores, torch.tensor([0, 0, 0, 0, 0])) == 0.0  # fp 3, no tp
    assert value(f1, one_hot_scores([0, 0], 2), torch.tensor([0, 0])) is None


# -- additive states --------------------------------------------------------------------
BUILT_INS = [
    lambda: Accuracy(top_k=2),
    lambda: F1Score(num_classes=4),
    lambda: F1Score(num_classes=4, average="micro"),
    lambda: MeanOf(lambda outputs, targets: (outputs.argmax(1) == targets).float()),
]


@pytest.mark.parametrize("make", BUILT_INS)
def test_two_halves_states_sum_to_the_whole_state(make: Any) -> None:
    generator = torch.Generator().manual_seed(1)
    scores, targets = torch.randn(10, 4, generator=generator), torch.randint(0, 4, (10,))
    whole, first, second = make(), make(), make()
    whole.update(scores, targets)
    first.update(scores[:6], targets[:6])
    second.update(scores[6:], targets[6:])
    summed = first.state() + second.state()
    assert torch.equal(summed, whole.state())
    assert whole.compute(summed) == whole.compute(whole.state())


def test_perplexity_and_mae_states_are_additive_over_batches() -> None:
    logits, labels = torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3))
    whole, halves = Perplexity(shift=True), Perplexity(shift=True)
    whole.update(logits, labels)
    halves.update(logits[:1], labels[:1])
    halves.update(logits[1:], labels[1:])
    assert torch.allclose(halves.state(), whole.state())
    mae = MeanAbsoluteError()
    mae.update(torch.ones(3), torch.zeros(3))
    mae.update(torch.ones(1), torch.full((1,), 5.0))
    assert mae.state().tolist() == [7.0, 4.0] and mae.compute(mae.state()) == 7 / 4


# -- callables --------------------------------------------------------------------------
def test_a_callable_is_a_sample_weighted_mean() -> None:
    batches = [
        (torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3)),
        (torch.tensor([8.0]), torch.zeros(1)),
    ]
    scalar = MeanOf(lambda outputs, targets: (outputs - targets).mean())
    per_sample = MeanOf(lambda outputs, targets: outputs - targets)
    number = MeanOf(lambda outputs, targets: float(outputs.sum()) / len(outputs))
    for metric in (scalar, per_sample, number):
        for outputs, targets in batches:
            metric.update(outputs, targets)
        assert metric.compute(metric.state()) == (1 + 2 + 3 + 8) / 4


def test_a_callable_of_the_wrong_shape_is_named_in_the_error() -> None:
    def pairs(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2, 2)

    with pytest.raises(ValueError, match=r"MeanOf\(pairs\) returned .* allowed: a scalar"):
        MeanOf(pairs).update(torch.zeros(3), torch.zeros(3))


# -- MetricSet --------------------------------------------------------------------------
class TinyBert(nn.Module):
    """Embedding, mean over tokens, a classifier head: Hugging Face's calling convention."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(20, 8), nn.Linear(8, classes)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids).mean(1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def test_metric_set_reads_logits_and_labels_of_dict_batches() -> None:
    model = TinyBert()
    batch = {"input_ids": torch.randint(0, 20, (6, 5)), "labels": torch.tensor([0, 1, 2, 2, 1, 0])}
    metrics = MetricSet(
        {
            "accuracy": Accuracy(),
            "f1": F1Score(num_classes=3, average="micro"),
            "hits": lambda logits, labels: logits.argmax(-1) == labels,
        }
    )
    metrics.reset()
    outputs = model(**batch)
    metrics.update(outputs, batch)
    hand = (outputs["logits"].argmax(-1) == batch["labels"]).double().mean().item()
    assert metrics.compute(metrics.state()) == {
        "accuracy": pytest.approx(hand),
        "f1": pytest.approx(hand),
        "hits": pytest.approx(hand),
    }
    assert metrics.names == ("accuracy", "f1", "hits") and metrics.size == 3 + 10 + 3


def test_dict_batches_put_classes_last_and_read_model_output_objects() -> None:
    scores = SCORES.reshape(1, 4, 4)  # (B=1, T=4, C=4): token classification
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": TARGETS.reshape(1, 4)}
    metrics = MetricSet({"accuracy": Accuracy(top_k=2)})
    metrics.update(SimpleNamespace(logits=scores, loss=torch.tensor(0.0)), batch)
    assert metrics.compute(metrics.state()) == {"accuracy": 2 / 4}
    assert logits_of(torch.tensor(1.0)) is None and logits_of({"loss": 1}) is None


def test_a_metric_that_does_not_apply_to_one_batch_is_none() -> None:
    def make() -> MetricSet:
        return MetricSet({"accuracy": Accuracy(), "first": lambda outputs, targets: outputs[:, 0]})

    metrics, other_rank = make(), make()
    metrics.update(SCORES, (None, TARGETS))
    metrics.update({"loss": torch.tensor(0.0)}, {"input_ids": torch.zeros(2, 3)})  # no labels
    other_rank.update(SCORES, (None, TARGETS))
    assert metrics.compute(metrics.state() + other_rank.state()) == {
        "accuracy": None,
        "first": None,
    }
    assert other_rank.compute(other_rank.state()) == {
        "accuracy": 1 / 4,
        "first": pytest.approx(0.275),
    }
    metrics.reset()
    assert metrics.compute(metrics.state()) == {"accuracy": None, "first": None}  # nothing yet


def test_builtins_name_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"Accuracy\(top_k=1.*targets Tensor\(shape=\(3,\)"):
        Accuracy().update(SCORES, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="top_k <= 4"):
        Accuracy(top_k=5).update(SCORES, TARGETS)
    with pytest.raises(ValueError, match=r"F1Score\(num_classes=3"):
        F1Score(num_classes=3).update(SCORES, TARGETS)
    with pytest.raises(ValueError, match=r"convert targets with \.long"):
        Accuracy().update(SCORES, TARGETS.float())
    with pytest.raises(ValueError, match="vocabulary last"):
        Perplexity().update(torch.zeros(2, 5, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="MeanAbsoluteError"):
        MeanAbsoluteError().update(torch.zeros(3, 2), torch.zeros(3))


# -- bad arguments ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("metrics", "match"),
    [
        (
            [Accuracy()],
            r"metrics=\[Accuracy\(top_k=1, ignore_index=-100\)\] is invalid.*Fix: e\.g\.",
        ),
        ({"top 5": Accuracy()}, r"metrics='top 5' is invalid; allowed: names"),
        ({1: Accuracy()}, "metrics=1 is invalid"),
        ({"acc": Accuracy}, r"metrics\['acc'\]=.* pass an instance: metrics=\{'acc': Accuracy"),
        ({"acc": 0.5}, r"metrics\['acc'\]=0.5 is invalid; allowed: a Metric instance"),
        ({"a": (shared := Accuracy()), "b": shared}, r"metrics\['b'\]=.* also given as 'a'"),
    ],
)
def test_bad_metrics_raise_config_errors_naming_the_field(metrics: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_metrics(metrics)
    with pytest.raises(ConfigError, match="metrics"):
        MetricSet(metrics)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Accuracy(top_k=0), "top_k=0 is invalid"),
        (lambda: Accuracy(ignore_index=1.5), "ignore_index=1.5 is invalid"),
        (lambda: Accuracy(class_dim="last"), "class_dim='last' is invalid"),
        (lambda: F1Score(num_classes=1), "num_classes=1 is invalid"),
        (lambda: F1Score(num_classes=3, average="weighted"), "average='weighted' is invalid"),
        (lambda: F1Score(num_classes=3, average="binary"), "num_classes=3 is invalid; allowed: 2"),
        (lambda: Perplexity(ignore_index=None), "ignore_index=None is invalid"),
        (lambda: Perplexity(shift="yes"), "shift='yes' is invalid"),
    ],
)
def test_constructors_validate_their_arguments(make: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_updates_on_cuda_never_wait_for_the_device() -> None:
    cuda = torch.device("cuda")
    metrics = MetricSet(
        {
            "accuracy": Accuracy(top_k=2),
            "f1": F1Score(num_classes=4),
            "perplexity": Perplexity(shift=True),
            "mean": lambda logits, labels: logits.mean(),
        }
    )
    mae, pairs = MeanAbsoluteError(), MetricSet({"accuracy": Accuracy(ignore_index=None)})
    logits, labels = torch.randn(8, 6, 4, device=cuda), torch.randint(0, 4, (8, 6), device=cuda)
    for metric in (metrics, mae, pairs):
        metric.reset(cuda)
    torch.cuda.synchronize()  # set-up done: from here on nothing may wait for the GPU
    torch.cuda.set_sync_debug_mode("error")
    try:
        metrics.update({"logits": logits}, {"labels": labels})
        pairs.update(logits.transpose(1, 2), (None, labels))
        mae.update(logits[..., 0], labels.float())
        states = [metrics.state(), pairs.state(), mae.state()]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(state.device.type == "cuda" for state in states)
    assert metrics.compute(states[0].cpu())["accuracy"] == pytest.approx(
        value(Accuracy(top_k=2, class_dim=-1), logits.cpu(), labels.cpu())
    )
