"""The config tree, the seed factory's one table onto it, and the orchestrator as an async
resource taking optimizer and scheduler instances."""

from __future__ import annotations

import asyncio
import json
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch

from core import (
    CheckpointConfig,
    ConfigError,
    ErrorHandlerConfig,
    LossScalerConfig,
    MixedPrecisionConfig,
    MultiGPUConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
    create_optimized_training_optimizer,
)
from core.facades.flat import (
    FLAT_KEYWORDS,
    SECTION_KEYWORDS,
    SEED_ALIASES,
    FlatSettings,
    config_from_flat,
)
from tests import flat_settings_gen
from tests.helpers import loaders, make_model

pytestmark = pytest.mark.anyio


def leaf_paths(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    for f in fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        out += leaf_paths(value, path + ".") if hasattr(value, "__dataclass_fields__") else [path]
    return out


def test_the_flat_table_is_read_from_the_tree_and_its_typed_keywords_drawn_from_it() -> None:
    difference = flat_settings_gen.difference()
    assert difference == "", (
        f"core/facades/flat_settings.py differs from the tree: run "
        f"`{flat_settings_gen.COMMAND}`\n{difference}"
    )
    assert FLAT_KEYWORDS["amp_dtype"] == "precision.dtype"  # declared on the field
    assert SEED_ALIASES["batch_size"] == "micro_batch_size"
    assert SECTION_KEYWORDS["multi_gpu_config"] == "distributed"
    assert set(FLAT_KEYWORDS.values()) <= set(leaf_paths(TrainingConfig()))
    assert set(typing.get_type_hints(FlatSettings)) == (
        FLAT_KEYWORDS.keys() | SECTION_KEYWORDS.keys() | SEED_ALIASES.keys()
    )


def test_every_leaf_is_reachable_through_config_and_round_trips_through_json() -> None:
    config = TrainingConfig().replace(
        {
            "run.max_epochs": 3,
            "precision.cache_enabled": False,
            "precision.scaler.consecutive_hysteresis": True,
            "monitor.history_size": 10,
            "checkpoint.keep_last_n": 5,
            "logging.flush_interval_s": 0.5,
        }
    )
    assert config.precision.cache_enabled is False and config.monitor.history_size == 10
    again = TrainingConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.to_dict() == config.to_dict()
    assert set(leaf_paths(config)) == {p for p, _ in _flatten(config.to_dict())}


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        ({"precision.scaler.min_scale": 0.0}, r"^precision\.scaler\.min_scale=0\.0 is invalid"),
        ({"run.max_epochs": 0}, r"^run\.max_epochs=0 is invalid; allowed: an integer >= 1"),
        ({"run.nope": 1}, r"^run\.nope=1 is invalid; allowed: a field of run: experiment_name"),
        ({"checkpoint.keep_last_n": True}, r"^checkpoint\.keep_last_n=True is invalid"),
    ],
)
def test_a_nested_error_names_its_dotted_path(values: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        TrainingConfig().replace(values)
    with pytest.raises(ConfigError, match=pattern):
        TrainingConfig.from_dict(_nest(values))


def _nest(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in values.items():
        *sections, leaf = path.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out


def test_a_section_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^run=5 is invalid; allowed: a RunConfig"):
        TrainingConfig(run=5)  # type: ignore[arg-type]


def test_flat_keywords_land_on_their_leaves() -> None:
    config = config_from_flat(
        {
            "amp_dtype": "bf16",
            "amp_hysteresis": 2,
            "keep_last_n": 4,
            "max_epochs": 2,
            "checkpoint_safe_globals": [Path],
        }
    )
    assert config.precision.dtype == "bf16" and config.precision.scaler.hysteresis == 2
    assert config.checkpoint.keep_last_n == 4 and config.run.max_epochs == 2
    assert list(config.checkpoint.safe_globals) == [Path]


@pytest.mark.parametrize(
    ("settings", "config", "pattern"),
    [
        (
            {
                "max_consecutive_nonfinite": 3,
                "error_handler_config": ErrorHandlerConfig(max_consecutive_nonfinite=5),
            },
            None,
            r"^max_consecutive_nonfinite=3 is invalid; allowed: a setting given once, but "
            r"error_handler_config sets errors\.max_consecutive_nonfinite too",
        ),
        (
            {"max_epochs": 2},
            TrainingConfig(run=RunConfig(max_epochs=5)),
            r"^max_epochs=2 is invalid; allowed: a setting given once, but config sets "
            r"run\.max_epochs too",
        ),
        (
            {"mixed_precision_config": MixedPrecisionConfig()},
            TrainingConfig(precision=MixedPrecisionConfig(dtype="bf16")),
            r"^mixed_precision_config=.* config sets precision\.dtype too",
        ),
        (
            {
                "amp_init_scale": 8.0,
                "mixed_precision_config": MixedPrecisionConfig(
                    scaler=LossScalerConfig(init_scale=2.0**12)
                ),
            },
            None,
            r"^amp_init_scale=8\.0 is invalid; .*mixed_precision_config sets precision\.scaler",
        ),
    ],
)
def test_the_same_setting_given_twice_raises_naming_both(
    settings: dict[str, Any], config: TrainingConfig | None, pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        config_from_flat(settings, config)


def test_a_flat_keyword_sets_a_leaf_a_section_object_leaves_at_its_default() -> None:
    # The object holds every field, but the user wrote only training_mode into it: devices=2
    # beside it is no clash ("multi_gpu_config sets distributed.devices too" said it was).
    config = config_from_flat(
        {
            "devices": 2,
            "multi_gpu_config": MultiGPUConfig(training_mode="cpu"),
            "max_consecutive_nonfinite": 3,
            "error_handler_config": ErrorHandlerConfig(),
        }
    )
    assert config.distributed.devices == 2 and config.distributed.training_mode == "cpu"
    assert config.errors.max_consecutive_nonfinite == 3


def test_config_and_flat_keywords_combine_when_they_set_different_leaves(log_dir: Path) -> None:
    train, _ = loaders(n=64)
    base = TrainingConfig(checkpoint=CheckpointConfig(keep_last_n=3))
    job = create_optimized_training_optimizer(
        model=make_model(), train_loader=train, config=base, max_epochs=1, log_dir=log_dir
    )
    assert job.config.checkpoint.keep_last_n == 3 and job.config.run.max_epochs == 1
    job.close()


def test_an_unknown_keyword_suggests_the_near_one() -> None:
    train, _ = loaders(n=64)
    with pytest.raises(TypeError, match=r"'max_epoch'; did you mean 'max_epochs'\?"):
        create_optimized_training_optimizer(model=make_model(), train_loader=train, max_epoch=2)  # type: ignore[call-arg]


def test_a_loss_scaler_error_from_a_flat_keyword_names_the_flat_siblings() -> None:
    with pytest.raises(ConfigError, match=r"^amp_max_scale=0\.5 is invalid.*>= amp_min_scale=1\.0"):
        config_from_flat({"amp_max_scale": 0.5})


# -- the orchestrator as a resource, with instances --------------------------------------------
async def test_async_with_builds_on_enter_trains_and_releases_on_exit(log_dir: Path) -> None:
    train, val = loaders(n=128)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    config = TrainingConfig(run=RunConfig(max_epochs=2, log_dir=log_dir, experiment_name="res"))
    run = OptimizedTrainingOptimizer(
        config,
        model=model,
        train_loader=train,
        val_loader=val,
        optimizer=optimizer,
        scheduler=scheduler,
    )
    with pytest.raises(RuntimeError, match="not built yet"):
        _ = run.rank
    before = [p.detach().clone() for p in model.parameters()]
    async with run:
        assert (run.rank, run.world_size, run.is_global_zero) == (0, 1, True)
        assert run.optimizer is optimizer and run.scheduler is scheduler  # the user's own
        results = await run.train()
    assert results.global_step == 8 and run.run_dir == results.run_dir
    assert scheduler.last_epoch == 8 and optimizer.param_groups[0]["lr"] == 0.1 * 0.5**8
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    start = json.loads((results.run_dir / "events.jsonl").read_text().splitlines()[0])
    assert start["resolved"]["optimizer"] == "SGD" and start["config"]["run"]["max_epochs"] == 2


async def test_train_without_async_with_builds_first(log_dir: Path) -> None:
    train, _ = loaders(n=64)
    config = TrainingConfig(run=RunConfig(max_epochs=1, log_dir=log_dir))
    run = OptimizedTrainingOptimizer(config, model=make_model(), train_loader=train)
    assert (await run.train()).global_step == 2
    await run.aclose()


def test_instances_that_do_not_fit_the_run_are_refused_at_creation(log_dir: Path) -> None:
    train, _ = loaders(n=64)
    model, other = make_model(), make_model()
    config = TrainingConfig(run=RunConfig(log_dir=log_dir))
    foreign = torch.optim.SGD(other.parameters(), lr=0.1)
    with pytest.raises(
        ConfigError, match=r"^optimizer=.* 4 of its 4 parameters are not the model's"
    ):
        OptimizedTrainingOptimizer(config, model=model, train_loader=train, optimizer=foreign)
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    elsewhere = torch.optim.lr_scheduler.StepLR(foreign, step_size=1)
    run = OptimizedTrainingOptimizer(
        config, model=model, train_loader=train, optimizer=own, scheduler=elsewhere
    )
    with pytest.raises(ConfigError, match=r"^scheduler=.* it drives another optimizer"):
        run.build()


def test_build_runs_off_the_event_loop_thread(log_dir: Path) -> None:
    train, _ = loaders(n=64)
    config = TrainingConfig(run=RunConfig(max_epochs=1, log_dir=log_dir))
    run = OptimizedTrainingOptimizer(config, model=make_model(), train_loader=train)
    threads: list[bool] = []
    original = run.build

    def spy() -> None:
        threads.append(asyncio_thread() is None)
        original()

    run.build = spy  # type: ignore[method-assign]

    async def main() -> None:
        async with run:
            pass

    asyncio.run(main())
    assert threads == [True]  # no running event loop in the thread that built


def asyncio_thread() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def test_a_loss_scaler_config_section_reaches_the_run(log_dir: Path) -> None:
    train, _ = loaders(n=64)
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        max_epochs=1,
        log_dir=log_dir,
        mixed_precision_config=MixedPrecisionConfig(
            dtype="fp16", scaler=LossScalerConfig(init_scale=2.0**8)
        ),
    )
    await job.train()
    assert job.mixed_precision.get_amp_stats()["current_scale"] == 2.0**8


def test_a_seed_alias_sets_its_leaf_and_clashes_with_its_flat_keyword() -> None:
    config = config_from_flat({"enable_mixed_precision": False, "batch_size": 16})
    assert config.precision.enable_amp is False
    assert config.accumulation.micro_batch_size == 16
    with pytest.raises(ConfigError, match=r"enable_mixed_precision.*enable_amp sets it too"):
        config_from_flat({"enable_mixed_precision": False, "enable_amp": True})
    with pytest.raises(ConfigError, match="batch_size=0"):
        config_from_flat({"batch_size": 0})
