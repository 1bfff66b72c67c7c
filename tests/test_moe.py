"""Mixture of experts in one process: routing, capacity and dropping counted exactly, the
load-balancing loss against its formula, the layer against a hand computation, the loss
term the step adds, the step records, and the placement plan of seed 003."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from core import (
    ConfigError,
    MultiGPUConfig,
    create_mixed_precision_trainer,
    create_optimized_training_optimizer,
)
from core.distributed.distribution import Distribution, Machine
from core.moe import MoELayer, auxiliary_loss, load_balancing_loss, route
from core.moe.placement import DeviceDescription, ExpertCost, plan_placement
from core.reports.read import read_events
from examples.moe.data import domain_sequences, vocabulary
from examples.moe.model import MoETransformer

GIB = 2**30


def hand_logits() -> torch.Tensor:
    """6 tokens, 3 experts: first choices 0,0,0,1,1,2; second choices 1,2,1,0,2,0."""
    first, second = [0, 0, 0, 1, 1, 2], [1, 2, 1, 0, 2, 0]
    logits = torch.zeros(6, 3)
    for t, (a, b) in enumerate(zip(first, second, strict=True)):
        logits[t, a], logits[t, b] = 3.0, 2.0
    return logits


def test_capacity_and_dropping_are_counted_exactly_on_a_hand_made_routing() -> None:
    # capacity = ceil(0.5 * 6 tokens * 2 choices / 3 experts) = 2. First choices are served
    # first, in token order: expert 0 takes tokens 0 and 1 and drops token 2; experts 1 and
    # 2 take 3, 4 and 5. Of the second choices only token 1's (expert 2, one left) fits.
    routing = route(hand_logits(), top_k=2, capacity_factor=0.5)
    assert routing.capacity == 2
    assert routing.keep[:, 0].tolist() == [True, True, False, True, True, True]
    assert routing.keep[:, 1].tolist() == [False, True, False, False, False, False]
    assert routing.counts.tolist() == [2, 2, 2]
    assert int(routing.dropped) == 6
    unlimited = route(hand_logits(), top_k=2, capacity_factor=None)
    assert unlimited.keep.all() and unlimited.counts.tolist() == [5, 4, 3]
    assert int(unlimited.dropped) == 0
    # Weights renormalised over the two choices: e^3 / (e^3 + e^2) for the first.
    torch.testing.assert_close(routing.weights[:, 0], torch.full((6,), 1 / (1 + math.e**-1)))


def test_the_load_balancing_loss_equals_its_formula() -> None:
    # Every token prefers expert 0 with probabilities [4, 1, 1, 1] / 7: f = [1, 0, 0, 0],
    # P = [4/7, 1/7, 1/7, 1/7], so E * sum(f * P) = 4 * 4/7.
    logits = torch.tensor([[math.log(4.0), 0.0, 0.0, 0.0]]).repeat(5, 1)
    routing = route(logits, top_k=1, capacity_factor=None)
    torch.testing.assert_close(routing.aux_loss, torch.tensor(16 / 7))
    # Uniform routing: 1.0 whatever the choices.
    probs = torch.full((8, 4), 0.25)
    experts = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3], [0, 1], [2, 3], [0, 3], [1, 2]])
    torch.testing.assert_close(load_balancing_loss(probs, experts), torch.tensor(1.0))


def test_the_layer_sums_its_experts_weighted_and_a_dropped_choice_adds_nothing() -> None:
    torch.manual_seed(0)
    layer = MoELayer(8, 4, 16, top_k=2, capacity_factor=None)
    x = torch.randn(10, 8)
    routing = layer.router(x, None)
    expected = torch.stack(
        [
            sum(
                w * layer.experts.expert(int(e))(x[t])
                for e, w in zip(routing.experts[t], routing.weights[t], strict=True)
            )
            for t in range(10)
        ]
    )
    torch.testing.assert_close(layer(x), expected)
    layer.capacity_factor = 0.1  # capacity 1: most choices are dropped
    routing = layer.router(x, 0.1)
    out = layer(x)
    for t in range(10):
        kept = [
            w * layer.experts.expert(int(e))(x[t])
            for e, w, k in zip(routing.experts[t], routing.weights[t], routing.keep[t], strict=True)
            if k
        ]
        torch.testing.assert_close(out[t], sum(kept) if kept else torch.zeros(8))


def test_the_router_computes_in_fp32_under_autocast() -> None:
    torch.manual_seed(0)
    layer = MoELayer(8, 4, 16, top_k=1)
    x = torch.randn(32, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = layer.router.logits(x)
        inside = layer.router(x, None).experts
    assert logits.dtype == torch.float32
    assert torch.equal(inside, layer.router(x, None).experts)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"top_k=5.*at most num_experts=4"):
        MoELayer(8, 4, top_k=5)
    with pytest.raises(ConfigError, match="capacity_factor=0"):
        MoELayer(8, 4, capacity_factor=0)


def tiny_model() -> MoETransformer:
    torch.manual_seed(0)
    return MoETransformer(
        vocabulary(),
        8,
        seq_len=8,
        d_model=16,
        heads=2,
        layers=2,
        experts=4,
        top_k=2,
        capacity_factor=1.0,
    )


def test_the_step_adds_the_balancing_loss_as_a_hand_written_loop_does(tmp_path: Path) -> None:
    data = domain_sequences(16, seq_len=8)
    model = tiny_model()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(data, batch_size=16),
        max_epochs=1,
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        max_grad_norm=None,
        log_dir=tmp_path,
        progress=False,
    )
    anyio.run(optimizer.train)
    optimizer.close()
    hand = tiny_model()
    sgd = torch.optim.SGD(hand.parameters(), lr=1.0)
    x, y = data.tensors
    loss = F.cross_entropy(hand(x), y) + auxiliary_loss(hand)
    loss.backward()
    sgd.step()
    for (name, ours), theirs in zip(
        model.state_dict().items(), hand.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(ours, theirs, msg=name)
    without = tiny_model()
    F.cross_entropy(without(x), y).backward()  # the term matters: the router moves less
    assert not torch.allclose(
        without.blocks[0].moe.router.gates[0].grad, hand.blocks[0].moe.router.gates[0].grad
    )


def test_every_train_step_record_counts_the_experts_tokens(tmp_path: Path) -> None:
    optimizer = create_optimized_training_optimizer(
        model=tiny_model(),
        train_loader=DataLoader(domain_sequences(40, seq_len=8), batch_size=8),
        max_epochs=1,
        log_dir=tmp_path,
        progress=False,
        accumulation_steps=2,
    )
    results = anyio.run(optimizer.train)
    optimizer.close()
    steps = [r for r in read_events(results.run_dir / "events.jsonl") if r["event"] == "train_step"]
    assert len(steps) == 3  # windows of 2, 2 and 1 batches of 8 sequences of 8 tokens
    for record in steps:
        per_layer = record["moe_tokens_per_expert"]
        assert sorted(per_layer) == ["blocks.0.moe", "blocks.1.moe"]
        kept = sum(sum(counts) for counts in per_layer.values())
        assignments = 2 * record["samples"] * 8 * 2  # layers x tokens x top_k
        assert kept + record["moe_dropped_tokens"] == assignments
        assert record["moe_dropped_tokens"] > 0  # capacity factor 1.0 with uneven routing
        assert 1.0 <= record["moe_aux_loss"] < 4.0


def test_seed_002s_per_batch_step_adds_the_loss_term_and_returns_the_counts() -> None:
    model = tiny_model()
    trainer = create_mixed_precision_trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = domain_sequences(8, seq_len=8).tensors
    stats = trainer.train_step((x, y))
    kept = sum(sum(counts) for counts in stats["moe_tokens_per_expert"].values())
    assert kept + stats["moe_dropped_tokens"] == 2 * 8 * 8 * 2
    assert stats["moe_aux_loss"] >= 1.0


def test_the_placement_plan_follows_the_cost_model() -> None:
    big = DeviceDescription("cuda:0", "big", sm_count=100, free_memory_bytes=64 * GIB)
    small = DeviceDescription("cuda:1", "small", sm_count=50, free_memory_bytes=64 * GIB)
    full = DeviceDescription("cuda:2", "full", sm_count=200, free_memory_bytes=1)
    equal = [ExpertCost(f"moe.{i}", 1000, 0.5) for i in range(3)]
    plan = plan_placement(equal, [big, small, full])
    # 500 cost each: big (500/100) first; then big 1000/100 ties small 500/50 -> fewer
    # experts wins; then big 1000/100 < small 1000/50. "full" has no room for any.
    assert plan.assignment == {"moe.0": "cuda:0", "moe.1": "cuda:1", "moe.2": "cuda:0"}
    heavy = plan_placement(
        [ExpertCost("light", 10, 1.0), ExpertCost("heavy", 10_000, 1.0)], [small, big]
    )
    assert heavy.assignment["heavy"] == "cuda:0"  # the complex expert on the powerful GPU
    # A new expert: loads 1000/100 and 500/50 tie, so the device with fewer experts.
    assert plan.place_new("moe.3", 1000, 0.5) == "cuda:1"


def test_expert_parallel_in_one_process_records_the_plan_and_adds_experts_where_it_says() -> None:
    devices = (
        DeviceDescription("cuda:0", "A", sm_count=132, free_memory_bytes=80 * GIB),
        DeviceDescription("cuda:1", "B", sm_count=66, free_memory_bytes=80 * GIB),
    )
    trainer = Distribution(
        MultiGPUConfig(training_mode="expert_parallel"), machine=Machine(None, 0, devices=devices)
    )
    model = trainer.initialize_training(tiny_model())
    plan = trainer.strategy.describe()["expert_placement"]
    loads = {d["device"]: len(d["experts"]) for d in plan["devices"]}
    # 8 equal experts on SM counts 2 : 1: 5 : 3 finishes as early as 6 : 2 (ties go to
    # the device with fewer experts).
    assert loads == {"cuda:0": 5, "cuda:1": 3}
    layer = model.blocks[1].moe
    expert = layer.add_expert()
    assert plan_of(trainer)["blocks.1.moe.4"] == "cuda:0"  # least loaded: 5/132 < 3/66
    assert layer.num_experts == 5 and next(expert.parameters()).device.type == "cpu"  # no GPU
    assert layer(torch.randn(3, 16)).shape == (3, 16)
    with pytest.raises(ConfigError, match=r"needs a model with core\.moe\.MoELayer"):
        Distribution(
            MultiGPUConfig(training_mode="expert_parallel"), machine=Machine(None, 0)
        ).initialize_training(nn.Linear(2, 2))


def plan_of(trainer: Distribution) -> dict[str, str]:
    assignment: dict[str, str] = trainer.strategy.describe()["expert_placement"]["assignment"]
    return assignment
