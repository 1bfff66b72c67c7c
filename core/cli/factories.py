"""Where ``fit`` gets its model and data: ``package.module:name`` import paths, and the
examples that ship with the source checkout (``--example digits``). The contracts::

    model_factory(**kwargs) -> nn.Module
    data_factory(batch_size: int, num_workers: int) -> (train_loader, val_loader | None)
    training_step(model, batch) -> loss, or a dict with "loss"    (--training-step, optional)

A run is given its model as a :class:`BuiltModel`, so its checkpoints name the factory.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch import nn
from typing_extensions import override

from core.errors import ConfigError
from core.factory import Factory

__all__ = (
    "BuiltModel",
    "DataFactory",
    "EXAMPLES",
    "ModelFactory",
    "email_sequence_data",
    "example_factories",
    "factory_at",
    "import_object",
    "model_record",
    "parse_model_args",
    "step_at",
)

ModelFactory = Callable[..., nn.Module]
DataFactory = Callable[..., tuple[Iterable[Any], Iterable[Any] | None]]

EXAMPLES: dict[str, tuple[str, str]] = {
    "digits": ("examples.digits:build_model", "examples.digits:build_data"),
    "email-sequence": (
        "examples.email_sequence:EmailSequenceModel",
        "core.cli.factories:email_sequence_data",
    ),
    "moe": ("examples.moe:build_model", "examples.moe:build_data"),
}
"""``--example`` name -> (model factory, data factory) import paths."""


def import_object(spec: str) -> Any:
    """The object ``'package.module:name'`` names (``name`` may be dotted); ``ValueError``
    says what is wrong."""
    module_name, colon, attr = spec.partition(":")
    if not (colon and module_name and attr):
        raise ValueError("not an import path; allowed: 'package.module:name'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the user's modules, where core-train runs
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import {module_name!r} ({exc}); the current directory is searched too"
        ) from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{module_name!r} has no {attr!r}")
        found = getattr(found, part)
    return found


def example_factories(name: str) -> tuple[ModelFactory, DataFactory]:
    """The factories of ``--example name``, from the ``examples/`` directory beside the
    ``core`` package (a source checkout); ``ValueError`` where it is absent."""
    if name not in EXAMPLES:
        raise ValueError(f"{name!r}: unknown example; allowed: {', '.join(EXAMPLES)}")
    checkout = Path(__file__).resolve().parents[2]
    folder = EXAMPLES[name][0].split(":")[0].replace(".", "/")
    if not (checkout / folder).is_dir():
        raise ValueError(
            f"{name!r}: the examples ship with the source tree, and this installation has no "
            f"{folder}/ beside the core package ({checkout}). Fix: run from a checkout of "
            "the repository, or pass --model package.module:factory --data ..."
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    model, data = (import_object(spec) for spec in EXAMPLES[name])
    return model, data


def factory_at(spec: str) -> Any:
    """The factory ``--model`` or ``--data`` names (checked to be callable)."""
    found = import_object(spec)
    if not callable(found):
        raise ValueError(f"{spec!r} is a {type(found).__name__}, not a callable factory")
    return found


def step_at(spec: str) -> str:
    """``spec``, checked to name the step function ``--training-step`` or
    ``--validation-step`` gives (a callable); the run imports it by that name, in whichever
    process trains."""
    found = import_object(spec)
    if not callable(found):
        raise ValueError(f"{spec!r} is a {type(found).__name__}, not a step function")
    return spec


def parse_model_args(pairs: list[str]) -> dict[str, object]:
    """``["width=64", "kind=cnn"]`` -> ``{"width": 64, "kind": "cnn"}`` (ints, floats,
    true/false and none are converted; the rest stay strings)."""
    kwargs: dict[str, object] = {}
    for pair in pairs:
        key, equals, raw = pair.partition("=")
        if not (equals and key.isidentifier()):
            raise ValueError(f"{pair!r}: allowed: KEY=VALUE with KEY a Python name")
        kwargs[key] = _scalar(raw)
    return kwargs


def model_record(spec: str, kwargs: dict[str, object]) -> Factory:
    """``Factory(spec, **kwargs)``: how a run's checkpoints record its model; ``ValueError``
    names the flag at fault (a ``--model-arg`` value that is no JSON value, ``nan`` or
    ``inf``; a ``--model`` name :class:`~core.factory.Factory` refuses)."""
    for key, value in kwargs.items():
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise ValueError(
                f"--model-arg {f'{key}={value!r}'!r}: not a JSON value; allowed: a finite "
                "number, a string, true/false or none (checkpoints record the model factory's "
                "keywords, for core.load_model). Fix: give a finite number, or set it inside "
                "the factory."
            ) from None
    try:
        return Factory(spec, **kwargs)
    except ConfigError as exc:
        raise ValueError(f"--model {spec!r}: {exc}") from None


class BuiltModel(Factory):
    """The :class:`~core.factory.Factory` that made ``model``, returning ``model`` itself when
    called (and pickled with it): the run trains the model ``fit`` checked, and its
    checkpoints record the factory."""

    __slots__ = ("model",)

    def __init__(self, made_by: Factory, model: nn.Module, /) -> None:
        super().__init__(made_by.target, **made_by.kwargs)
        self.model = model

    @override
    def __call__(self) -> nn.Module:
        return self.model

    @override
    def __reduce__(self) -> tuple[Any, ...]:
        return (_built, (self.target, self.kwargs, self.model))


def _built(target: str, kwargs: dict[str, Any], model: nn.Module) -> BuiltModel:
    return BuiltModel(Factory(target, **kwargs), model)


def _scalar(raw: str) -> object:
    words: dict[str, object] = {"true": True, "false": False, "none": None}
    if raw.lower() in words:
        return words[raw.lower()]
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def email_sequence_data(batch_size: int, num_workers: int) -> tuple[Any, Any]:
    """The email-sequence example's data for ``--example email-sequence``: 8000 training and
    2000 validation recipients (seeds 0 and 1, as ``examples/email_sequence/train.py``)."""
    from torch.utils.data import DataLoader

    dataset = import_object("examples.email_sequence:EmailSequenceDataset")
    train, val = dataset(8000, seed=0), dataset(2000, seed=1)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers),
        DataLoader(val, batch_size=256, num_workers=num_workers),
    )
