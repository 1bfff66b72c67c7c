"""``torch.compile`` in place, never fatal: the model (or each of its blocks) compiled as
``nn.Module.compile`` does it, keeping ``state_dict()`` keys. The first compiled call is timed
and its graph breaks counted (a ``compile`` record); a compiler error reverts that module to
eager, reports ``compile_failed`` once, and returns the eager result.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch
from torch import nn

from core.hardware.device import device_of
from core.transforms.config import CompileMode

__all__ = ("EventSink", "compile_model", "compile_reason", "is_compiled", "wants_compile")

_WHOLE_MODEL = "model"


class EventSink(Protocol):
    """Where records go: ``emit("compile", seconds=...)``, ``report_error("error", kind=...)``."""

    def __call__(self, event: str, /, **fields: Any) -> None: ...


def wants_compile(setting: Literal["auto"] | bool, device: torch.device) -> bool:
    """Whether to compile before the first step: only ``compile=True``. ``"auto"`` decides
    later, from measured steps (``core.transforms.payback``), and only on CUDA."""
    return setting is True


def compile_reason(setting: Literal["auto"] | bool, device: torch.device, *, blocks: bool) -> str:
    """Why the model is (or is not yet) compiled, for ``run_start``."""
    if setting is True:
        return "on: compile=True, before the first step"
    if setting is False:
        return "off: compile=False (the default)"
    if not device_of(device).is_cuda:
        return "auto: off on CPU (compiled/eager measured 1.01-1.12 there, for 40 s or more)"
    if blocks:
        return "auto: off with FSDP2 (blocks are compiled before sharding: set compile=True)"
    return "auto: decided after timing the first eager steps"


@functools.cache
def _compiler_errors() -> tuple[type[BaseException], ...]:
    """The exceptions raised by the compiler itself (dynamo, AOTAutograd, inductor and the
    C++ toolchain), never by the user's code: dynamo re-raises those unchanged."""
    from torch._dynamo import exc as dynamo_exc
    from torch._inductor import exc as inductor_exc

    names = (
        "CppCompileError",
        "CppWrapperCodegenError",
        "InvalidCxxCompiler",
        "OperatorIssue",
        "SubgraphLoweringException",
    )
    found = [getattr(inductor_exc, name, None) for name in names]
    inductor = [kind for kind in found if isinstance(kind, type)]
    return (dynamo_exc.TorchDynamoException, *inductor)


def _backward_compiled_now() -> contextlib.AbstractContextManager[object]:
    """Compile the backward graph with the forward one (AOTAutograd defers it to the first
    backward by default), so that its failure, too, is caught here and its time counted."""
    from torch._functorch import config

    if not hasattr(config, "force_non_lazy_backward_lowering"):  # older torch: lazy it stays
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)  # type: ignore[no-any-return]


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class _GuardedCompile:
    """Stands in ``module._compiled_call_impl``: calls the compiled ``_call_impl``, records the
    first call, and falls back to eager on a compiler error. Thread-safe (the step thread)."""

    def __init__(
        self,
        module: nn.Module,
        target: str,
        compiled: Any,
        record: dict[str, Any],
        emit: EventSink,
        report_error: EventSink,
    ) -> None:
        self.module, self.target, self.compiled = module, target, compiled
        self.record, self.emit, self.report_error = record, emit, report_error
        self._lock = threading.Lock()
        self._first_pending = True
        self._failed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            first, self._first_pending = self._first_pending, False
        if not first:
            return self._call(args, kwargs)
        breaks, start = _graph_breaks(), time.perf_counter()
        # Compilation happens inside this call; its wall time needs no device sync, since
        # compiling is host work (the kernels it launches may still be running).
        with _backward_compiled_now():
            result = self._call(args, kwargs)
        seconds = time.perf_counter() - start
        if not self._failed:
            breaks = _graph_breaks() - breaks
            self.emit(
                "compile", target=self.target, **self.record, seconds=seconds, graph_breaks=breaks
            )
        return result

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return self.compiled(*args, **kwargs)
        except _compiler_errors() as error:
            self._revert()
            # A user's bug (a shape error found while tracing) raises again here, eagerly,
            # as the user's own exception; only a compiler at fault is reported.
            result = self.module._call_impl(*args, **kwargs)
            self._report(error)
            return result

    def _revert(self) -> None:
        with self._lock:
            if self.module.__dict__.get("_compiled_call_impl") is self:
                self.module._compiled_call_impl = None

    def _report(self, error: BaseException) -> None:
        with self._lock:
            first_failure, self._failed = not self._failed, True
        if first_failure:
            self.report_error(
                "error",
                kind="compile_failed",
                reason=_reason(error),
                effect="continuing in eager mode",
            )


def _call_impl_of(module: nn.Module) -> Callable[..., Any]:
    """What ``nn.Module.compile`` compiles, ``module._call_impl`` (hooks and forward), called
    from a function of ours: dynamo skips the bound ``_call_impl`` of torch.nn's own classes
    (``nn.Sequential``, ``nn.Linear``), so ``module.compile()`` on one compiles nothing."""

    def call_impl(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    return call_impl


def is_compiled(module: nn.Module) -> bool:
    """Whether :func:`compile_model` compiled ``module`` and it has not fallen back to eager."""
    return isinstance(module.__dict__.get("_compiled_call_impl"), _GuardedCompile)


def compile_model(
    model: nn.Module,
    *,
    mode: CompileMode = "default",
    fullgraph: bool = False,
    blocks: Sequence[str] | None = None,
    backend: str | Callable[..., Any] = "inductor",
    emit: EventSink,
    report_error: EventSink,
) -> list[str]:
    """Compile ``model`` in place (``blocks=None``), or each named submodule (``blocks``:
    qualified names such as ``"blocks.0"``, the per-block compile FSDP2 wants); returns
    the targets compiled (``"model"`` for the whole model).

    Compilation is lazy: at a target's first call, ``emit("compile", target=, mode=,
    fullgraph=, seconds=, graph_breaks=)`` is called once with that call's wall time and the
    graph breaks it added. A compiler error at any call reverts the target to eager, calls
    ``report_error("error", kind="compile_failed", reason=, effect=)`` once and returns the
    eager result; errors raised by the model's own code propagate unchanged.
    """
    targets = [(_WHOLE_MODEL, model)]
    if blocks is not None:
        targets = [(name, model.get_submodule(name)) for name in blocks]
    record = {"mode": mode, "fullgraph": fullgraph}
    for target, module in targets:
        if is_compiled(module):
            continue
        compiled = torch.compile(
            _call_impl_of(module),
            backend=backend,
            mode=mode if backend == "inductor" else None,
            fullgraph=fullgraph,
        )
        guard = _GuardedCompile(module, target, compiled, record, emit, report_error)
        module._compiled_call_impl = guard
    return [target for target, _ in targets]
