"""``core-train find-lr``: the learning-rate range test (:func:`core.tuning.find_learning_rate`)
on what ``fit`` would train, with ``fit``'s flags for the model, the data and the config
tree (the loss, clipping, precision, seed and batch size all count), writing the curve and
its plot into ``<log dir>/<experiment>/lr_find-<run id>/`` (this is a program: it prints)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.cli.fit import fit_parser, resolve_config
from core.cli.parser import Parser
from core.cli.toml import dumps
from core.cli.train import _parts
from core.config import TrainingConfig
from core.errors import ConfigError
from core.loop.step import default_optimizer
from core.telemetry.run_log import new_run_id
from core.tuning import LRFinderConfig, LRFinderResult, find_learning_rate

__all__ = ("find_lr_command", "find_lr_parser")

USAGE = """
  core-train find-lr (--example NAME | --model MODULE:FACTORY --data MODULE:FACTORY)
                     [--min-lr LR] [--max-lr LR] [--num-steps N] [--device DEVICE] [--json]
                     [fit's options: --config RUN.TOML, --batch-size, --max-grad-norm, ...]"""

DESCRIPTION = """\
A learning-rate range test: a short training run raises the learning rate exponentially from
--min-lr to --max-lr, one step per batch, and records the loss; the suggested rate is read
off the smoothed curve. The model and data come from fit's flags, and so do the loss, the
gradient clipping (--max-grad-norm), the precision (--amp-dtype), the default optimizer's
--weight-decay and the --seed: the rate suits the run those flags describe. Prints the
suggestion and why; writes lr_find.json (the curve) and lr_find.png (with matplotlib) into
<log dir>/<experiment>/lr_find-<run id>/."""

EPILOG = """\
examples:
  core-train find-lr --example digits --batch-size 32 --max-grad-norm 1.0
  core-train find-lr --example digits --config examples/digits/config.toml --json
  core-train find-lr --model mypkg.nets:build --data mypkg.data:loaders --num-steps 200"""

_FLAGS = {
    "min_lr": "--min-lr",
    "max_lr": "--max-lr",
    "num_steps": "--num-steps",
    "device": "--device",
    "precision": "--amp-dtype",
}


def find_lr_parser() -> Parser:
    """``fit``'s parser, renamed, with the range test's own flags."""
    parser = fit_parser()
    parser.prog, parser.usage = "core-train find-lr", USAGE
    parser.description, parser.epilog = DESCRIPTION, EPILOG
    test = parser.add_argument_group("learning-rate range test")
    defaults = LRFinderConfig()
    test.add_argument(
        "--min-lr",
        type=float,
        default=defaults.min_lr,
        metavar="LR",
        help="the first step's learning rate (default %(default)g)",
    )
    test.add_argument(
        "--max-lr",
        type=float,
        default=defaults.max_lr,
        metavar="LR",
        help="the last step's learning rate (default %(default)g)",
    )
    test.add_argument(
        "--num-steps",
        type=int,
        default=defaults.num_steps,
        metavar="N",
        help="optimizer steps, the loader cycled (default %(default)d)",
    )
    test.add_argument("--device", default=None, help="default: cuda:0 where there is one")
    test.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def find_lr_command(argv: Sequence[str]) -> int:
    """``core-train find-lr``: run the range test, print the suggestion and its reason."""
    parser = find_lr_parser()
    namespace = parser.parse(argv)
    try:
        LRFinderConfig(
            min_lr=namespace.min_lr, max_lr=namespace.max_lr, num_steps=namespace.num_steps
        )
    except ConfigError as exc:
        parser.error(_flagged(exc))
    config = resolve_config(namespace, parser)
    if namespace.print_config:
        print(dumps(config), end="")
        return 0
    parts = _parts(namespace, parser, config)
    try:
        # The search's log lines go to stderr: stdout holds the answer (--json: only it).
        with contextlib.redirect_stdout(sys.stderr):
            result = _search(namespace, config, parts)
    except ConfigError as exc:
        parser.error(_flagged(exc))
    run_dir = Path(config.run.log_dir) / config.run.experiment_name / f"lr_find-{new_run_id()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    files = _write(result, run_dir, ["core-train", "find-lr", *argv])
    if namespace.json:
        print(json.dumps(result.to_dict() | files, indent=2))
        return 0
    sweep = f"{result.config.min_lr:g} -> {result.config.max_lr:g}"
    found = result.suggestion
    print(
        "no learning rate suggested" if found is None else f"suggested learning rate: {found:.3g}"
    )
    print(f"  why: {result.reason}")
    print(f"  sweep: {result.steps} steps, {sweep} ({result.stopped})")
    print(f"curve: {files['curve_file']}")
    print(f"plot: {files['plot_file'] or files['plot_note']}")
    if found is None:
        return 1
    print(f"train with it: core-train fit ... --lr {found:.3g}")
    return 0


def _search(namespace: Any, config: TrainingConfig, parts: dict[str, Any]) -> LRFinderResult:
    weight_decay = config.optim.weight_decay

    def optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return default_optimizer(params, namespace.min_lr, weight_decay)  # fit's AdamW

    amp = config.precision
    return find_learning_rate(
        parts["model"].model,
        parts["train_loader"],
        loss_fn=parts["loss_fn"],
        optimizer=optimizer,
        min_lr=namespace.min_lr,
        max_lr=namespace.max_lr,
        num_steps=namespace.num_steps,
        max_grad_norm=config.optim.max_grad_norm,
        device=namespace.device,
        precision=amp.dtype if amp.enable_amp else "fp32",
    )


def _write(result: LRFinderResult, run_dir: Path, command: list[str]) -> dict[str, Any]:
    """``lr_find.json`` and, with matplotlib, ``lr_find.png``; where they are."""
    curve = run_dir / "lr_find.json"
    plot: Path | None = run_dir / "lr_find.png"
    note = None
    try:
        result.plot(run_dir / "lr_find.png")
    except ImportError as exc:
        plot, note = None, f"not written: {exc}"
    files = {
        "run_dir": str(run_dir),
        "curve_file": str(curve),
        "plot_file": None if plot is None else str(plot),
        "plot_note": note,
    }
    curve.write_text(json.dumps(result.to_dict() | {"command": command}, indent=2) + "\n")
    return files


def _flagged(exc: ConfigError) -> str:
    """The message with the flag in place of the argument's name (``--min-lr=...``)."""
    message, field = str(exc), exc.field or ""
    flag = _FLAGS.get(field)
    return flag + message[len(field) :] if flag and message.startswith(field) else message
