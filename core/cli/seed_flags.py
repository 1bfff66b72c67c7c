"""The seeds' switches (seed 001's trainer, seed 003's GPU example) as shorthands for flags
of the tree (the recipes' flags are in ``core.cli.recipes``).

A shorthand sets the same leaf as its flag: giving both (``--epochs 2 --max-epochs 3``) is
an error naming both. ``--gpu-mode`` is resolved against this machine when it is parsed.

Example::

    parser = Parser(prog="core-train")
    add_seed_flags(parser)
    sets(parser.parse(["--epochs", "3", "--no-amp"]))
    # {'run.max_epochs': 3, 'precision.enable_amp': False}
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.cli.leaves import leaf_for
from core.cli.parser import choice, claim
from core.distributed.environment import DistributedEnvironment
from core.errors import ConfigError

__all__ = ("ALIASES", "Alias", "add_seed_flags", "gpu_mode")

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
        claim(parser, namespace, "distributed.training_mode", "--gpu-mode", mode)


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


class _NotYetAction(argparse.Action):
    """Expert parallelism arrives with the mixture-of-experts model: say so, exit 2."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string == "--parallel-strategy" and values == "data_parallel":
            return  # the strategy --gpu-mode builds
        parser.error(
            f"{option_string} {values!r}: expert parallelism (mixture-of-experts models) is "
            "not available yet in core-train; allowed now: --parallel-strategy data_parallel "
            "(the default). Fix: leave the flag out."
        )


_SEED_NOTE = """Shorthands from the seed documents; each sets the tree's flag named in its help, and
giving both is an error. The seeds' --accumulation-steps, --compile/--no-compile,
--compile-mode, --channels-last/--no-channels-last, --auto-batch-size, --resume (auto or a
checkpoint directory) and --log-dir are the tree's own flags (groups below)."""


def add_seed_flags(parser: argparse.ArgumentParser) -> None:
    """The seeds' switches, in one group."""
    group = parser.add_argument_group("seed switches", _SEED_NOTE)
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
        action=_NotYetAction,
        metavar="{data_parallel,expert_parallel}",
        type=choice("data_parallel", "expert_parallel"),
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="data_parallel (default: batches split over the --gpu-mode devices); "
        "expert_parallel is not available yet (exits 2)",
    )
    group.add_argument(
        "--experts",
        action=_NotYetAction,
        type=int,
        metavar="N",
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="experts of a mixture-of-experts model: not available yet (exits 2)",
    )
    group.add_argument(
        "--monitor-gpu",
        action=_MonitorGpuAction,
        nargs=0,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="GPU monitoring on (it is by default), sampled every 0.25 s unless "
        "--monitor-interval-s says otherwise, and the GPU's memory and utilisation printed "
        "at the end (sets --monitor-enabled and --distributed-enable-gpu-monitoring)",
    )
