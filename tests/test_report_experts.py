"""The expert figures and the summary's Experts section: a real one-process MoE run on CPU
(its reports written in a child process, as at the end of every run), hand-built records of
a torchrun job, a long run with many layers, and odd content."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from core import MultiGPUConfig, create_optimized_training_optimizer
from core.reports import REPORT_FILES, format_performance_summary, read_events
from core.reports.apart import write_reports_apart
from core.reports.expert_devices import device_figure
from core.reports.expert_plots import (
    activations_figure,
    write_expert_activations,
    write_expert_device_distribution,
)
from examples.moe.data import domain_sequences, vocabulary
from examples.moe.model import MoETransformer

LAYERS, EXPERTS, TOP_K, SEQ, BATCH = 2, 4, 2, 8, 8


@pytest.fixture(scope="module")
def moe_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """events.jsonl of a real one-process expert_parallel run: 6 steps, capacity 1.0 (so
    some assignments are dropped), reports left to the tests."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MoETransformer(
        vocabulary(),
        8,
        seq_len=SEQ,
        d_model=16,
        heads=2,
        layers=LAYERS,
        experts=EXPERTS,
        top_k=TOP_K,
        capacity_factor=1.0,
    )
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(domain_sequences(48, seq_len=SEQ), batch_size=BATCH),
        max_epochs=1,
        log_dir=tmp_path_factory.mktemp("logs"),
        seed=0,
        progress=False,
        reports=False,
        multi_gpu_config=MultiGPUConfig(training_mode="expert_parallel"),
    )
    results = anyio.run(optimizer.train)
    return Path(results.run_dir) / "events.jsonl"


def moe_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "train_step"]


def section(text: str) -> str:
    return text.split("== Experts ==\n", 1)[1]


def assert_png(path: Path, size: tuple[int, int]) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 100  # drawn, not blank


@pytest.mark.plots
@pytest.mark.slow  # the module's training run, then three PNGs in a child process
def test_a_moe_run_gets_both_expert_figures(moe_events: Path, tmp_path: Path) -> None:
    shutil.copy(moe_events, tmp_path / "events.jsonl")

    written = write_reports_apart(tmp_path)

    assert [p.name for p in written] == list(REPORT_FILES)
    assert_png(tmp_path / "expert_activations.png", (1400, 680))  # 2 layer rows + balance
    assert_png(tmp_path / "expert_device_distribution.png", (1200, 550))
    assert "== Experts ==" in (tmp_path / "performance_summary.txt").read_text()


def test_the_experts_section_matches_the_records(moe_events: Path) -> None:
    records = read_events(moe_events)
    steps = moe_steps(records)
    kept = [sum(sum(row) for row in s["moe_tokens_per_expert"].values()) for s in steps]
    dropped = [s["moe_dropped_tokens"] for s in steps]
    # every token's top-k assignments in every layer are either kept or dropped
    assert [k + d for k, d in zip(kept, dropped, strict=True)] == [LAYERS * TOP_K * BATCH * SEQ] * 6
    assert sum(dropped) > 0

    text = section(format_performance_summary(records))

    assert f"MoE layers              2 (4 experts each), {len(steps)} steps" in text
    assert f"last {len(steps)} steps (balanced 25.0%)" in text
    for layer in ("blocks.0.moe", "blocks.1.moe"):
        totals = np.sum([s["moe_tokens_per_expert"][layer] for s in steps], axis=0)
        shares = "  ".join(f"{100 * t / totals.sum():.1f}%" for t in totals)
        assert f"  {layer:<24}{shares}\n" in text
    total = sum(kept) + sum(dropped)
    assert (
        f"dropped assignments     {sum(dropped)} of {total:,} "
        f"({100 * sum(dropped) / total:.1f}%), all layers, 6 steps"
    ) in text
    mean = sum(s["moe_aux_loss"] for s in steps) / len(steps)
    assert f"mean aux loss           {mean:.4g} over the last 6 steps" in text
    (device,) = records[0]["resolved"]["strategy"]["expert_placement"]["devices"]
    assert "placement               planned over 1 device; planned: experts run on cpu" in text
    assert (
        f"  cpu                     8 experts, cost {device['cost']:,.0f} (cpu, 1 SMs)\n"
        "                          0-3 of every layer\n"
    ) in text
    assert "counted on" not in text  # one process: every token is counted


@pytest.mark.plots
def test_the_heatmap_shows_each_experts_share_per_step(moe_events: Path) -> None:
    records = read_events(moe_events)
    steps = moe_steps(records)
    figure = activations_figure(records)
    assert figure is not None

    heatmaps = [ax for ax in figure.axes if ax.get_images()]
    assert [ax.get_title(loc="left") for ax in heatmaps] == [
        "blocks.0.moe: share of kept assignments",
        "blocks.1.moe: share of kept assignments",
    ]
    counts = np.array([s["moe_tokens_per_expert"]["blocks.1.moe"] for s in steps], float).T
    shown = heatmaps[1].get_images()[0].get_array()
    np.testing.assert_allclose(np.ma.getdata(shown), counts / counts.sum(axis=0))
    placement = device_figure(records)
    assert placement is not None
    experts, costs = placement.axes
    assert [(b.get_height(), b.get_y()) for b in experts.patches] == [(4.0, 0.0), (4.0, 4.0)]
    assert [t.get_text() for t in experts.texts] == ["0-3", "0-3"]  # each layer's indices
    assert [t.get_text() for t in experts.get_xticklabels()] == ["cpu\ncpu\n1 SMs"]
    (device,) = records[0]["resolved"]["strategy"]["expert_placement"]["devices"]
    assert [b.get_height() for b in costs.patches] == [device["cost"]]
    assert placement.get_suptitle().endswith(
        "planned over 1 device  |  planned: experts run on cpu"
    )


def torchrun_records(world: int = 2) -> list[dict[str, Any]]:
    """Rank 0's records of a 2-rank expert_parallel job (8 experts per layer)."""
    layers = {
        f"blocks.{i}.moe": {
            "experts": 8,
            "experts_per_rank": 8 // world,
            "held": list(range(8 // world)),
        }
        for i in range(2)
    }
    strategy = {
        "training_mode": "expert_parallel",
        "world_size": world,
        "rank": 0,
        "expert_parallel": {
            "token_exchange": "all_gather",
            "note": "asked for",
            "dense": "ddp",
            "layers": layers,
        },
    }
    steps = [
        {
            "event": "train_step",
            "step": s,
            "moe_aux_loss": 1.0 + s / 100,
            "moe_tokens_per_expert": {n: [s, 1, 1, 1, 1, 1, 1, 1] for n in layers},
            "moe_dropped_tokens": 2,
        }
        for s in range(1, 4)
    ]
    return [{"event": "run_start", "run_id": "ep-job", "resolved": {"strategy": strategy}}, *steps]


@pytest.mark.plots
def test_a_torchrun_job_shows_the_experts_each_rank_holds(tmp_path: Path) -> None:
    records = torchrun_records()
    path = write_expert_device_distribution(records, tmp_path / "expert_device_distribution.png")

    assert path is not None
    assert_png(path, (1200, 550))
    figure = device_figure(records)
    assert figure is not None
    (ax,) = figure.axes  # ranks: no cost panel
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]
    assert [b.get_height() for b in ax.patches] == [4.0] * 4  # 2 layers x 2 ranks
    assert [t.get_text() for t in ax.texts] == ["0-3", "4-7", "0-3", "4-7"]
    assert "2 ranks  |  token exchange all_gather (asked for)" in figure.get_suptitle()
    text = section(format_performance_summary(records))
    assert "placement               2 ranks, token exchange all_gather (asked for)" in text
    assert (
        "  rank 1                  8 experts\n                          4-7 of every layer\n"
        in text
    )
    assert "counted on              rank 0's tokens" in text
    assert "dropped assignments     6 of 60 (10.0%)" in text  # kept (8+9+10) x 2 layers


@pytest.mark.plots
def test_a_long_run_with_many_layers_is_binned_and_capped(tmp_path: Path) -> None:
    layers = [f"layer{i}" for i in range(8)]
    records = [
        {
            "event": "train_step",
            "step": s,
            "moe_dropped_tokens": 0,
            "moe_tokens_per_expert": {n: [s % 3, 1, 2] for n in layers},
        }
        for s in range(1, 1001)
    ]
    figure = activations_figure(records)
    assert figure is not None

    heatmaps = [ax for ax in figure.axes if ax.get_images()]
    assert len(heatmaps) == 6
    assert "8 MoE layers  |  first 6 of 8 layers shown" in figure.get_suptitle()
    assert heatmaps[0].get_images()[0].get_array().shape == (3, 200)  # 1,000 steps, bins of 5
    assert heatmaps[0].get_xlabel() == "optimizer step (bins of 5 steps)"
    assert write_expert_device_distribution(records, tmp_path / "d.png") is None  # no strategy
    text = section(format_performance_summary(records))
    assert "layer7                  " in text and "last 50 steps" in text


def test_odd_content_never_raises(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [
        {
            "event": "run_start",
            "resolved": {
                "strategy": {
                    "world_size": 2**70,
                    "expert_parallel": {"layers": {"a": {"experts_per_rank": 2**70}, "b": 5}},
                }
            },
        },
        {
            "event": "train_step",
            "step": 1,
            "moe_tokens_per_expert": {"x": "abc", "y": [None, -3]},
            "moe_dropped_tokens": "q",
            "moe_aux_loss": float("nan"),
        },
        {"event": "train_step", "step": None, "moe_tokens_per_expert": {"x": [1]}},
        {"event": "train_step", "step": 2, "moe_tokens_per_expert": [1, 2]},
    ]
    text = format_performance_summary(records)
    assert "not available" not in text
    assert re.search(r"MoE layers\s+1 \(2 experts each\), 1 step with routing", text)
    assert "dropped assignments     not recorded" in text
    assert write_expert_device_distribution(records, tmp_path / "d.png") is None
    assert "== Experts ==" not in format_performance_summary([{"event": "train_step", "step": 1}])


@pytest.mark.plots
def test_an_added_expert_and_odd_counts_still_draw(tmp_path: Path) -> None:
    records = [
        {
            "event": "train_step",
            "step": 1,
            "moe_tokens_per_expert": {"grown": [1, 3], "odd": [None, -3], "none": []},
        },
        {"event": "train_step", "step": 2, "moe_tokens_per_expert": {"grown": [1, 1, 2]}},
    ]
    assert write_expert_activations(records, tmp_path / "a.png") == tmp_path / "a.png"
    figure = activations_figure(records)
    assert figure is not None
    grown, odd = [ax.get_images()[0].get_array() for ax in figure.axes if ax.get_images()]
    np.testing.assert_allclose(np.ma.getdata(grown), [[0.25, 0.25], [0.75, 0.25], [0.0, 0.5]])
    assert np.ma.getmaskarray(odd).all()  # no assignment kept: no share, drawn blank
    (none,) = [ax for ax in figure.axes if ax.get_title(loc="left").startswith("none:")]
    assert [t.get_text() for t in none.texts] == ["no data: no expert counts recorded"]


def test_a_plan_over_two_gpus_lists_each_devices_experts() -> None:
    devices = [
        {
            "device": "cuda:0",
            "name": "H100",
            "sm_count": 132,
            "cost": 3000.0,
            "experts": ["a.0", "a.1", "b.0"],
        },
        {
            "device": "cuda:1",
            "name": "A10",
            "sm_count": 72,
            "cost": 1500.0,
            "experts": ["a.2", "b.1", "b.2"],
        },
    ]
    strategy = {
        "device": "cuda:0",
        "world_size": 1,
        "experts_moved": True,
        "expert_placement": {"devices": devices},
    }
    start = {"event": "run_start", "resolved": {"strategy": strategy}}
    text = section(format_performance_summary([start]))

    assert "routing                 not recorded (no train_step record with MoE counts)" in text
    assert text.endswith(
        "  placement               planned over 2 devices; experts moved to the 2 planned devices\n"
        "  cuda:0                  3 experts, cost 3,000 (H100, 132 SMs)\n"
        "                          a: 0-1\n"
        "                          b: 0\n"
        "  cuda:1                  3 experts, cost 1,500 (A10, 72 SMs)\n"
        "                          a: 2\n"
        "                          b: 1-2\n"
    )
