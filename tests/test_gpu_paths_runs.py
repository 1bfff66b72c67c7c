"""The CUDA paths, part 2 (``pytest -m gpu`` on a GPU machine; every test skips without one):
real device memory (the batch-size finder, out-of-memory recovery, activation
checkpointing), ``torch.compile``, checkpoints moving between GPU and CPU, and the MoE layer
and single-process expert placement on CUDA. Part 1 is ``tests/test_gpu_paths.py``."""

from __future__ import annotations

import copy
import gc
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from core import MultiGPUConfig, create_optimized_training_optimizer, load_weights
from core.memory.finder import find_batch_size
from core.moe import MoELayer
from core.reports.read import read_events
from core.transforms import apply_activation_checkpointing
from examples.moe.data import domain_sequences, vocabulary
from examples.moe.model import MoETransformer
from tests.helpers import make_classification, make_model
from tests.test_gpu_paths import CUDA, named, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GIB = 2**30


@pytest.fixture
def fresh_device() -> Iterator[None]:
    """Memory caps and matmul precision are process-wide: each test starts from an empty
    cache and leaves no cap and the matmul precision it found."""
    matmul = torch.get_float32_matmul_precision()
    gc.collect()
    torch.cuda.empty_cache()
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    gc.collect()
    torch.cuda.empty_cache()


def fraction_for(budget_bytes: int) -> float:
    """The per-process memory fraction that leaves ``budget_bytes`` above what the caching
    allocator already holds (the cap counts reserved memory)."""
    total = torch.cuda.get_device_properties(0).total_memory
    return (torch.cuda.memory_reserved(0) + budget_bytes) / total


# -- the batch-size finder against real memory ---------------------------------------------


def deep_mlp() -> nn.Module:
    """About 32 MiB of saved activations per sample of shape [2048, 256]."""
    torch.manual_seed(0)
    blocks = (nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8))
    return nn.Sequential(*blocks).to(CUDA)


def training_step(model: nn.Module, batch_size: int) -> int:
    """One AdamW step on random inputs, as the finder's trial runs it; returns its peak."""
    optimizer = torch.optim.AdamW(model.parameters())
    torch.cuda.reset_peak_memory_stats(0)
    try:
        x = torch.randn(batch_size, 2048, 256, device=CUDA)
        model(x).float().mean().backward()
        optimizer.step()
        return torch.cuda.max_memory_allocated(0)
    finally:
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()


def test_the_found_batch_size_fits_and_one_and_a_half_times_it_runs_out_of_memory(
    fresh_device: None,
) -> None:
    model = deep_mlp()
    target = 1.5 * GIB
    # A hard cap just above the target: past it the allocator raises a real OOM.
    torch.cuda.set_per_process_memory_fraction(fraction_for(int(1.1 * target)), 0)
    search = find_batch_size(model, (1, 2048, 256), target_memory_gb=1.5)
    found = search.batch_size
    assert found > 8 and search.target_bytes == int(target)
    assert any(not trial.fits for trial in search.trials)  # the search met the limit
    # The answer runs under the cap, and its peak is the target's (the same step as the
    # finder's trial, give or take its loss's few bytes).
    assert training_step(model, found) <= 1.01 * target
    gc.collect()
    torch.cuda.empty_cache()
    with pytest.raises(torch.OutOfMemoryError):
        training_step(model, math.ceil(1.5 * found))


# -- out-of-memory recovery with a real OutOfMemoryError ----------------------------------


class WideActivation(nn.Module):
    """Each sample materialises [1024, 4096] float32 activations (16 MiB per tensor)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(8, 4096)
        self.mix = nn.Parameter(torch.randn(1024, 1) / 32)
        self.head = nn.Linear(4096, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.tanh(self.up(x).unsqueeze(1) * self.mix)  # [batch, 1024, 4096]
        out: torch.Tensor = self.head(wide.mean(dim=1))
        return out


def test_a_real_oom_halves_the_micro_batch_and_training_continues(
    log_dir: Path, fresh_device: None
) -> None:
    """Batches of 32 need about 1.5 GiB at the peak, 16 about 0.75 GiB: under a 1 GiB cap
    the first step runs out of memory for real and is re-split."""
    model = WideActivation()
    initial = [p.detach().clone() for p in model.parameters()]
    records = train(
        log_dir,
        model=model,
        n=128,
        amp_dtype=torch.float32,
        oom_recovery="on",
        memory_fraction=fraction_for(GIB),
    )
    recovered = named(records, "oom_recovered")
    assert recovered and recovered[0]["step"] == named(records, "train_step")[0]["step"]
    assert (recovered[0]["batch_size"], recovered[0]["micro_batch_size"]) == (32, 16)
    steps = named(records, "train_step")
    assert len(steps) == 4 and [s["samples"] for s in steps] == [32] * 4
    assert all(math.isfinite(s["loss"]) and not s["skipped"] for s in steps)
    assert not named(records, "run_error") and named(records, "run_end")
    trained = [p.detach().cpu() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(initial, trained, strict=True))


# -- activation checkpointing ------------------------------------------------------------


def peak_and_grads(model: nn.Module, x: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(0)
    start = torch.cuda.memory_allocated(0)
    model(x).square().mean().backward()
    peak = torch.cuda.max_memory_allocated(0) - start
    return peak, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_activation_checkpointing_lowers_the_peak_with_the_same_gradients(
    fresh_device: None,
) -> None:
    torch.manual_seed(0)
    blocks = (
        nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(6)
    )
    model = nn.Sequential(*blocks).to(CUDA)
    x = torch.randn(16, 512, 256, device=CUDA)
    plain_peak, plain_grads = peak_and_grads(model, x)
    assert apply_activation_checkpointing(model) == [str(i) for i in range(6)]
    checkpointed_peak, checkpointed_grads = peak_and_grads(model, x)
    # Kept: 6 blocks x 64 MiB of hidden activations without, one block's with.
    assert checkpointed_peak < 0.5 * plain_peak, (checkpointed_peak, plain_peak)
    for a, b in zip(plain_grads, checkpointed_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# -- torch.compile -----------------------------------------------------------------------------


@pytest.mark.slow  # inductor's first compile takes tens of seconds
def test_a_compiled_run_matches_the_eager_run(log_dir: Path, fresh_device: None) -> None:
    settings: dict[str, Any] = {"amp_dtype": torch.float32, "tf32": False}
    eager = train(log_dir / "eager", compile=False, **settings)
    torch._dynamo.reset()
    counters.clear()
    compiled = train(log_dir / "compiled", compile=True, **settings)
    assert counters["stats"]["unique_graphs"] >= 1  # inductor really compiled the model
    losses = [s["loss"] for s in named(compiled, "train_step")]
    assert len(losses) == 8
    torch.testing.assert_close(
        losses, [s["loss"] for s in named(eager, "train_step")], rtol=1e-3, atol=1e-4
    )


# -- checkpoints between GPU and CPU ---------------------------------------------------------


def run_on(mode: str, log_dir: Path, epochs: int, resume: str | None = None) -> tuple[Any, Any]:
    """A fp32 run (the same precision on both devices, so a resume is compatible)."""
    run = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(128), batch_size=32),
        max_epochs=epochs,
        log_dir=log_dir,
        progress=False,
        seed=0,
        amp_dtype=torch.float32,
        compile=False,
        amp_check_compatibility=False,
        resume=resume,
        multi_gpu_config=MultiGPUConfig(training_mode=mode),  # type: ignore[arg-type]
    )
    try:
        results = anyio.run(run.train)
    finally:
        run.close()
    return run, results


@pytest.mark.parametrize(("saved_on", "loaded_on"), [("single_gpu", "cpu"), ("cpu", "single_gpu")])
def test_a_checkpoint_moves_between_gpu_and_cpu(
    saved_on: str, loaded_on: str, log_dir: Path
) -> None:
    first, results = run_on(saved_on, log_dir / "first", epochs=1)
    path = results.last_checkpoint
    assert path is not None
    target = torch.device("cpu") if loaded_on == "cpu" else CUDA
    model = make_model(seed=1).to(target)
    assert load_weights(path, model).step == 4
    for ours, theirs in zip(model.parameters(), first.model.parameters(), strict=True):
        assert ours.device.type == target.type
        assert torch.equal(ours.detach().cpu(), theirs.detach().cpu())

    resumed, longer = run_on(loaded_on, log_dir / "resumed", epochs=2, resume=path)
    assert longer.epochs_completed == 2 and longer.global_step == 8
    records = read_events(longer.run_dir / "events.jsonl")
    (resumed_record,) = named(records, "resumed")
    assert resumed_record["step"] == 4
    steps = named(records, "train_step")
    assert [s["step"] for s in steps] == [5, 6, 7, 8]
    assert all(math.isfinite(s["loss"]) for s in steps)
    assert all(p.device.type == target.type for p in resumed.model.parameters())


# -- mixture of experts on CUDA --------------------------------------------------------------


def test_the_moe_layer_on_cuda_matches_cpu_forward_and_backward(fresh_device: None) -> None:
    torch.set_float32_matmul_precision("highest")  # no TF32: routing compares exactly
    torch.manual_seed(0)
    layer = MoELayer(16, 4, 32, top_k=2, capacity_factor=1.0)
    on_gpu = copy.deepcopy(layer).to(CUDA)
    x = torch.randn(64, 16)
    cpu_routing, gpu_routing = layer.router(x, 1.0), on_gpu.router(x.to(CUDA), 1.0)
    assert torch.equal(cpu_routing.experts, gpu_routing.experts.cpu())
    assert torch.equal(cpu_routing.keep, gpu_routing.keep.cpu())
    assert not bool(cpu_routing.keep.all())  # capacity 1.0 drops some choices: covered too
    outputs = []
    for module, inputs in ((layer, x), (on_gpu, x.to(CUDA))):
        out = module(inputs)
        (out.square().mean() + module.aux_loss).backward()
        outputs.append(out.detach().cpu())
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    for (name, ours), (_, theirs) in zip(
        layer.named_parameters(), on_gpu.named_parameters(), strict=True
    ):
        assert ours.grad is not None and theirs.grad is not None, name
        torch.testing.assert_close(theirs.grad.cpu(), ours.grad, rtol=1e-4, atol=1e-6)


def test_expert_parallel_in_one_process_trains_on_the_gpus_its_plan_names(
    log_dir: Path,
) -> None:
    torch.manual_seed(0)
    model = MoETransformer(
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
    run = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(domain_sequences(32, seq_len=8), batch_size=8),
        max_epochs=1,
        log_dir=log_dir,
        progress=False,
        seed=0,
        compile=False,
        multi_gpu_config=MultiGPUConfig(training_mode="expert_parallel"),
    )
    try:
        results = anyio.run(run.train)
    finally:
        run.close()
    records = read_events(results.run_dir / "events.jsonl")
    (start,) = named(records, "run_start")
    plan = start["resolved"]["strategy"]["expert_placement"]
    names = {f"blocks.{b}.moe.{e}" for b in range(2) for e in range(4)}
    visible = {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert set(plan["assignment"]) == names
    assert set(plan["assignment"].values()) <= visible
    assert {n for d in plan["devices"] for n in d["experts"]} == names
    if torch.cuda.device_count() == 1:
        assert set(plan["assignment"].values()) == {"cuda:0"}
    for name, device in plan["assignment"].items():  # each expert lives where the plan says
        layer_name, index = name.rsplit(".", 1)
        expert = model.get_submodule(layer_name).experts.expert(int(index))
        assert str(next(expert.parameters()).device) == device, name
    steps = named(records, "train_step")
    assert len(steps) == 4
    assert all(math.isfinite(s["loss"]) and math.isfinite(s["moe_aux_loss"]) for s in steps)
    assert all(
        sorted(s["moe_tokens_per_expert"]) == ["blocks.0.moe", "blocks.1.moe"] for s in steps
    )
