"""Bad user input fails early and clearly: a ConfigError naming the field and the bad value
at creation, or a LossFormatError at the first step (findings of a fault-injection pass)."""

from __future__ import annotations

import asyncio
import functools
import math
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from core import ConfigError, LossFormatError, create_optimized_training_optimizer
from core.checkpointing.checkpointer import CheckpointConfig
from core.config import EarlyStoppingConfig, RunConfig
from core.distributed.config import MultiGPUConfig
from core.hardware.settings import GPUManagerConfig
from core.loop.recovery import ErrorHandlerConfig
from core.monitoring.config import GPUMonitorConfig
from core.precision.config import LossScalerConfig, MixedPrecisionConfig
from core.stopping.early_stopping import EarlyStopping
from tests.helpers import loaders, make_classification, make_model

pytestmark = pytest.mark.anyio


def build(where: Path, **kwargs: Any) -> Any:
    train_loader, val_loader = loaders(n=64)
    defaults: dict[str, Any] = {
        "model": make_model(),
        "train_loader": train_loader,
        "val_loader": val_loader,
        "experiment_name": "bad",
        "max_epochs": 2,
        "log_dir": where,
    }
    return create_optimized_training_optimizer(**(defaults | kwargs))


def named(field: str, value: object) -> str:
    """The start of a config error: the field and the bad value's repr."""
    return re.escape(f"{field}={value!r} is invalid")


SCALER_FIELDS = (
    "amp_init_scale",
    "amp_growth_factor",
    "amp_backoff_factor",
    "amp_growth_interval",
    "amp_hysteresis",
    "amp_min_scale",
    "amp_max_scale",
)


# -- flags ---------------------------------------------------------------------------------
FACTORY_FLAGS = (
    "enable_amp",
    "enable_grad_scaler",
    "handle_signals",
    "use_distributed_sampler",
    "tf32",
    "cudnn_benchmark",
)


@pytest.mark.parametrize("value", ["no", "False", None, 1])
@pytest.mark.parametrize("field", FACTORY_FLAGS)
def test_factory_flags_take_only_true_or_false(log_dir: Path, field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=named(field, value) + r".*allowed: True, False"):
        build(log_dir, **{field: value})


CONFIGS_WITH_FLAGS = (
    RunConfig,
    CheckpointConfig,
    GPUMonitorConfig,
    LossScalerConfig,
    MixedPrecisionConfig,
    MultiGPUConfig,
    ErrorHandlerConfig,
    GPUManagerConfig,
)


@pytest.mark.parametrize(
    ("config", "field"),
    [(c, f.name) for c in CONFIGS_WITH_FLAGS for f in fields(c) if f.type == "bool"],
)
def test_every_bool_field_of_every_config_refuses_strings_and_none(
    config: type[Any], field: str
) -> None:
    for value in ("no", None):
        with pytest.raises(ConfigError, match=named(field, value)):
            config(**{field: value})


# -- numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field",
    [
        "max_epochs",
        "learning_rate",
        "weight_decay",
        "early_stopping_patience",
        "early_stopping_min_delta",
        "max_grad_norm",
        "seed",
        "event_buffer_size",
        "log_flush_interval_s",
        "monitor_interval_s",
        "stop_grace_s",
        "data_stall_warn_s",
        *SCALER_FIELDS,
        "max_consecutive_nonfinite",
        "memory_fraction",
    ],
)
def test_true_is_not_a_number(log_dir: Path, field: str) -> None:
    with pytest.raises(ConfigError, match=named(field, True)):
        build(log_dir, **{field: True})


@pytest.mark.parametrize("field", SCALER_FIELDS)
@pytest.mark.parametrize("value", ["x", None])
def test_scaler_fields_refuse_non_numbers(log_dir: Path, field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=named(field, value)):
        build(log_dir, **{field: value})


@pytest.mark.parametrize(
    "field", ["amp_init_scale", "amp_growth_factor", "amp_min_scale", "amp_max_scale"]
)
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_scaler_fields_must_be_finite(log_dir: Path, field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=named(field, value) + ".*finite"):
        build(log_dir, **{field: value})


def test_a_max_scale_below_the_default_min_scale_blames_max_scale(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=named("amp_max_scale", 0.5) + r".*>= amp_min_scale=1\.0"):
        build(log_dir, amp_max_scale=0.5)
    with pytest.raises(ConfigError, match=named("amp_min_scale", 2.0**30) + ".*amp_max_scale="):
        build(log_dir, amp_min_scale=2.0**30, amp_init_scale=2.0**30)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", "x"),
        ("timeout_s", True),
        ("timeout_s", math.inf),
        ("bucket_cap_mb", "x"),
        ("stop_vote_interval", True),
        ("world_size", True),
        ("device_ids", 0),
        ("device_ids", [True]),
        ("init_method", None),
    ],
)
def test_multi_gpu_config_fields(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=named(field, value)):
        MultiGPUConfig(**{field: value})


def test_error_handler_config_counts_are_not_booleans() -> None:
    with pytest.raises(ConfigError, match=named("max_consecutive_nonfinite", True)):
        ErrorHandlerConfig(max_consecutive_nonfinite=True)


# -- component configs and paths -----------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("gradient_accumulation_config", 4, "GradientAccumulationConfig(accumulation_steps=4)"),
        ("multi_gpu_config", "cpu", "MultiGPUConfig(training_mode='cpu')"),
        ("error_handler_config", {"skip_nonfinite": False}, "ErrorHandlerConfig(**"),
        ("log_dir", None, "log_dir='logs'"),
        ("log_dir", 5, "log_dir='logs'"),
        ("log_dir", "", "log_dir='logs'"),
        ("checkpoint_dir", 5, "checkpoint_dir='checkpoints'"),
    ],
)
def test_wrong_types_of_parts_are_named(log_dir: Path, field: str, value: object, fix: str) -> None:
    with pytest.raises(ConfigError, match=named(field, value) + ".*" + re.escape(fix)):
        build(log_dir, **{field: value})


def test_log_dir_that_is_a_file_is_refused_at_creation(tmp_path: Path) -> None:
    file = tmp_path / "logs"
    file.write_text("not a directory")
    with pytest.raises(ConfigError, match=named("log_dir", file) + ".*is a file"):
        build(file)
    with pytest.raises(ConfigError, match=named("log_dir", file / "sub") + ".*cannot be created"):
        build(file / "sub")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_log_dir_is_refused_at_creation(tmp_path: Path) -> None:
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        with pytest.raises(
            ConfigError, match=named("log_dir", read_only) + ".*no file can be written"
        ):
            build(read_only)
    finally:
        read_only.chmod(0o755)


@pytest.fixture
def read_only_later(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], object]]]:
    """A log directory, and how to make it read-only later: chmod, or for root (who writes
    anywhere) a tmpfs remounted read-only (skipped where none can be mounted)."""
    where = tmp_path / "logs"
    where.mkdir()
    if os.geteuid() != 0:
        yield where, lambda: where.chmod(0o555)
        where.chmod(0o755)
        return
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)]
    mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"root writes anywhere, and no tmpfs mounts here: {mounted.stderr.strip()}")
    remount = ["mount", "-o", "remount,ro", str(where)]
    try:
        yield where, lambda: subprocess.run(remount, check=True)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and mounts")
def test_a_log_dir_made_read_only_after_creation_is_refused_by_train(
    read_only_later: tuple[Path, Callable[[], object]],
) -> None:
    where, make_read_only = read_only_later
    job = build(where)
    make_read_only()
    with pytest.raises(ConfigError, match=named("log_dir", where) + ".*no file can be written"):
        asyncio.run(job.train())


def test_missing_log_dir_is_created_and_left_clean(log_dir: Path) -> None:
    build(log_dir / "new")
    assert list((log_dir / "new").iterdir()) == []


# -- user parts ----------------------------------------------------------------------------
def test_a_loss_class_instead_of_an_instance_says_to_instantiate_it(log_dir: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"loss_fn=<class .*CrossEntropyLoss'>.*pass an instance, nn\.CrossEntropyLoss\(\)",
    ):
        build(log_dir, loss_fn=nn.CrossEntropyLoss)


def test_an_optimizer_instance_is_refused_with_a_factory_example(log_dir: Path) -> None:
    instance = torch.optim.SGD(make_model().parameters(), lr=0.1)
    with pytest.raises(
        ConfigError, match=r"optimizer=<torch\.optim\.sgd\.SGD object> is invalid.*lambda params"
    ):
        build(log_dir, optimizer=instance)


def test_a_failing_scheduler_factory_is_named_and_chained(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"scheduler=.*raised TypeError") as caught:
        build(log_dir, scheduler=torch.optim.lr_scheduler.StepLR)  # needs step_size
    assert isinstance(caught.value.__cause__, TypeError)


def test_a_plateau_scheduler_of_the_wrong_mode_is_refused(log_dir: Path) -> None:
    def plateau(optimizer: torch.optim.Optimizer) -> object:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max")

    with pytest.raises(
        ConfigError, match=r"scheduler=\"ReduceLROnPlateau\(mode='max'\)\".*mode='min'.*val_loss"
    ):
        build(log_dir, scheduler=plateau)


def test_a_training_step_beside_a_loss_fn_is_refused(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"loss_fn=.*None when training_step is given"):
        build(log_dir, loss_fn=nn.MSELoss(), training_step=lambda model, batch: model(batch[0]))
    with pytest.raises(ConfigError, match=r"training_step=3 is invalid.*\(model, batch\)"):
        build(log_dir, training_step=3)


def test_an_optimizer_over_no_parameters_is_refused(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"optimizer=.*holds no parameters"):
        build(log_dir, optimizer=lambda _: torch.optim.SGD([{"params": []}], lr=0.1))
    with pytest.raises(ConfigError, match=r"optimizer=.*raised ValueError: .*empty"):
        build(log_dir, optimizer=lambda _: torch.optim.SGD([], lr=0.1))


def test_an_optimizer_over_other_parameters_is_refused(log_dir: Path) -> None:
    other = make_model()
    with pytest.raises(ConfigError, match=r"optimizer=.*4 of its 4 parameters are not the model"):
        build(log_dir, optimizer=lambda _: torch.optim.SGD(other.parameters(), lr=0.1))


def regression_loader(shape: tuple[int, ...]) -> DataLoader[Any]:
    x = torch.randn(32, 8)
    return DataLoader(TensorDataset(x, torch.randn(32, *shape)), batch_size=8)


@pytest.mark.parametrize(
    ("classes", "target_shape"), [(1, (1,)), (2, ())], ids=["regression", "classifier"]
)
async def test_float_targets_with_the_default_loss_stop_at_the_first_step(
    log_dir: Path, classes: int, target_shape: tuple[int, ...]
) -> None:
    optimizer = build(
        log_dir,
        model=make_model(classes=classes),
        train_loader=regression_loader(target_shape),
        val_loader=None,
    )
    with pytest.raises(LossFormatError, match=r"dtype=torch\.float32.*loss_fn=nn\.MSELoss\(\)"):
        await optimizer.train()
    assert optimizer.global_step == 0


async def test_float_targets_train_with_an_explicit_loss(log_dir: Path) -> None:
    optimizer = build(
        log_dir,
        model=make_model(classes=1),
        train_loader=regression_loader((1,)),
        val_loader=None,
        loss_fn=nn.MSELoss(),
    )
    assert (await optimizer.train()).global_step == 8


# -- loaders -------------------------------------------------------------------------------
class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset without ``__len__``: its DataLoader's len() raises TypeError."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from make_classification(64)


async def test_a_loader_over_an_iterable_dataset_without_len_is_streamed(log_dir: Path) -> None:
    loader: DataLoader[Any] = DataLoader(Stream(), batch_size=16)
    with pytest.raises(TypeError):
        len(loader)
    results = await build(log_dir, train_loader=loader, val_loader=loader).train()
    assert results.epochs_completed == 2 and results.global_step == 8


def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    yield from loaders(n=64)[0]


@pytest.mark.parametrize("field", ["train_loader", "val_loader"])
def test_a_generator_is_refused_when_it_would_run_out_after_one_epoch(
    log_dir: Path, field: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{field}=<generator .*one-shot iterator"):
        build(log_dir, **{field: batches()})


async def test_a_generator_is_fine_for_one_epoch(log_dir: Path) -> None:
    results = await build(log_dir, train_loader=batches(), val_loader=None, max_epochs=1).train()
    assert results.global_step == 2


# -- early stopping ------------------------------------------------------------------------
def test_nan_is_never_the_best_value_and_counts_as_a_bad_check_without_check_finite() -> None:
    stopper = EarlyStopping(EarlyStoppingConfig(patience=2, check_finite=False))
    judge = functools.partial(stopper.judge, epochs=1, steps=1)
    assert judge(math.nan) is None
    assert stopper.best == math.inf and stopper.bad_epochs == 1
    assert judge(1.0) is None and stopper.best == 1.0
    assert judge(math.nan) is None
    assert judge(math.nan) is not None
    assert stopper.best == 1.0


def test_unwritable_log_dir_is_refused_at_creation_even_as_root(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("core.checks.tempfile.NamedTemporaryFile", refuse)
    with pytest.raises(
        ConfigError, match=named("log_dir", log_dir) + ".*no file can be written.*Permission"
    ):
        build(log_dir)


# -- checkpoints and resuming ------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"keep_last_n": True}, named("keep_last_n", True)),
        ({"save_on_cancel": "no"}, named("save_on_cancel", "no")),
        ({"resume": "Auto"}, r"resume='Auto' is invalid.*write resume='auto' in lower case"),
        ({"resume": "/nonexistent"}, r"resume='/nonexistent' is invalid.*no such directory"),
        ({"checkpoint_dir": 5}, named("checkpoint_dir", 5)),
        (
            {
                "max_consecutive_nonfinite": 3,
                "error_handler_config": ErrorHandlerConfig(max_consecutive_nonfinite=5),
            },
            r"max_consecutive_nonfinite=3 is invalid; allowed: a setting given once, but "
            r"error_handler_config sets errors.max_consecutive_nonfinite too",
        ),
    ],
)
def test_checkpoint_settings_are_checked_at_creation(
    log_dir: Path, kwargs: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        build(log_dir, **kwargs)


def test_a_checkpoint_dir_that_is_a_file_is_refused_at_creation(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"checkpoint_dir=.*is a file, not a directory"):
        build(tmp_path / "logs", checkpoint_dir=tmp_path / "file")


def test_accumulation_steps_true_is_not_a_count() -> None:
    from core import GradientAccumulationConfig

    with pytest.raises(ConfigError, match=named("accumulation_steps", True)):
        GradientAccumulationConfig(accumulation_steps=True)  # type: ignore[arg-type]


async def test_resume_with_another_learning_rate_is_refused_naming_it(log_dir: Path) -> None:
    from core import IncompatibleCheckpointError

    await build(log_dir).train()
    again = build(log_dir, resume="strict", learning_rate=1e-2)  # "auto" starts a new run
    with pytest.raises(IncompatibleCheckpointError, match=r"learning_rate \(checkpoint 0.001"):
        await again.train()


async def test_resume_into_a_model_of_other_shapes_names_the_first_key(log_dir: Path) -> None:
    from core import IncompatibleCheckpointError

    await build(log_dir).train()
    twin = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    twin[2].weight = nn.Parameter(torch.zeros(1, 32))  # 32 values as before, another shape
    again = build(log_dir, resume="strict", model=twin)
    with pytest.raises(
        IncompatibleCheckpointError,
        match=r"differs at '2.weight' \(checkpoint shape \[2, 16\], now shape \[1, 32\]\)",
    ):
        await again.train()


async def test_a_nan_validation_loss_is_an_error_record_and_never_the_best(log_dir: Path) -> None:
    class NaNInEval(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net(x)
            return out if self.training else out * math.nan

    # check_finite=False: a NaN is a bad check, not a stop (by default it stops at once).
    optimizer = build(log_dir, model=NaNInEval(), early_stopping_patience=5, check_finite=False)
    results = await optimizer.train()
    assert results.best_val_loss is None and math.isnan(results.val_loss)
    lines = (optimizer.run_dir / "events.jsonl").read_text().splitlines()
    errors = [x for x in lines if '"nonfinite_validation_loss"' in x]
    assert len(errors) == 2  # one per epoch
    assert optimizer._built.early_stopping.bad_epochs == 2


async def test_train_after_a_failed_start_is_not_already_running(tmp_path: Path) -> None:
    optimizer = build(tmp_path / "logs")
    await optimizer.start()  # built (inside a running loop the factory leaves that to here)
    (tmp_path / "logs").rename(tmp_path / "moved")
    (tmp_path / "logs").write_text("now a file")  # opening the run fails
    with pytest.raises(ConfigError, match=named("log_dir", tmp_path / "logs") + ".*is a file"):
        await optimizer.train()
    (tmp_path / "logs").unlink()
    results = await optimizer.train()  # not "already running"
    assert results.epochs_completed == 2


async def test_events_subscribed_after_the_run_ended_end_at_once(log_dir: Path) -> None:
    import anyio

    optimizer = build(log_dir)
    await optimizer.train()
    with anyio.fail_after(5):
        late = [record async for record in optimizer.events()]
    assert late == []
