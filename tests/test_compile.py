"""torch.compile in place: same losses and gradients as eager, same state_dict keys, one
``compile`` record with its graph breaks, and a compiler failure that falls back to eager."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from core.errors import ConfigError
from core.transforms import (
    ModelTransformsConfig,
    TransformReport,
    apply_model_transforms,
    compile_model,
    is_checkpointed,
    is_compiled,
    wants_compile,
)
from core.transforms.compile import compile_reason
from core.transforms.payback import EXPECTED_COMPILE_S, EXPECTED_SAVING, CompileWhenItPays

CPU = torch.device("cpu")


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, /, **fields: Any) -> None:
        self.records.append((event, fields))


class Breaking(nn.Module):
    """A model with one deliberate graph break in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        torch._dynamo.graph_break()
        return self.second(h)


class Faulty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layer(x)
        raise ValueError("bad input from the user's model")


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()  # every test's models compile anew, unaffected by earlier caches
    yield
    torch._dynamo.reset()


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())  # test readback
    return losses


@pytest.mark.slow
def test_compiled_training_matches_eager_and_reports_the_compile_once() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    compiled = copy.deepcopy(eager)
    emit, errors = Recorder(), Recorder()
    assert compile_model(compiled, emit=emit, report_error=errors) == ["model"]
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batches = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(4)]
    graphs = graphs_compiled()

    results: list[list[float]] = []  # the compiled model trains on a worker thread, as in runs
    worker = threading.Thread(target=lambda: results.append(train(compiled, batches)))
    worker.start()
    worker.join()
    assert graphs_compiled() > graphs  # an nn.Sequential really compiles (not a no-op)
    expected = train(eager, batches)
    assert torch.allclose(torch.tensor(results[0]), torch.tensor(expected), atol=1e-5)
    for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    [(event, fields)] = emit.records
    assert event == "compile" and fields.pop("seconds") > 0
    assert fields == {"target": "model", "mode": "default", "fullgraph": False, "graph_breaks": 0}
    assert errors.records == [] and is_compiled(compiled)


@pytest.mark.slow
def test_graph_breaks_are_counted_at_the_first_call() -> None:
    model = Breaking()
    reference = copy.deepcopy(model)
    emit, errors = Recorder(), Recorder()
    compile_model(model, emit=emit, report_error=errors)
    x = torch.randn(3, 4)
    for _ in range(2):
        assert torch.allclose(model(x), reference(x), atol=1e-5)
    [(event, fields)] = emit.records
    assert event == "compile" and fields["graph_breaks"] >= 1
    assert errors.records == []


def test_a_fullgraph_failure_falls_back_to_eager_and_is_reported_once() -> None:
    model = Breaking()
    reference = copy.deepcopy(model)
    emit, errors = Recorder(), Recorder()
    compile_model(model, fullgraph=True, emit=emit, report_error=errors)
    x = torch.randn(3, 4)
    for _ in range(2):
        out = model(x)
        assert torch.allclose(out, reference(x))
    out.sum().backward()
    assert model.first.weight.grad is not None
    [(event, fields)] = errors.records
    assert event == "error" and fields["kind"] == "compile_failed"
    assert fields["reason"].startswith("Unsupported: ") and "\n" not in fields["reason"]
    assert fields["effect"] == "continuing in eager mode"
    assert emit.records == [] and not is_compiled(model) and model._compiled_call_impl is None


def test_a_backend_failure_in_the_backward_graph_falls_back_at_the_first_call() -> None:
    from torch._dynamo.backends.common import aot_autograd

    def broken(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        raise RuntimeError("no working C++ compiler")

    backend = aot_autograd(fw_compiler=lambda graph, example_inputs: graph, bw_compiler=broken)
    model, reference = Stack(), Stack()
    reference.load_state_dict(model.state_dict())
    errors = Recorder()
    compile_model(model, backend=backend, emit=Recorder(), report_error=errors)
    x = torch.randn(2, 4)
    out = model(x)  # the failure shows here, not in backward()
    assert torch.allclose(out, reference(x))
    out.sum().backward()
    [(_, fields)] = errors.records
    assert fields["reason"].startswith("BackendCompilerFailed: ")
    assert not is_compiled(model)


def test_the_models_own_errors_propagate_unchanged() -> None:
    model, errors = Faulty(), Recorder()
    compile_model(model, emit=Recorder(), report_error=errors)
    with pytest.raises(ValueError, match="bad input from the user's model"):
        model(torch.randn(2, 4))
    assert errors.records == []


@pytest.mark.slow
def test_the_fsdp2_path_compiles_each_block() -> None:
    torch.manual_seed(0)
    model = Stack()
    reference = copy.deepcopy(model)
    emit, errors = Recorder(), Recorder()
    config = ModelTransformsConfig(compile=True)
    report = apply_model_transforms(
        model, config, CPU, emit=emit, report_error=errors, compile_blocks=True
    )
    assert report == TransformReport(
        compiled=("blocks.0", "blocks.1"), compile="on: compile=True, before the first step"
    )
    x, graphs = torch.randn(5, 4), graphs_compiled()
    out, expected = model(x), reference(x)
    assert graphs_compiled() > graphs
    assert torch.allclose(out, expected, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
    assert [fields["target"] for _, fields in emit.records] == ["blocks.0", "blocks.1"]
    assert errors.records == [] and not is_compiled(model)


def test_on_cpu_the_defaults_only_checkpoint_what_was_asked() -> None:
    model = Stack()
    config = ModelTransformsConfig(activation_checkpointing=True)
    seen: list[bool] = []  # the hook sees the checkpointed, uncompiled model
    report = apply_model_transforms(
        model,
        config,
        CPU,
        emit=Recorder(),
        report_error=Recorder(),
        before_compile=lambda m: seen.append(m is model and is_checkpointed(model.blocks[0])),
    )
    assert seen == [True]
    assert report.to_dict() == {
        "activation_checkpointed": ["blocks.0", "blocks.1"],
        "channels_last": False,
        "compiled": [],
        "compile": "off: compile=False (the default)",
    }
    assert not is_compiled(model)


def test_only_true_compiles_before_the_first_step_and_the_mode_is_checked() -> None:
    cuda = torch.device("cuda", 0)
    assert not wants_compile("auto", CPU) and not wants_compile("auto", cuda)  # decided later
    assert wants_compile(True, CPU) and not wants_compile(False, cuda)
    assert ModelTransformsConfig().compile is False  # the default: no compile unless asked
    assert compile_reason("auto", CPU, blocks=False).startswith("auto: off on CPU")
    assert compile_reason("auto", cuda, blocks=True).startswith("auto: off with FSDP2")
    assert compile_reason("auto", cuda, blocks=False).startswith("auto: decided after")
    with pytest.raises(ConfigError, match=r"^compile_mode='fast' is invalid; allowed: 'default'"):
        ModelTransformsConfig(compile_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^compile=1 is invalid"):
        ModelTransformsConfig(compile=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^compile_fullgraph='no' is invalid"):
        ModelTransformsConfig(compile_fullgraph="no")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_true_compiles_the_whole_model_on_cuda_and_the_default_does_not() -> None:
    device = torch.device("cuda", 0)
    model = Stack().to(device)
    reference = copy.deepcopy(model)
    emit = Recorder()
    plain = apply_model_transforms(
        copy.deepcopy(model), ModelTransformsConfig(), device, emit=emit, report_error=Recorder()
    )
    assert plain.compiled == () and not plain.compile_deferred
    auto = apply_model_transforms(
        copy.deepcopy(model),
        ModelTransformsConfig(compile="auto"),
        device,
        emit=emit,
        report_error=Recorder(),
    )
    assert auto.compiled == () and auto.compile_deferred  # the step loop decides
    report = apply_model_transforms(
        model, ModelTransformsConfig(compile=True), device, emit=emit, report_error=Recorder()
    )
    assert report.compiled == ("model",) and is_compiled(model)
    x = torch.randn(8, 4, device=device)
    assert torch.allclose(model(x), reference(x), atol=1e-5)
    assert [event for event, _ in emit.records] == ["compile"]


# -- compile="auto": compile only when the planned run repays it --------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("step_s", [0.05, 0.5])
def test_auto_times_eager_steps_and_compiles_only_when_it_pays(step_s: float) -> None:
    clock, emit, compiled = Clock(), Recorder(), []
    rule = CompileWhenItPays(
        planned_steps=2000,
        compile_now=lambda: compiled.append(1) or ["model"],
        emit=emit,
        warmup_steps=5,
        measure_steps=20,
        clock=clock,
    )
    for step in range(1, 2001):
        clock.t += step_s if step > 1 else 30.0  # the first step is slow (warm-up)
        rule(step)
    ((event, decision),) = emit.records
    pays = (2000 - 25) * step_s * EXPECTED_SAVING >= EXPECTED_COMPILE_S
    assert event == "compile_decision" and decision["step"] == 25
    assert decision["eager_step_s"] == pytest.approx(step_s)  # the warm-up is not timed
    assert decision["remaining_steps"] == 1975 and decision["compile"] is pays
    assert decision["compiled"] == (["model"] if pays else []) and len(compiled) == int(pays)
    assert pays is (step_s == 0.5)  # 99 s of saving repays 60 s of compiling; 9.9 s does not


def test_auto_says_so_when_the_run_ends_before_it_measured() -> None:
    emit = Recorder()
    rule = CompileWhenItPays(planned_steps=10, compile_now=lambda: ["model"], emit=emit)
    for step in range(1, 11):
        rule(step)
    ((_, decision),) = emit.records
    assert decision["compile"] is False and decision["eager_step_s"] is None


def test_epochs_after_the_first_compile_nothing_new_for_training_or_validation(
    tmp_path: Any,
) -> None:
    """A compiled model trained and validated by core (mode switches, a short last batch, a
    larger validation batch): every graph exists after the first epoch."""
    import anyio
    from torch.utils.data import DataLoader

    from core import Callback, create_optimized_training_optimizer
    from tests.helpers import loaders, make_classification, make_model

    torch._dynamo.reset()
    model = make_model()
    compile_model(model, backend="aot_eager", emit=Recorder(), report_error=Recorder())
    train, _ = loaders(n=200, batch_size=32)  # 200 = 6 x 32 + 8: a short last batch
    val = DataLoader(make_classification(64, seed=1), batch_size=50)  # 50 and 14
    graphs: list[int] = []

    class Count(Callback):
        async def on_epoch_end(self, run: Any, record: Any) -> None:
            graphs.append(counters["stats"]["unique_graphs"])

    run = create_optimized_training_optimizer(
        model=model,
        train_loader=train,
        val_loader=val,
        max_epochs=3,
        log_dir=tmp_path,
        progress=False,
        reports=False,
        callbacks=[Count()],
    )
    before = counters["stats"]["unique_graphs"]
    anyio.run(run.train)
    assert graphs[0] > before and graphs[1] == graphs[2] == graphs[0]
