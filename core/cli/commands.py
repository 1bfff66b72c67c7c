"""The commands besides ``fit`` and ``find-lr``: ``report`` (rebuild a run's reports),
``info`` (devices, their capabilities and what core recommends here), ``find-batch-size``
(the largest batch a training step fits) and ``check-amp`` (whether a model suits mixed
precision). Each has its parser (``info_parser()``...), which ``core.cli.reference`` lists."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.cli.factories import factory_at, parse_model_args
from core.cli.machine import machine_info
from core.cli.parser import Parser, choice
from core.errors import ConfigError, OutOfMemoryError
from core.memory import check_input_shape, find_batch_size
from core.reports import write_reports

__all__ = (
    "check_amp_command",
    "check_amp_parser",
    "find_batch_size_command",
    "find_batch_size_parser",
    "info_command",
    "info_parser",
    "machine_info",
    "report_command",
    "report_parser",
)

_GIB = 2**30


def report_parser() -> Parser:
    """The parser of ``core-train report``."""
    parser = Parser(
        prog="core-train report",
        description="Rebuild performance_summary.txt and training_metrics.png of a "
        "run from its events.jsonl; print the files written.",
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="logs/<experiment>/<run id>, or logs/<experiment> for its newest run",
    )
    return parser


def report_command(argv: Sequence[str]) -> int:
    """``core-train report RUN_DIR``: write its summary and plot again from its records."""
    parser = report_parser()
    namespace = parser.parse(argv)
    try:
        written = write_reports(_newest_run(Path(namespace.run_dir)))
    except FileNotFoundError:
        parser.error(
            f"RUN_DIR {namespace.run_dir!r}: no events.jsonl there; allowed: a run directory "
            "(logs/<experiment>/<run id>, printed by fit) or an experiment directory"
        )
    for path in written:
        print(path)
    return 0


def _newest_run(directory: Path) -> Path:
    """``directory`` if it holds a run, else its newest run (run ids sort by start time)."""
    if (directory / "events.jsonl").exists():
        return directory
    runs = sorted(p.parent for p in directory.glob("*/events.jsonl"))
    return runs[-1] if runs else directory


def _model_parser(prog: str, description: str) -> Parser:
    parser = Parser(prog=prog, description=description)
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword for the model factory (repeatable)",
    )
    parser.add_argument("--device", default=None, help="default: cuda:0 where there is one")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _model(parser: Parser, spec: str, pairs: list[str], device: torch.device) -> Any:
    try:
        factory = factory_at(spec)
        kwargs = parse_model_args(pairs)
    except ValueError as exc:
        parser.error(f"--model {spec!r}: {exc}")
    return factory(**kwargs).to(device)


def _device(name: str | None) -> torch.device:
    if name is not None:
        return torch.device(name)
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _search(
    parser: Parser,
    model: Any,
    shape_text: str,
    target: float | None,
    device: torch.device,
    max_batch_size: int = 4096,
) -> dict[str, Any]:
    try:
        shape = check_input_shape([int(p) for p in shape_text.split(",") if p.strip()])
    except (ValueError, ConfigError):
        parser.error(
            f"--input-shape {shape_text!r}: invalid value; allowed: comma-separated "
            "integers >= 1, the batch first (32,784)"
        )
    try:
        search = find_batch_size(model, shape, target, max_batch_size, device=device)
    except ConfigError as exc:
        parser.error(str(exc).replace("max_batch_size=", "--max-batch-size=", 1))
    # The answer is the cap when the cap itself was tried and fit: a larger one might too.
    capped = search.batch_size >= max_batch_size
    return search.to_dict() | {"max_batch_size": max_batch_size, "capped": capped}


def info_parser() -> Parser:
    """The parser of ``core-train info``."""
    parser = _model_parser(
        "core-train info",
        "Devices, capability, bf16/TF32 support, NVML, "
        "and the precision, mode and workers core picks here.",
    )
    parser.add_argument("--model", metavar="MODULE:FACTORY", help="also find its batch size")
    parser.add_argument(
        "--input-shape",
        default=None,
        metavar="N,...",
        help="one batch's shape for --model, the batch first (32,784)",
    )
    return parser


def info_command(argv: Sequence[str]) -> int:
    """``core-train info``: this machine, and with ``--model``, a batch size for it."""
    parser = info_parser()
    namespace = parser.parse(argv)
    info = machine_info()
    if namespace.model:
        if not namespace.input_shape:
            parser.error("--model needs --input-shape N,... (one batch's shape, batch first)")
        device = _device(namespace.device)
        model = _model(parser, namespace.model, namespace.model_arg, device)
        info["recommended"]["batch_size"] = _search(
            parser, model, namespace.input_shape, None, device
        )["batch_size"]
    if namespace.json:
        print(json.dumps(info, indent=2))
        return 0
    print(
        f"torch {info['torch']} (CUDA runtime {info['cuda_runtime'] or 'none'}), "
        f"{info['cpu_cores']} usable CPU cores"
    )
    for d in info["devices"]:
        print(
            f"cuda:{d['index']}  {d['name']}  capability {d['capability']}  "
            f"{d['memory_gb']} GiB  bf16 {d['bf16']}  tf32 {d['tf32']}"
        )
    if not info["devices"]:
        print("no CUDA device: training runs on the CPU")
    nvml = info["nvml"]
    print("NVML: " + ("available" if nvml["available"] else f"unavailable ({nvml['reason']})"))
    print(
        "recommended: "
        + ", ".join(f"{k} {v}" for k, v in info["recommended"].items() if k != "why")
    )
    return 0


def find_batch_size_parser() -> Parser:
    """The parser of ``core-train find-batch-size``."""
    parser = _model_parser(
        "core-train find-batch-size",
        "The largest batch size whose full training step (forward, backward, "
        "optimizer) fits the memory target, and the trials behind it.",
    )
    parser.add_argument(
        "--model", required=True, metavar="MODULE:FACTORY", help="the model factory to measure"
    )
    parser.add_argument(
        "--input-shape",
        required=True,
        metavar="N,...",
        help="one batch's shape, the batch first: the search starts there",
    )
    parser.add_argument(
        "--target-memory-gb",
        type=float,
        default=None,
        metavar="G",
        help="default: the device's free memory less 10%%",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=4096,
        metavar="N",
        help="the largest size tried (default %(default)d)",
    )
    return parser


def find_batch_size_command(argv: Sequence[str]) -> int:
    """``core-train find-batch-size``: the largest batch whose training step fits."""
    parser = find_batch_size_parser()
    namespace = parser.parse(argv)
    device = _device(namespace.device)
    model = _model(parser, namespace.model, namespace.model_arg, device)
    target, cap = namespace.target_memory_gb, namespace.max_batch_size
    try:
        search = _search(parser, model, namespace.input_shape, target, device, cap)
    except OutOfMemoryError as exc:
        print(f"core-train find-batch-size: {exc}")
        return 1
    if namespace.json:
        print(json.dumps(search, indent=2))
        return 0
    capped = " (the --max-batch-size cap: every size up to it fit; raise it to search further)"
    print(
        f"batch size: {search['batch_size']}{capped if search['capped'] else ''} "
        f"(target {search['target_bytes'] / _GIB:.3f} GiB on {device})"
    )
    for trial in search["trials"]:
        peak = trial["peak_bytes"]
        shown = "out of memory" if peak is None else f"peak {peak / _GIB:.4f} GiB"
        verdict = "fits" if trial["fits"] else "too big"
        print(f"  {trial['batch_size']:>7}  {verdict:<8} {shown}  ({trial['reason']})")
    return 0


def check_amp_parser() -> Parser:
    """The parser of ``core-train check-amp``."""
    parser = _model_parser(
        "core-train check-amp",
        "Check a model for mixed precision: compatible or not, warnings, recommendations.",
    )
    parser.add_argument("model", metavar="MODULE:FACTORY", help="the model factory to check")
    parser.add_argument(
        "--dtype",
        type=choice("fp16", "bf16"),
        default=None,
        metavar="{fp16,bf16}",
        help="default: what auto picks on the device",
    )
    return parser


def check_amp_command(argv: Sequence[str]) -> int:
    """``core-train check-amp MODULE:FACTORY``: layers and settings that suit fp16/bf16 badly
    (exit status 1 when the model is not compatible)."""
    parser = check_amp_parser()
    namespace = parser.parse(argv)
    device = _device(namespace.device)
    model = _model(parser, namespace.model, namespace.model_arg, device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(namespace.dtype or "")
    from core.precision.compatibility import check_amp_compatibility

    report = check_amp_compatibility(model, device=device, dtype=dtype)
    if namespace.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print("compatible: " + ("yes" if report["compatible"] else "no"))
        for kind in ("warnings", "recommendations"):
            for line in report.get(kind, []):
                print(f"  {kind[:-1]}: {line}")
    return 0 if report["compatible"] else 1
