"""The mixture-of-experts example: its factories follow core-train's contract, the routing
table says where each domain's (or class's) tokens go, and training teaches the router to
send each class to an expert of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.moe import (
    build_data,
    build_model,
    domain_sequences,
    format_table,
    purity,
    routing_by_domain,
    routing_tables,
)
from examples.moe.__main__ import show
from examples.moe.train import train_example
from tests.helpers import make_model


def test_the_factories_follow_the_cli_contract() -> None:
    train_loader, val_loader = build_data(batch_size=32, num_workers=0)
    assert (len(train_loader), len(val_loader)) == (64, 2)
    model = build_model(experts=6)
    tokens, _ = next(iter(train_loader))
    assert model(tokens).shape == (32, 8)
    assert [len(t[0]) for t in routing_tables(model, domain_sequences(64)).values()] == [6, 6]


def test_routing_tables_hold_shares_per_domain_and_per_class() -> None:
    torch.manual_seed(0)
    model, data = build_model(), domain_sequences(128, seed=3)
    by_domain = routing_by_domain(model, data)
    by_class = routing_by_domain(model, data, layer="blocks.0.moe", by="class")
    assert by_domain.shape == (4, 4) and by_class.shape == (8, 4)
    for table in (by_domain, by_class):
        assert torch.allclose(table.sum(dim=1), torch.ones(len(table)))
        assert 0.25 <= purity(table) <= 1.0
    assert purity(torch.eye(4)) == 1.0 and purity(torch.full((4, 4), 0.25)) == 0.25
    assert format_table(torch.eye(2), by="class").splitlines()[1:] == [
        "d0 few    100%    0%",
        "d0 many     0%  100%",
    ]
    assert model.training  # the mode is restored
    with pytest.raises(ValueError, match=r"'blocks\.9\.moe': not an MoE layer; allowed: blocks\.0"):
        routing_by_domain(model, data, layer="blocks.9.moe")
    with pytest.raises(ValueError, match=r"has no core\.moe\.MoELayer blocks"):
        routing_tables(make_model(), data)


@pytest.mark.slow
def test_training_teaches_the_router_to_send_each_class_to_one_expert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Untrained, the last layer's router spreads every class over the experts: its purity
    # (mean largest share over the 8 classes) is 0.36-0.44 over seeds 0-3. Trained, each
    # class's tokens (which carry their sequence's context there) go mostly to one expert:
    # 0.75-0.87 over the same seeds after 2-5 epochs. 0.7 and a 0.25 gain separate the two.
    report = train_example(epochs=2, log_dir=tmp_path, progress=False)
    before, after = report.purity("before"), report.purity("after")
    assert before < 0.5 and after >= 0.7 and after - before >= 0.25, (before, after)
    assert report.val_accuracy is not None and report.val_accuracy >= 0.9
    assert report.run_dir.parent == tmp_path / "moe"
    show(report)
    out = capsys.readouterr().out
    assert "blocks.1.moe after training: share of each class's tokens" in out
    assert f"by class  blocks.1.moe: {before:.2f} -> {after:.2f}" in out
