"""``core-train fit``, run: the factories called, the recipes built around the model, the
orchestrator driven to the end, and the outcome printed (this is a program: it prints)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from core.cli.experts import expert_model_problem, experts_refused, with_experts
from core.cli.factories import (
    EXAMPLES,
    BuiltModel,
    DataFactory,
    ModelFactory,
    example_factories,
    factory_at,
    model_record,
    parse_model_args,
    step_at,
)
from core.cli.fit import fit_in_ranks, fit_parser, flag_error, resolve_config
from core.cli.parser import Parser, given
from core.cli.recipes import install_batch_transforms, loss_function, scheduler_factory
from core.cli.toml import dumps
from core.config import TrainingConfig
from core.data import auto_num_workers
from core.distributed.environment import DistributedEnvironment
from core.errors import ConfigError, CoreError, SignalReceived
from core.facades.optimized_training_optimizer import OptimizedTrainingOptimizer
from core.reports.read import numbers, read_events
from core.reports.sections import memory_section
from core.rng import seed_everything
from core.trainer.state.results import TrainingResults

__all__ = ("FitOutcome", "run_fit")


def _factories(
    namespace: argparse.Namespace, parser: Parser
) -> tuple[str, ModelFactory, DataFactory]:
    """The model factory's import path, the model factory and the data factory."""
    try:
        if namespace.example:
            if namespace.model or namespace.data:
                parser.error("--example and --model/--data both say what to train; give one")
            return (EXAMPLES[namespace.example][0], *example_factories(namespace.example))
        if not (namespace.model and namespace.data):
            parser.error(
                f"nothing to train: give --example {{{','.join(EXAMPLES)}}}, or --model "
                "MODULE:FACTORY and --data MODULE:FACTORY (see --help)"
            )
        flag, spec = "--model", namespace.model
        model = factory_at(spec)
        flag, spec = "--data", namespace.data
        return namespace.model, model, factory_at(spec)
    except ValueError as exc:
        if namespace.example:
            parser.error(f"--example {exc}")
        parser.error(f"{flag} {spec!r}: {exc}")


def _steps(namespace: argparse.Namespace, parser: Parser) -> dict[str, str]:
    """``training_step``/``validation_step`` for the run: the import paths the flags name,
    checked before any data is made, so a bad one exits 2 naming its flag; the run imports
    them by name (in whichever process trains)."""
    steps: dict[str, str] = {}
    for flag, name in (
        ("--training-step", "training_step"),
        ("--validation-step", "validation_step"),
    ):
        spec = getattr(namespace, name)
        if spec is None:
            continue
        try:
            steps[name] = step_at(spec)
        except ValueError as exc:
            parser.error(f"{flag} {spec!r}: {exc}")
    loss_flags = [
        flag
        for flag, value in (
            ("--focal-loss", namespace.focal_loss),
            ("--label-smoothing", namespace.label_smoothing),
            ("--mixup", namespace.mixup is not None),
        )
        if value
    ]
    if "training_step" in steps and loss_flags:
        parser.error(
            f"--training-step {namespace.training_step!r} computes the loss itself, so "
            f"{', '.join(loss_flags)} cannot reach it; allowed: one of the two. Fix: compute "
            "that loss in the step, or drop --training-step."
        )
    return steps


def _workers(config: TrainingConfig, env: DistributedEnvironment | None) -> int:
    workers = config.data.loader.num_workers
    if workers >= 0:
        return workers
    cuda = torch.cuda.is_available() and config.distributed.training_mode != "cpu"
    local = env.local_world_size if env is not None else 1
    return auto_num_workers("cuda" if cuda else "cpu", world_size=local)


def _parts(namespace: argparse.Namespace, parser: Parser, config: TrainingConfig) -> dict[str, Any]:
    """The runtime objects of the run: loaders, model (a :class:`BuiltModel`), loss and
    scheduler."""
    spec, model_factory, data_factory = _factories(namespace, parser)
    steps = _steps(namespace, parser)
    try:
        kwargs = parse_model_args(namespace.model_arg)
    except ValueError as exc:
        parser.error(f"--model-arg {exc}")
    experts = getattr(namespace, "experts", None)
    try:
        kwargs = with_experts(kwargs, experts, model_factory)
        made_by = model_record(spec, kwargs)  # what the run's checkpoints record
    except ValueError as exc:
        parser.error(str(exc))
    try:
        env = DistributedEnvironment.from_environ()
    except ConfigError as exc:
        parser.error(str(exc))
    if config.run.seed is not None:
        seed_everything(config.run.seed)  # the model's initial weights and the data's order
    source = f"--example {namespace.example}" if namespace.example else "--model/--data"
    try:
        workers = _workers(config, env)
        loaders = data_factory(batch_size=namespace.batch_size, num_workers=workers)
        model = model_factory(**kwargs)
    except ImportError as exc:  # a missing extra (scikit-learn...): say which, exit 2
        parser.error(f"{source}: {exc}")
    except TypeError as exc:  # a factory taking **kwargs that passed experts= on
        if experts is None or "experts" not in str(exc):
            raise
        parser.error(experts_refused(experts, model_factory, exc))
    if not (isinstance(loaders, tuple) and len(loaders) == 2):
        parser.error(
            f"--data: the data factory returned a {type(loaders).__name__}; allowed: a pair "
            "(train_loader, val_loader or None)"
        )
    train_loader, val_loader = loaders
    if not isinstance(model, nn.Module):
        parser.error(f"--model: the factory returned a {type(model).__name__}, not an nn.Module")
    if config.distributed.training_mode == "expert_parallel":
        flag = given(namespace).get("distributed.training_mode", ("training_mode", None))[0]
        problem = expert_model_problem(model, flag)
        if problem is not None:
            parser.error(problem)
    world = env.world_size if env is not None and config.data.use_distributed_sampler else 1
    try:
        install_batch_transforms(
            train_loader, model, mixup=namespace.mixup, randaugment=namespace.randaugment
        )
        loss = loss_function(
            focal=namespace.focal_loss,
            label_smoothing=namespace.label_smoothing,
            soft_targets=namespace.mixup is not None,
        )
        scheduler = scheduler_factory(namespace.scheduler, config, train_loader, world)
    except ValueError as exc:
        parser.error(str(exc))
    return {
        "model": BuiltModel(made_by, model),
        "train_loader": train_loader,
        "val_loader": val_loader,
        "loss_fn": loss,
        "scheduler": scheduler,
        **steps,
    }


async def _train(config: TrainingConfig, parts: dict[str, Any]) -> tuple[TrainingResults, int]:
    async with OptimizedTrainingOptimizer(config, **parts) as run:
        results = await run.train()
        return results, run.rank


def _outcome(
    results: TrainingResults, argv: Sequence[str], config: TrainingConfig, monitor_gpu: bool
) -> None:
    """Write ``results.json`` into the run directory (a ``--fast-dev-run`` keeps none) and
    print where the run's files are, and the end summary unless a progress display showed it."""
    run_dir = results.run_dir
    if run_dir is None:
        print(
            "run directory: none (a --fast-dev-run keeps no files; "
            "--keep-fast-dev-run-files keeps them)"
        )
    else:
        summary = results.to_dict() | {"command": ["core-train", *argv]}
        (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"run directory: {run_dir}")
    if not config.logging.progress:  # else the progress display printed the end summary
        _print_summary(results, config.logging.reports)
    elif run_dir is not None:
        print(f"results: {run_dir / 'results.json'}")
    if monitor_gpu and run_dir is not None:
        _print_gpu(run_dir)


def _print_summary(results: TrainingResults, reports: bool) -> None:
    run_dir = results.run_dir

    def show(value: float | None, digits: int = 4) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    print(
        f"epochs={results.epochs_completed} steps={results.global_step} "
        f"train_loss={show(results.train_loss)} val_loss={show(results.val_loss)} "
        f"val_accuracy={show(results.val_accuracy)} samples/s={show(results.samples_per_s, 1)}"
    )
    if results.best_checkpoint:
        print(
            f"best checkpoint ({results.monitor}={show(results.best_value)}): "
            f"{results.best_checkpoint}"
        )
    if run_dir is None:
        return
    print(f"results: {run_dir / 'results.json'}")
    if reports:
        files = [run_dir / n for n in ("performance_summary.txt", "training_metrics.png")]
        print("reports (written in the background): " + ", ".join(map(str, files)))


def _print_gpu(run_dir: Path) -> None:
    records = read_events(run_dir / "events.jsonl")
    print("GPU monitor:")
    for line in memory_section(records):
        print(line)
    util = list(numbers(records, "gpu_sample", "util_pct"))
    host = all(r.get("source") == "psutil" for r in records if r.get("event") == "gpu_sample")
    if util:
        label = "mean CPU utilisation" if host else "mean GPU utilisation"
        print(f"  {label:<24}{sum(util) / len(util):.1f} % over {len(util)} samples")


@dataclass(frozen=True)
class FitOutcome:
    """What ``fit`` ended with: the exit status, and the results where training finished
    (on every rank; ``rank`` says which this is)."""

    exit_code: int
    results: TrainingResults | None = None
    rank: int = 0


def run_fit(argv: Sequence[str]) -> FitOutcome:
    """Parse ``argv``, train, print where the run's files are (rank 0)."""
    parser = fit_parser()
    namespace = parser.parse(argv)
    config = resolve_config(namespace, parser)
    if namespace.print_config:
        print(dumps(config), end="")
        return FitOutcome(0)
    launched = fit_in_ranks(config, argv, namespace, parser)  # --devices N: N ranks of this
    if launched is not None:
        return FitOutcome(launched)
    parts = _parts(namespace, parser, config)
    try:
        results, rank = anyio.run(_train, config, parts)
    except SignalReceived as stopped:  # the stop checkpoint is written: --resume auto
        env = DistributedEnvironment.from_environ()
        if env is None or env.rank == 0:  # every rank stopped alike: one of them says so
            print(f"core-train: {stopped}", file=sys.stderr)
        return FitOutcome(stopped.exit_code)
    except ConfigError as exc:
        print(f"core-train: error: {flag_error(exc, namespace, None)}", file=sys.stderr)
        return FitOutcome(2)
    except CoreError as exc:
        print(f"core-train: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FitOutcome(1)
    if rank == 0:
        _outcome(results, argv, config, namespace.monitor_gpu)
    return FitOutcome(0, results, rank)
