"""Shorthand switches (those of the founding documents' programs) for flags of the tree. A
shorthand sets the same leaf as its flag, so giving both is an error naming both;
``--gpu-mode`` is resolved against this machine when parsed; ``--experts N`` is not a leaf
(``fit`` passes it to the model factory)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.cli.leaves import leaf_for
from core.cli.parser import choice, claim, given
from core.distributed.environment import DistributedEnvironment
from core.errors import ConfigError

__all__ = ("ALIASES", "Alias", "add_shorthands", "expert_mode", "gpu_mode", "positive_int")

_TAKES_VALUE = object()


@dataclass(frozen=True)
class Alias:
    """``flag`` sets ``path`` to ``const``, or to its value (parsed as the leaf's, or one of
    ``choices``)."""

    flag: str
    path: str
    const: object = _TAKES_VALUE
    choices: tuple[str, ...] = ()


ALIASES = (
    Alias("--epochs", "run.max_epochs"),
    Alias("--experiment", "run.experiment_name"),
    Alias("--lr", "optim.learning_rate"),
    Alias("--grad-clip", "optim.max_grad_norm"),
    Alias("--grad-accum", "accumulation.accumulation_steps"),
    Alias("--mixed-precision", "precision.enable_amp", True),
    Alias("--use-amp", "precision.enable_amp", True),
    Alias("--no-amp", "precision.enable_amp", False),
    Alias("--precision-type", "precision.dtype", choices=("auto", "fp16", "bf16")),
    Alias("--use-compile", "transforms.compile", True),
    Alias("--use-gradient-checkpointing", "transforms.activation_checkpointing", True),
    Alias("--num-workers", "data.loader.num_workers"),
)


class _AliasAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, alias: Alias, **kw: Any):
        self.alias = alias
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        const = self.alias.const
        value = values if const is _TAKES_VALUE else const
        claim(parser, namespace, self.alias.path, self.alias.flag, value)


def gpu_mode(mode: str) -> str:
    """``training_mode`` for seed 003's ``--gpu-mode`` on this machine: ``multi_gpu`` is DDP
    under torchrun and DataParallel over this machine's GPUs without it; ``single_gpu``
    and ``multi_gpu`` fail (exit 2) where the GPUs are missing, rather than fall back."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if mode in ("auto", "cpu"):
        return mode
    if mode == "single_gpu":
        if cuda == 0:
            raise argparse.ArgumentTypeError(
                "'single_gpu': this machine has no CUDA GPU; allowed here: auto, cpu. "
                "Fix: --gpu-mode auto (uses a GPU where there is one)."
            )
        return "single_gpu"
    try:
        under_torchrun = DistributedEnvironment.from_environ() is not None
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"'multi_gpu': {exc}") from None
    if under_torchrun:
        return "distributed"
    if cuda < 2:
        raise argparse.ArgumentTypeError(
            f"'multi_gpu': needs torchrun (DDP) or at least 2 CUDA GPUs (DataParallel), and "
            f"this process has neither ({cuda} GPU). Fix: torchrun --standalone "
            "--nproc_per_node=N -m core fit ..., or --gpu-mode auto."
        )
    return "data_parallel"


def expert_mode(mode: str) -> str:
    """``expert_parallel`` for ``--parallel-strategy expert_parallel`` with ``--gpu-mode
    mode``, unless ``mode`` names one device and the experts would be placed on others."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if mode == "cpu" and cuda:
        raise argparse.ArgumentTypeError(
            f"with --gpu-mode 'cpu': expert parallelism would use this machine's {cuda} CUDA "
            "GPU(s); allowed with cpu: a machine without CUDA. Fix: --gpu-mode auto (experts "
            "placed over the GPUs), or leave out --parallel-strategy (plain CPU training)."
        )
    if mode == "single_gpu" and cuda > 1 and DistributedEnvironment.from_environ() is None:
        raise argparse.ArgumentTypeError(
            f"with --gpu-mode 'single_gpu': expert parallelism in one process places experts "
            f"over all {cuda} GPUs. Fix: --gpu-mode multi_gpu (or auto), or "
            "CUDA_VISIBLE_DEVICES=0 to keep one GPU."
        )
    return "expert_parallel"


def _settle(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> None:
    """Set ``distributed.training_mode`` from ``--gpu-mode`` and ``--parallel-strategy``
    together, whichever came first; ``--training-mode`` with either is an error."""
    path = "distributed.training_mode"
    settings = given(namespace)
    if settings.get(path, ("", None))[0] in ("--gpu-mode", "--parallel-strategy"):
        del settings[path]  # ours: recomputed from both flags
    raw = namespace.__dict__.get("gpu_mode_given")
    if namespace.__dict__.get("parallel_strategy") == "expert_parallel":
        try:
            mode = expert_mode(raw or "auto")
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--parallel-strategy 'expert_parallel' {exc}")
        claim(parser, namespace, path, "--parallel-strategy", mode)
    elif raw is not None:
        claim(parser, namespace, path, "--gpu-mode", namespace.gpu_mode_resolved)


class _GpuModeAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            mode = gpu_mode(str(values))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--gpu-mode {exc}")
        namespace.gpu_mode_given, namespace.gpu_mode_resolved = str(values), mode
        _settle(parser, namespace)


class _ParallelStrategyAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.parallel_strategy = str(values)
        _settle(parser, namespace)


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (``--experts``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: invalid value; allowed: an integer >= 1")
    return value


class _MonitorGpuAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        claim(parser, namespace, "monitor.enabled", "--monitor-gpu", True)
        claim(parser, namespace, "distributed.enable_gpu_monitoring", "--monitor-gpu", True)
        namespace.monitor_gpu = True


_SHORTHANDS_NOTE = """Switches the founding documents' programs use; each sets the tree's flag
named in its help, and giving both is an error. Their --accumulation-steps, --compile/--no-compile,
--compile-mode, --channels-last/--no-channels-last, --auto-batch-size, --resume (auto or a
checkpoint directory) and --log-dir are the tree's own flags (groups below)."""


def add_shorthands(parser: argparse.ArgumentParser) -> None:
    """The shorthand switches, in one group."""
    group = parser.add_argument_group("shorthands", _SHORTHANDS_NOTE)
    for alias in ALIASES:
        leaf = leaf_for(alias.path)
        target = leaf.flag if leaf else alias.path
        if alias.const is not _TAKES_VALUE:
            text = "true" if alias.const is True else "false"
            group.add_argument(
                alias.flag,
                action=_AliasAction,
                alias=alias,
                nargs=0,
                dest=argparse.SUPPRESS,
                default=argparse.SUPPRESS,
                help=f"= {target} {text}",
            )
            continue
        kind = choice(*alias.choices) if alias.choices else (leaf.parse if leaf else str)
        metavar = "{" + ",".join(alias.choices) + "}" if alias.choices else "N"
        group.add_argument(
            alias.flag,
            action=_AliasAction,
            alias=alias,
            type=kind,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            metavar=metavar if leaf is None or alias.choices else leaf.metavar(),
            help=f"= {target}",
        )
    group.add_argument(
        "--gpu-mode",
        action=_GpuModeAction,
        type=choice("auto", "cpu", "single_gpu", "multi_gpu"),
        metavar="{auto,cpu,single_gpu,multi_gpu}",
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="sets --training-mode: auto; cpu; single_gpu (one CUDA GPU; exits 2 without "
        "one, no silent fallback); multi_gpu (DDP under torchrun, DataParallel over 2+ GPUs "
        "without it; exits 2 with neither)",
    )
    group.add_argument(
        "--parallel-strategy",
        action=_ParallelStrategyAction,
        metavar="{data_parallel,expert_parallel}",
        type=choice("data_parallel", "expert_parallel"),
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="data_parallel (default): what --gpu-mode builds, batches split over its "
        "devices. expert_parallel (a model with core.moe.MoELayer blocks: --example moe) sets "
        "--training-mode expert_parallel: under torchrun each rank holds experts/N of every "
        "MoE layer, tokens exchanged by all-to-all, the rest under DDP; in one process the "
        "experts are placed over this machine's GPUs (all on the CPU without one; the plan is "
        "in run_start either way). --gpu-mode still checks the machine (multi_gpu: torchrun "
        "or 2+ GPUs); with cpu or single_gpu it exits 2 where experts would land on other "
        "devices",
    )
    group.add_argument(
        "--experts",
        type=positive_int,
        metavar="N",
        default=None,
        help="experts per MoE layer: passes experts=N to the model factory (exits 2 when the "
        "factory takes no experts keyword); under torchrun N must divide over the ranks",
    )
    group.add_argument(
        "--monitor-gpu",
        action=_MonitorGpuAction,
        nargs=0,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="the GPU monitor on (--gpu-monitor, on by default, and "
        "--distributed-enable-gpu-monitoring), sampling every 0.25 s unless "
        "--gpu-monitor-interval-s says otherwise, and the GPU's memory and utilisation "
        "printed at the end",
    )
