"""The CUDA paths, part 1 (``pytest -m gpu`` on a GPU machine; every test skips without one):
the precision objects and the on-device loss scaler, no host sync inside a step, the lagged
readback against eager ``.item()``, NVML against ``nvidia-smi``, the device settings a run
applies and records, and DataParallel. Part 2 is ``tests/test_gpu_paths_runs.py``."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.gpu_suite_overhead import sync_errors
from core import MultiGPUConfig, create_optimized_training_optimizer
from core.loop.step import DeviceSkippingStepper, stepper_for
from core.monitoring.gpu_monitor import GPUMonitor
from core.monitoring.nvml import load_nvml, nvml_acquire, nvml_release, torch_device_handle
from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.precision.plugins import FP32, Autocast, Precision, ScaledFP16
from core.precision.policy import resolve_precision
from core.reports.read import read_events
from tests.helpers import make_classification, make_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda", 0)


@pytest.fixture
def restore_cuda_settings() -> Iterator[None]:
    """Runs flip process-wide switches (TF32, cuDNN autotuning, the memory cap): put them
    back for the tests that follow."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1:]
    for index in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    torch.cuda.empty_cache()


def train(log_dir: Path, *, epochs: int = 1, n: int = 256, **settings: Any) -> list[dict[str, Any]]:
    """A tiny classification run on CUDA (eager unless ``compile=`` says otherwise);
    returns its records."""
    settings.setdefault("multi_gpu_config", MultiGPUConfig(training_mode="single_gpu"))
    settings.setdefault("compile", False)
    settings.setdefault("amp_check_compatibility", False)  # no extra passes before step 1
    settings.setdefault("checkpoint_every_n_epochs", None)
    model = settings.pop("model", None)
    run = create_optimized_training_optimizer(
        model=make_model() if model is None else model,
        train_loader=DataLoader(make_classification(n), batch_size=32),
        max_epochs=epochs,
        log_dir=log_dir,
        progress=False,
        seed=0,
        **settings,
    )
    try:
        results = anyio.run(run.train)
    finally:
        run.close()
    return read_events(results.run_dir / "events.jsonl")


def named(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


# -- the precision objects -----------------------------------------------------------------


def forward_backward(model: nn.Module, precision: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    with precision.autocast():
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
    precision.backward(loss)
    return out


def test_auto_resolves_to_bf16_autocast_where_the_gpu_has_it() -> None:
    precision = resolve_precision(MixedPrecisionConfig(dtype="auto"), CUDA)
    if torch.cuda.is_bf16_supported():
        assert type(precision) is Autocast and precision.dtype == torch.bfloat16
    else:
        assert isinstance(precision, ScaledFP16)


@pytest.mark.parametrize(
    ("dtype", "kind"),
    [(torch.float32, FP32), (torch.bfloat16, Autocast), (torch.float16, ScaledFP16)],
    ids=["fp32", "bf16", "fp16-scaled"],
)
def test_each_precision_object_on_cuda(dtype: torch.dtype, kind: type[Precision]) -> None:
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    precision = resolve_precision(MixedPrecisionConfig(dtype=dtype), CUDA)
    assert type(precision) is kind
    x, y = (t.to(CUDA) for t in make_classification(32).tensors)
    reference = make_model().to(CUDA)
    nn.functional.cross_entropy(reference(x), y).backward()
    model = make_model().to(CUDA)
    out = forward_backward(model, precision, x, y)
    assert out.dtype == dtype  # the matmuls ran in the precision's dtype
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == 4 and all(g.dtype == torch.float32 for g in grads)  # fp32 master grads
    found_inf = precision.unscale_(grads)
    if kind is ScaledFP16:
        assert found_inf is not None and float(found_inf) == 0.0
        assert precision.loss_scale is not None and float(precision.loss_scale) == 2.0**16
    else:
        assert found_inf is None and precision.loss_scale is None
    exact = dtype == torch.float32
    for grad, ref in zip(grads, reference.parameters(), strict=True):
        assert ref.grad is not None
        # Unscaled fp16 and bf16 gradients are the fp32 ones to their precision.
        tolerance = {"rtol": 1e-6, "atol": 1e-7} if exact else {"rtol": 0.05, "atol": 0.01}
        torch.testing.assert_close(grad, ref.grad, **tolerance)


def test_fp16_overflow_is_skipped_on_the_device_by_fused_adamw(
    restore_cuda_settings: None,
) -> None:
    config = MixedPrecisionConfig(dtype=torch.float16, scaler=LossScalerConfig(init_scale=1024.0))
    precision = resolve_precision(config, CUDA)
    assert isinstance(precision, ScaledFP16)
    model = make_model().to(CUDA)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    stepper = stepper_for(optimizer, CUDA, guard_nonfinite=True)
    assert type(stepper) is DeviceSkippingStepper
    x, y = (t.to(CUDA) for t in make_classification(32).tensors)

    def step(poison: bool) -> torch.Tensor:
        forward_backward(model, precision, x, y)
        grads = [p.grad for p in params if p.grad is not None]
        if poison:
            grads[0][0, 0] = float("inf")  # as an fp16 overflow in backward leaves it
        torch.cuda.synchronize()  # nothing queued before the checked region is counted
        torch.cuda.set_sync_debug_mode("error")  # any host sync from here on raises
        try:
            found_inf = precision.unscale_(grads)
            assert found_inf is not None
            norm = torch.nn.utils.get_total_norm(grads)
            skipped = stepper.step(found_inf, norm)
            precision.update(found_inf)
            optimizer.zero_grad(set_to_none=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert isinstance(skipped, torch.Tensor)
        return skipped

    step(poison=False)  # creates the optimizer state: one applied step
    before = [p.detach().clone() for p in params]
    state_before = {k: v.clone() for k, v in optimizer.state[params[0]].items()}
    skipped = step(poison=True)
    assert float(skipped) == 1.0
    for old, new in zip(before, params, strict=True):
        assert torch.equal(old, new)  # weights untouched
    for key, value in optimizer.state[params[0]].items():
        assert torch.equal(value, state_before[key]), key  # moments and step count too
    assert float(optimizer.state[params[0]]["step"]) == 1.0
    assert float(precision.scaler.scale) == 512.0  # backed off once (hysteresis 1)
    skipped = step(poison=False)
    assert float(skipped) == 0.0 and float(optimizer.state[params[0]]["step"]) == 2.0
    assert not torch.equal(before[0], params[0])


def test_a_run_counts_an_fp16_overflow_as_a_skipped_step_and_lowers_the_scale(
    log_dir: Path,
) -> None:
    model = make_model()
    calls = [0]

    def overflow_at_the_third_backward(grad: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return torch.full_like(grad, float("inf")) if calls[0] == 3 else grad

    model[0].weight.register_hook(overflow_at_the_third_backward)
    records = train(
        log_dir,
        model=model,
        amp_dtype=torch.float16,
        amp_init_scale=1024.0,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    )
    steps = named(records, "train_step")
    assert [s["skipped"] for s in steps] == [False, False, True, *[False] * 5]
    assert steps[2]["overflow"] is True and steps[2]["loss_scale"] == 1024.0
    assert [s["loss_scale"] for s in steps[3:]] == [512.0] * 5
    assert all(s["loss"] == s["loss"] for s in steps)  # the loss itself stayed finite


# -- no host sync inside a step ------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    """The messages of an exception and its causes."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 10:
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"amp_dtype": torch.bfloat16}, id="bf16-default-fused-adamw"),
        pytest.param(
            {
                "amp_dtype": torch.float16,
                "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
            },
            id="fp16-scaler-fused-adamw",
        ),
    ],
)
def test_no_host_sync_inside_a_step(settings: dict[str, Any], log_dir: Path) -> None:
    # Every step after the first (the optimizer creates its state there) runs under
    # set_sync_debug_mode("error"); the readback's one wait, an event's, is not flagged.
    with sync_errors(cuda=True) as checked:
        records = train(log_dir, epochs=2, max_grad_norm=1.0, **settings)
    steps = named(records, "train_step")
    assert len(steps) == 16 and len(checked) == 15
    assert all(s["loss"] == s["loss"] and not s["skipped"] for s in steps)


def test_the_sync_check_catches_the_non_fused_optimizers_host_read(log_dir: Path) -> None:
    """Guards the test above: a known per-step sync (fp16 with a non-fused optimizer reads
    the overflow flag on the host, ``core.loop.step``) is caught."""
    with sync_errors(cuda=True), pytest.raises(Exception) as info:  # causes read below
        train(
            log_dir,
            amp_dtype=torch.float16,
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
        )
    assert "synchronizing" in error_text(info.value)


# -- lagged readback = eager .item() -------------------------------------------------------


def test_lagged_readback_equals_eager_item(log_dir: Path, restore_cuda_settings: None) -> None:
    records = train(
        log_dir,
        amp_dtype=torch.float32,
        tf32=False,
        max_grad_norm=1.0,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    )
    steps = named(records, "train_step")
    model = make_model().to(CUDA)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    losses, norms = [], []
    for x, y in DataLoader(make_classification(256), batch_size=32):
        loss = nn.functional.cross_entropy(model(x.to(CUDA)), y.to(CUDA))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        losses.append(loss.item())  # the eager reference: a host sync per value
        norms.append(norm.item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert len(steps) == len(losses) == 8
    torch.testing.assert_close([s["loss"] for s in steps], losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close([s["grad_norm"] for s in steps], norms, rtol=1e-5, atol=1e-6)


# -- NVML against nvidia-smi ---------------------------------------------------------------


def smi(*fields: str, device: str | None = None) -> list[list[str]]:
    """``nvidia-smi --query-gpu`` rows (every board, or the one with UUID ``device``)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        pytest.skip("nvidia-smi is not on PATH")
    command = [tool, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if device is not None:
        command.append(f"--id={device}")
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines()]


def test_nvml_handles_are_torchs_devices_as_nvidia_smi_sees_them() -> None:
    pytest.importorskip("pynvml")
    nvml = load_nvml()
    nvml_acquire(nvml)
    try:
        boards = {row[0]: row for row in smi("uuid", "pci.bus_id", "name", "memory.total")}
        for index in range(torch.cuda.device_count()):
            handle = torch_device_handle(nvml, index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            assert uuid == f"GPU-{torch.cuda.get_device_properties(index).uuid}"
            _, bus_id, name, total_mib = boards[uuid]
            pci = nvml.nvmlDeviceGetPciInfo(handle).busId
            pci = pci.decode() if isinstance(pci, bytes) else str(pci)
            assert pci.upper().endswith(bus_id.upper()[-12:])  # domain widths differ
            assert name == torch.cuda.get_device_name(index)
            total = nvml.nvmlDeviceGetMemoryInfo(handle).total
            assert total // 2**20 == int(total_mib)
    finally:
        nvml_release(nvml)


def test_nvml_sampling_matches_nvidia_smi_and_sees_a_matmul_loop() -> None:
    monitor = GPUMonitor(device_indices=[0])
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    try:
        info = monitor.get_gpu_info()["devices"][0]
        ((total_mib,),) = smi("memory.total", device=uuid)
        assert info["total_memory"] // 2**20 == int(total_mib)
        a = torch.randn(8192, 8192, device=CUDA, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        torch.cuda.synchronize()
        done = threading.Event()

        def matmul_loop() -> None:
            while not done.is_set():  # keeps the queue full until both readers have looked
                for _ in range(50):
                    torch.mm(a, a, out=c)
                torch.cuda.current_stream().synchronize()  # a bounded queue, not a test sync

        worker = threading.Thread(target=matmul_loop)
        worker.start()
        try:
            time.sleep(1.5)  # NVML's utilisation covers the last 1/6 s to 1 s
            busy = monitor.sample()["devices"][0]
            ((smi_util,),) = smi("utilization.gpu", device=uuid)
        finally:
            done.set()
            worker.join()
        assert busy["util_pct"] >= 50, busy
        assert int(smi_util) >= 50
        assert busy["mem_used_bytes"] >= 2 * 8192 * 8192 * 2  # a and c are resident
    finally:
        monitor.close()


# -- the device settings a run applies and records ----------------------------------------


def test_a_run_applies_and_records_its_device_settings(
    log_dir: Path, restore_cuda_settings: None
) -> None:
    torch.cuda.empty_cache()
    records = train(log_dir, tf32=False, cudnn_benchmark=True, memory_fraction=0.5)
    (start,) = named(records, "run_start")
    settings = start["resolved"]["device_settings"]
    assert settings["cuda"] is True and settings["device"] == "cuda:0"
    assert settings["tf32_matmul"] is False and settings["tf32_cudnn"] is False
    assert settings["cudnn_benchmark"] is True and settings["memory_fraction"] == 0.5
    assert "memory_fraction" in settings["applied"]
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cudnn.benchmark is True
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError):  # the cap is real
        torch.empty(int(0.6 * total), dtype=torch.uint8, device=CUDA)


# -- DataParallel ----------------------------------------------------------------------------


def test_data_parallel_over_the_visible_devices_matches_one_gpu(
    log_dir: Path, restore_cuda_settings: None
) -> None:
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"DataParallel needs 2 or more visible GPUs; this machine shows {count}")
    settings: dict[str, Any] = {"amp_dtype": torch.float32, "tf32": False}
    parallel = train(
        log_dir / "dp", multi_gpu_config=MultiGPUConfig(training_mode="data_parallel"), **settings
    )
    single = train(log_dir / "one", **settings)
    (start,) = named(parallel, "run_start")
    assert start["resolved"]["strategy"]["training_mode"] == "data_parallel"
    torch.testing.assert_close(
        [s["loss"] for s in named(parallel, "train_step")],
        [s["loss"] for s in named(single, "train_step")],
        rtol=1e-4,
        atol=1e-5,
    )
