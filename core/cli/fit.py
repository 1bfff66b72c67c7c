"""``core-train fit`` (the default command): its parser, and the config tree it resolves
from defaults, a TOML file and flags, in that order, each overriding the one before."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from core.cli.factories import EXAMPLES
from core.cli.flags import add_tree_flags
from core.cli.parser import Parser, choice, given, sets
from core.cli.recipes import add_recipe_flags
from core.cli.shorthands import add_shorthands
from core.cli.toml import loads
from core.config import RunConfig, TrainingConfig
from core.distributed.devices import ranks_to_start
from core.distributed.launch import launch_local_ranks, python_module
from core.errors import ConfigError

__all__ = ("fit_in_ranks", "fit_parser", "flag_error", "resolve_config")

USAGE = """
  core-train [fit] (--example NAME | --model MODULE:FACTORY --data MODULE:FACTORY)
                   [--training-step MODULE:FUNCTION] [--validation-step MODULE:FUNCTION]
                   [--config RUN.TOML] [--devices N] [options]
  core-train report RUN_DIR
  core-train info [--json] [--model MODULE:FACTORY --input-shape N,...]
  core-train find-batch-size --model MODULE:FACTORY --input-shape N,... [--target-memory-gb G]
  core-train find-lr (--example NAME | --model MODULE:FACTORY --data MODULE:FACTORY) [options]
  core-train check-amp MODULE:FACTORY [--dtype fp16|bf16] [--json]"""

DESCRIPTION = """\
Train with core's orchestrator: mixed precision, gradient accumulation, DDP/DataParallel,
checkpoints and a JSON record per optimizer step (python -m core is the same program).
`fit` is the default command; `core-train COMMAND --help` describes the others.

Every setting of the config tree has a flag (the "config:" groups below, one per section;
the TOML file of --config holds the same tree: [run] max_epochs = 3). Precedence: flags, then
--config, then defaults. The shorthands stand for some of those flags: a setting
given twice (--epochs 2 --max-epochs 3) is an error naming both. A bad value or an unknown
flag exits with status 2 and says what is allowed."""

EPILOG = """\
factories (--model/--data; the current directory is importable):
  model_factory(**kwargs) -> torch.nn.Module            (--model-arg KEY=VALUE passes kwargs)
  data_factory(batch_size: int, num_workers: int) -> (train_loader, val_loader | None)
  training_step(model, batch) -> loss, or {"loss": loss, "<name>": value to log, ...}
                                  (--training-step; replaces the loss; --validation-step
                                  the same, its values logged as val_<name>)

examples:
  core-train --example digits --epochs 8 --scheduler onecycle
  core-train fit --model mypkg.nets:build --data mypkg.data:loaders --use-amp --grad-accum 4
  core-train fit --model mypkg.nets:build --data mypkg.data:loaders --training-step mypkg.steps:kd
  core-train --example digits --epochs 3 --print-config > run.toml
  core-train fit --example digits --config run.toml --lr 3e-3
  core-train fit --example digits --devices 2      (2 DDP ranks, started without torchrun)
  torchrun --standalone --nproc_per_node=2 -m core fit --example digits --gpu-mode multi_gpu
  core-train --example moe --parallel-strategy expert_parallel --experts 8
  torchrun --standalone --nproc_per_node=2 -m core --example moe --parallel-strategy expert_parallel
  core-train report logs/digits/<run id>"""


def fit_parser() -> Parser:
    """The parser of ``fit``: what to train, shorthands, recipes, then the tree's flags."""
    parser = Parser(prog="core-train", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    what = parser.add_argument_group("what to train")
    what.add_argument(
        "--example",
        type=choice(*EXAMPLES),
        metavar="{" + ",".join(EXAMPLES) + "}",
        help="an example of the source checkout's examples/ directory",
    )
    what.add_argument(
        "--model", metavar="MODULE:FACTORY", help="import path of the model factory (see below)"
    )
    what.add_argument(
        "--data", metavar="MODULE:FACTORY", help="import path of the data factory (see below)"
    )
    what.add_argument(
        "--training-step",
        metavar="MODULE:FUNCTION",
        help="import path of training_step(model, batch), which returns the loss (see below)",
    )
    what.add_argument(
        "--validation-step",
        metavar="MODULE:FUNCTION",
        help="import path of validation_step(model, batch) (default: the training step)",
    )
    what.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword for the model factory (repeatable; numbers, true/false and "
        "none are converted)",
    )
    what.add_argument(
        "--config", metavar="RUN.TOML", help="TOML file of the config tree; flags override it"
    )
    what.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config tree as TOML and exit",
    )
    parser.set_defaults(monitor_gpu=False)
    add_shorthands(parser)
    add_recipe_flags(parser)
    add_tree_flags(parser)
    return parser


def _cli_defaults(namespace: argparse.Namespace) -> TrainingConfig:
    """What ``fit`` changes from the library's defaults (a TOML file or a flag overrides it):
    it owns its process, so SIGTERM/SIGINT stop gracefully; an example names the run."""
    name = namespace.example.replace("-", "_") if namespace.example else "experiment"
    return TrainingConfig(run=RunConfig(handle_signals=True, experiment_name=name))


def flag_error(exc: ConfigError, namespace: argparse.Namespace, where: str | None) -> str:
    """``exc``'s message naming the flag that set the field (``--lr=-1.0 is invalid...``),
    or, for a field the TOML file set, the file and the dotted path."""
    message, field = str(exc), exc.field or ""
    flag = given(namespace).get(field, (None, None))[0]
    if flag is not None:
        return flag + message[len(field) :] if message.startswith(field) else message
    return f"{where}: {message}" if where else message


def resolve_config(namespace: argparse.Namespace, parser: Parser) -> TrainingConfig:
    """Defaults, then ``--config``, then the flags; a bad value exits with status 2."""
    base = _cli_defaults(namespace)
    where = namespace.config
    try:
        if where:
            try:
                with open(where, encoding="utf-8") as file:
                    text = file.read()
            except OSError as exc:
                parser.error(
                    f"--config {where!r}: cannot be read ({exc.strerror}); allowed: "
                    "a readable TOML file",
                )
            base = loads(text, base)
        config = base.replace(sets(namespace))
        if namespace.monitor_gpu and "monitor.interval_s" not in given(namespace):
            config = config.replace({"monitor.interval_s": min(config.monitor.interval_s, 0.25)})
    except ConfigError as exc:
        parser.error(flag_error(exc, namespace, where))
    return config


def fit_in_ranks(
    config: TrainingConfig, argv: Sequence[str], namespace: argparse.Namespace, parser: Parser
) -> int | None:
    """``--devices N`` outside torchrun: this command in N ranks, started as ``torchrun
    --standalone --nproc-per-node N -m core fit ARGV`` would, and their exit status (the first
    failing rank's; 128 + a stopping signal). None: this process trains."""
    try:
        devices = ranks_to_start(config.distributed, isolation=config.run.isolation)
    except ConfigError as exc:
        parser.error(flag_error(exc, namespace, namespace.config))
    if devices is None:
        return None
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:  # SIGTERM/SIGINT here reach every rank (torch's agent), which stops gracefully
        launch_local_ranks(devices, *python_module("core", ["fit", *argv]))
    except SignalException as stopped:
        return 128 + int(stopped.sigval)
    except ChildFailedError as failed:
        code = failed.get_first_failure()[1].exitcode
        return code if code > 0 else 128 - code
    return 0
