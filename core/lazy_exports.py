"""Public names a package exports without importing their modules (PEP 562).

A package lists the module each lazy name lives in; that module is imported the first time
the name is asked for (``from core import CSVLogger``, ``core.CSVLogger``, ``getattr``), so
``import core`` loads only what a run uses. The package imports the same names under
``if TYPE_CHECKING:``, which is where type checkers and editors read them::

    __getattr__, __dir__ = lazy_exports(__name__, {"CSVLogger": "core.trackers.csv"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ("lazy_exports",)


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose names in ``homes``
    (name -> module defining it) are imported on first use."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            # AttributeError, not KeyError: `from package import submodule` relies on it
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)  # later lookups never reach this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
