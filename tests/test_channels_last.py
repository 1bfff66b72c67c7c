"""channels_last: when it applies, the model's and the batches' conversion, and unchanged
outputs and gradients."""

from __future__ import annotations

import copy
from typing import NamedTuple

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from core.transforms import (
    ModelTransformsConfig,
    apply_channels_last,
    channels_last_batch,
    has_conv2d,
    wants_channels_last,
)

CL = torch.channels_last


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


class Pair(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor


def test_the_model_weights_are_converted() -> None:
    model = conv_net()
    convs = [p for p in model.parameters() if p.ndim == 4]
    assert len(convs) == 2 and not any(p.is_contiguous(memory_format=CL) for p in convs)
    apply_channels_last(model)
    assert all(p.is_contiguous(memory_format=CL) for p in convs)


def test_batches_convert_their_image_tensors_only() -> None:
    images, labels = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    pair = channels_last_batch((images, labels))
    assert type(pair) is tuple and pair[0].is_contiguous(memory_format=CL)
    assert pair[1] is labels and torch.equal(pair[0], images)

    token_ids, sequence = torch.zeros(2, 3, 4, 5, dtype=torch.long), torch.randn(2, 3, 4)
    nested = {"x": [images, token_ids], "seq": sequence, "name": "a"}
    out = channels_last_batch(nested)
    assert out["x"][0].is_contiguous(memory_format=CL)
    assert out["x"][1] is token_ids and out["seq"] is sequence and out["name"] == "a"

    named = channels_last_batch(Pair(images, labels))
    assert isinstance(named, Pair) and named.images.is_contiguous(memory_format=CL)


def test_outputs_and_gradients_equal_the_contiguous_models() -> None:
    plain = conv_net()
    converted = copy.deepcopy(plain)
    apply_channels_last(converted)
    images, labels = torch.randn(4, 3, 10, 10), torch.tensor([0, 1, 2, 3])
    results = []
    batches = ((images, labels), channels_last_batch((images, labels)))
    for model, batch in zip((plain, converted), batches, strict=True):
        logits = model(batch[0])
        nn.functional.cross_entropy(logits, batch[1]).backward()
        results.append((logits, [p.grad for p in model.parameters()]))
    (expected, expected_grads), (got, got_grads) = results
    assert torch.allclose(got, expected, atol=1e-5)
    for a, b in zip(got_grads, expected_grads, strict=True):
        assert a is not None and b is not None and torch.allclose(a, b, atol=1e-5)


def test_auto_is_on_for_conv_models_on_cuda_only_and_flags_force() -> None:
    conv, mlp = conv_net(), nn.Sequential(nn.Linear(4, 4))
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert has_conv2d(conv) and not has_conv2d(mlp)
    assert not wants_channels_last("auto", conv, cpu)
    assert wants_channels_last("auto", conv, cuda) and not wants_channels_last("auto", mlp, cuda)
    assert wants_channels_last(True, mlp, cpu) and not wants_channels_last(False, conv, cuda)


def test_the_config_field_takes_auto_or_a_flag() -> None:
    assert ModelTransformsConfig().channels_last == "auto"
    with pytest.raises(ConfigError, match=r"^channels_last='on' is invalid; allowed: 'auto'"):
        ModelTransformsConfig(channels_last="on")  # type: ignore[arg-type]
