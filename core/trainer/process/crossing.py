"""What crosses into a training process (``run.isolation="process"``), checked before it starts.

Each runtime object crosses pickled (its tensors through shared memory:
``core.trainer.process.shared``) or as a factory named ``"package.module:function"``; anything
else is a :class:`~core.errors.ConfigError` naming the argument and the fix. The rules:
docs/services.md#how-process-isolation-works.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
from collections.abc import Mapping
from typing import Any

from core.distributed.environment import DistributedEnvironment
from core.errors import ConfigError, config_error
from core.factory import FORMAT, Factory, is_factory_name, named
from core.trainer.process.shared import Packed, pack, structure_of

__all__ = (
    "CALLED",
    "Crossing",
    "MAIN_NOT_GUARDED",
    "crossing_for",
    "exit_if_importing_main",
    "resolve",
)

CALLED = ("model", "train_loader", "val_loader")
"""The arguments whose factory is called with no arguments to make the object."""
MAIN_NOT_GUARDED = 86
"""The exit code of a training process whose program, imported there, creates a run at
import (no ``if __name__ == "__main__":`` guard): the service says why."""


_OBJECTS = {
    "model": "a torch.nn.Module",
    "train_loader": "an iterable of batches (a DataLoader)",
    "val_loader": "None or an iterable of batches (a DataLoader)",
    "loss_fn": "None or a loss function",
    "training_step": "None or a function of (model, batch)",
    "validation_step": "None or a function of (model, batch)",
    "optimizer": "None, a torch.optim.Optimizer or a function of the parameters",
    "scheduler": "None, an LR scheduler or a function of the optimizer",
    "metrics": "None or a mapping of names to metrics",
}


def resolve(field: str, value: Any) -> Any:
    """``value``, or what its factory (a name, or a :class:`~core.factory.Factory`) stands for:
    its result for :data:`CALLED`, the function otherwise."""
    if isinstance(value, Factory) and field in CALLED:
        return value()
    if not isinstance(value, str):
        return value
    if not is_factory_name(value):
        raise config_error(
            field,
            value,
            f"{_OBJECTS[field]}, or a factory named {FORMAT}",
            f"e.g. {field}='mypackage.models:make_{field}'.",
        )
    factory = named(field, value)
    return factory() if field in CALLED else factory


class Crossing:
    """The runtime objects of a job as they cross: factory names as given, everything else
    pickled in one piece (shared objects stay shared). ``into`` and ``instead`` word the
    refusals: where the objects go, and the fix that avoids the crossing."""

    def __init__(
        self, given: Mapping[str, Any], into: str, instead: str = "use isolation='thread'"
    ) -> None:
        self.names = {k: v for k, v in given.items() if isinstance(v, str)}
        self.objects = {k: v for k, v in given.items() if not isinstance(v, str)}
        self.into = into
        self.instead = instead

    def check_names(self) -> None:
        """Raise :class:`ConfigError` naming the first factory name that cannot be imported."""
        for field, name in self.names.items():
            if not is_factory_name(name):
                raise config_error(field, name, FORMAT)
            module = name.partition(":")[0]
            if importlib.util.find_spec(module.partition(".")[0]) is None:
                raise config_error(field, name, FORMAT, f"no module {module!r} is importable.")

    def check_objects(self) -> None:
        """Raise :class:`ConfigError` naming the first object that cannot cross. Call it in a
        worker thread: pickling the structure (2-15 ms for a 58M-parameter model and its
        optimizer) holds the interpreter lock."""
        for field, value in self.objects.items():
            if value is None:
                continue
            try:
                unimportable = structure_of(value)
            except Exception as exc:
                raise _cannot_cross(field, value, exc, self) from exc
            if unimportable:
                raise _in_main(field, value, unimportable[0], self)

    def pack(self, model: Any) -> Packed:
        """What crosses, with ``model``'s state dict laid out for the way back (off the event
        loop: it copies every tensor once, into shared memory)."""
        return pack((self.names, self.objects), model)

    @staticmethod
    def unpack(packed: Packed, *, private: bool = False) -> dict[str, Any]:
        """In the training process: every object (``private``: on a copy of the shared
        memory), and the factories as given (the job resolves them)."""
        names, objects = packed.unpack(private=private)
        return {**objects, **names}


def _cannot_cross(field: str, value: object, exc: Exception, crossing: Crossing) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 80 else f"<{type(value).__qualname__} object>"
    error = ConfigError(
        f"{field}={shown} cannot cross into {crossing.into}: it "
        f"does not pickle ({type(exc).__name__}: {exc}); allowed: an object that pickles, or "
        f"a factory named {FORMAT}. Fix: define it at module level (no lambda, local class, "
        f"open file or lock), pass {field}='mypackage.module:make_{field}', or "
        f"{crossing.instead}."
    )
    error.field = field
    return error


def _in_main(field: str, value: object, name: str, crossing: Crossing) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 80 else f"<{type(value).__qualname__} object>"
    error = ConfigError(
        f"{field}={shown} cannot cross into {crossing.into}: it "
        f"needs {name}, defined in __main__, which that process cannot import (this program "
        "runs from python -c, standard input, or an interactive session or notebook); "
        f"allowed: classes and functions of an importable module, or a factory named "
        f"{FORMAT}. Fix: move {name} into a module (e.g. mymodels.py) and import it from "
        f"there, pass {field}='mymodels:make_{field}', or {crossing.instead}."
    )
    error.field = field
    return error


def crossing_for(config: Any, given: Mapping[str, Any]) -> Crossing | None:
    """The crossing of a job with ``run.isolation="process"`` or ``"ray"`` (None in thread
    mode), its names checked (its objects at the run's start)."""
    isolation = config.run.isolation
    if isolation == "thread":
        return None
    if DistributedEnvironment.from_environ() is not None:  # each rank is a process already
        raise config_error(
            "run.isolation",
            isolation,
            "'thread' under torchrun",
            "under torchrun each rank is already its own process; use isolation='thread' "
            "(the default) there.",
        )
    exit_if_importing_main()
    crossing = Crossing(given, _INTO[isolation])
    crossing.check_names()
    return crossing


_INTO = {
    "process": "the training process (isolation='process')",
    "ray": "the run's Ray actor (isolation='ray')",
}


def exit_if_importing_main() -> None:
    """Exit quietly with :data:`MAIN_NOT_GUARDED` in a training process that is still
    importing the service's main module: the program creates its run when imported (no main
    guard). The service's ``train()`` says so in one message, where the process would
    otherwise spill ``multiprocessing``'s bootstrap tracebacks."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        os._exit(MAIN_NOT_GUARDED)
