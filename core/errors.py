"""Every exception `core` raises on purpose, in one place.

Each message says what happened, what was kept safe, and what to do next. Configuration
errors name the field, show the bad value with ``!r``, list the allowed values and suggest
a fix (see :func:`config_error`).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator
from typing import Any, Literal

__all__ = (
    "BatchFormatError",
    "CheckpointError",
    "ClusterStartTimeout",
    "ConfigError",
    "CoreError",
    "DistributedTimeoutError",
    "EmptyLoaderError",
    "IncompatibleCheckpointError",
    "LineageHeldError",
    "LossFormatError",
    "MainNotGuarded",
    "NonFiniteLossError",
    "OutOfMemoryError",
    "SignalReceived",
    "TrainingProcessDied",
    "TrainingStepError",
    "UnevenLoadersError",
    "UnsafeCheckpointError",
    "config_error",
    "note_raised_in",
    "raised_in",
    "resume_advice",
    "resume_fix",
    "resume_phrased_for",
)

FrontEnd = Literal["python", "command line"]
_RESUME = {"python": "resume='auto'", "command line": "--resume auto"}
_front_end: list[FrontEnd] = ["python"]


def resume_advice() -> str:
    """How to resume, as the user types it where they are: ``resume='auto'`` in Python,
    ``--resume auto`` under ``core-train`` (which runs inside :func:`resume_phrased_for`)."""
    return _RESUME[_front_end[-1]]


def resume_fix(first: str) -> str:
    """``Fix: <first>, then resume with <how, where the user is>.``"""
    return f"Fix: {first}, then resume with {resume_advice()}."


@contextlib.contextmanager
def resume_phrased_for(front_end: FrontEnd) -> Iterator[None]:
    """Within the block, messages say how to resume as ``front_end`` spells it."""
    _front_end.append(front_end)
    try:
        yield
    finally:
        _front_end.pop()


class CoreError(Exception):
    """Base class of every error raised by `core` itself."""

    rank: int | None = None
    """Under several ranks, when every rank raises what one of them ran into: that rank."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt as raised, whatever its constructor takes: an error crosses from a training
        # process (``isolation="process"``) to the one that awaits ``train()``.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[CoreError], args: tuple[Any, ...], state: dict[str, Any]) -> CoreError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(CoreError, ValueError):
    """Raised before training starts when an argument or config field has a bad value.

    ``field`` is the name the message starts with (set by :func:`config_error`);
    :meth:`renamed` re-issues the error under another name, such as the dotted path of the
    field in the config tree (``precision.scaler.min_scale``) or a factory keyword.
    """

    field: str | None = None

    def renamed(self, name: str) -> ConfigError:
        """The same error, its message and ``field`` naming ``name`` instead."""
        message = str(self)
        if self.field is not None and message.startswith(f"{self.field}="):
            message = name + message[len(self.field) :]
        error = type(self)(message)
        error.field = name if self.field is not None else None
        return error


class EmptyLoaderError(ConfigError):
    """Raised when a training or validation loader yields no batch at all."""


class BatchFormatError(CoreError, TypeError):
    """Raised when a batch is neither an ``(inputs, targets)`` pair nor a dict of tensors."""


class LossFormatError(CoreError, TypeError):
    """Raised when the loss (from ``loss_fn`` or the model) is not a scalar floating tensor."""


class NonFiniteLossError(CoreError, FloatingPointError):
    """Raised when ``max_consecutive_nonfinite`` optimizer steps in a row had a non-finite
    loss or gradient norm (each was skipped, leaving weights and optimizer state untouched).

    Under several ranks every rank raises it at the same step; ``ranks`` names those whose
    own loss was not finite (the others' gradients were, through the all-reduce)."""

    own_loss_nonfinite: bool = False
    """This process's own loss was non-finite in the streak (not only its gradients)."""
    ranks: tuple[int, ...] = ()


class OutOfMemoryError(CoreError, MemoryError):
    """Raised when a step runs out of memory even with micro-batches of one sample."""


class TrainingStepError(CoreError, RuntimeError):
    """Raised when the user's code or data fails in a run: inside a step (the data loader,
    the model, ``loss_fn``, ``training_step``) or in a validation (the ``val_loader``, the
    model, ``loss_fn``, ``validation_step``, a metric). Names the function where it can, the
    epoch, the optimizer step and the batch index, and chains the original exception."""


class DistributedTimeoutError(CoreError, RuntimeError):
    """Raised on a rank whose collective did not finish within ``timeout_s``."""


class CheckpointError(CoreError, RuntimeError):
    """Raised when a checkpoint cannot be written, found or read."""


class UnsafeCheckpointError(CheckpointError):
    """Raised when a checkpoint file holds pickled code or types that are not allow-listed.
    Nothing in the file is executed."""


class IncompatibleCheckpointError(CheckpointError):
    """Raised when resuming with a configuration that differs in fields a checkpoint's
    state depends on (named in the message), or from a checkpoint this version of core does
    not read (another checkpoint format or manifest version, a state without its parts)."""


class LineageHeldError(CheckpointError):
    """Raised by ``resume="strict"`` when the lineage it would continue is held by another
    live run (one writer per lineage); the message names that run, its pid and its host."""


class SignalReceived(CoreError):
    """Raised by ``train()`` after SIGTERM/SIGINT stopped it at a step boundary and a
    checkpoint was written; ``exit_code`` is the shell convention (143, 130).

    With ``abandoned=True`` the step thread did not reach a boundary within
    ``stop_grace_s`` (a hung loader): nothing new was saved, and ``checkpoint`` is the last
    good one."""

    def __init__(
        self,
        signum: int,
        checkpoint: str | None,
        *,
        abandoned: bool = False,
        rank: int | None = None,
    ) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.checkpoint = checkpoint
        self.abandoned = abandoned
        self.rank = rank  # under several ranks: the one the signal reached (all stop)
        name = signal.Signals(signum).name
        if rank is not None:
            name = f"{name} (sent to rank {rank})"
        if abandoned:
            kept = f"the last good checkpoint is {checkpoint}" if checkpoint else "none was saved"
            message = (
                f"stopped by {name}, but the step thread did not reach a step boundary within "
                f"stop_grace_s (it is left running as a daemon thread); no new checkpoint, "
                f"{kept}."
            )
        else:
            kept = f"checkpoint {checkpoint} written" if checkpoint else "no checkpoint written"
            message = f"stopped by {name} at a step boundary; {kept}."
        super().__init__(message)

    def __str__(self) -> str:
        # Phrased where it is read: the process that prints it may not be the one that raised
        # it (a rank, a training process), and ``core-train`` says ``--resume auto``.
        return f"{self.args[0]} Resume with {resume_advice()}."


class TrainingProcessDied(CoreError, RuntimeError):
    """Raised by ``train()`` under ``run.isolation="process"`` when the training process
    ended without reporting how its run ended: killed by a signal (the OOM killer's SIGKILL,
    a segfault), ``os._exit``, or killed after not stopping within ``stop_grace_s``.
    ``exit_code`` and ``signal_name`` say how it ended (one is None; both where nobody could
    tell); ``checkpoint`` is the last good checkpoint, from which ``resume="auto"`` continues."""

    def __init__(
        self,
        exit_code: int | None,
        signal_name: str | None,
        checkpoint: str | None,
        *,
        why: str = "",
        finished: str | None = None,
    ) -> None:
        self.exit_code, self.signal_name, self.checkpoint = exit_code, signal_name, checkpoint
        how = "ended"
        if signal_name:
            how = f"was killed by {signal_name}"
        elif exit_code is not None:
            how = f"exited with code {exit_code}"
        self.finished = finished
        ended = "" if finished else " before its run ended"
        super().__init__(f"the training process {how}{why}{ended}; the service is unharmed.")

    def __str__(self) -> str:  # phrased where it is read, as SignalReceived's
        checkpoint, resume = self.checkpoint, resume_advice()
        if checkpoint and self.finished:
            kept = (
                f"the run had finished ({self.finished}): its last checkpoint {checkpoint} "
                f"holds the trained weights, which core.load_weights(checkpoint, model) loads; "
                f"{resume} would start a new run"
            )
        elif checkpoint:
            kept = f"the last good checkpoint is {checkpoint}; {resume} continues from it"
        else:
            kept = f"no checkpoint was written yet; {resume} starts over"
        return f"{self.args[0]} {kept}."


class MainNotGuarded(TrainingProcessDied):
    """Raised by ``train()`` under ``run.isolation="process"`` when the training process
    exited at once: it imports the program's main module, and the program creates its run
    when imported (no ``if __name__ == "__main__":`` guard). Nothing was trained and no
    checkpoint was written, so ``checkpoint`` is None and resuming cannot help."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code, None, None)
        self.args = (
            f"the training process exited at once (code {exit_code}): it imports this "
            "program's main module, and the program creates its run when imported, so "
            "nothing was trained and no checkpoint was written; the service is unharmed. "
            'Fix: start the run under `if __name__ == "__main__":`.',
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ClusterStartTimeout(CoreError, TimeoutError):
    """Raised by ``train()`` under ``run.isolation="ray"`` when the cluster did not give the
    run what it asked for (``asked``: per actor) within ``ray.start_timeout_s``: no node has
    it (a GPU asked of a CPU-only cluster), or other work holds it. Nothing was trained."""

    def __init__(
        self,
        asked: dict[str, float],
        timeout_s: float,
        *,
        total: dict[str, float],
        free: dict[str, float],
    ) -> None:
        self.asked, self.timeout_s, self.total, self.free = asked, timeout_s, total, free
        never = any(amount > total.get(name, 0.0) for name, amount in asked.items())
        why = "other work holds it (it would start once freed)"
        if never:
            why = "no node of the cluster has that much"
        super().__init__(
            f"the run waited ray.start_timeout_s ({timeout_s:g} s) for an actor with "
            f"{_amounts(asked)}; the cluster has {_amounts(total)} ({_amounts(free)} free): "
            f"{why}. Fix: ask for less (ray.num_cpus, ray.num_gpus), add a node that has it "
            "(ray start --address=...), or raise ray.start_timeout_s (None: wait as long as "
            "it takes)."
        )


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in resources.items())


_RAISED_IN = "core_raised_in"


def note_raised_in(exc: BaseException, function: str) -> None:
    """Note that ``exc`` escaped the user's ``function`` (``loss_fn``, ``training_step``, a
    metric), for the error core raises for it to name (:func:`raised_in`). A note from a
    function called inside stands. The exception itself is unchanged: the out-of-memory
    retry still recognises it."""
    if raised_in(exc) is None:
        with contextlib.suppress(AttributeError, TypeError):  # an exception without __dict__
            setattr(exc, _RAISED_IN, function)


def raised_in(exc: BaseException) -> str | None:
    """The user's function ``exc`` escaped from, where :func:`note_raised_in` noted one."""
    noted = getattr(exc, _RAISED_IN, None)
    return noted if isinstance(noted, str) else None


def _short_repr(value: object) -> str:
    text = repr(value)
    if "\n" in text or len(text) > 120:
        kind = type(value)
        return f"<{kind.__module__}.{kind.__qualname__} object>"
    return text


def config_error(
    field: str,
    value: object,
    allowed: str | Iterable[object],
    fix: str | None = None,
    *,
    error: type[ConfigError] = ConfigError,
) -> ConfigError:
    """Build a :class:`ConfigError` with the house message format.

    >>> str(config_error("max_epochs", 0, "an integer >= 1"))
    'max_epochs=0 is invalid; allowed: an integer >= 1.'
    """
    allowed_text = allowed if isinstance(allowed, str) else ", ".join(repr(a) for a in allowed)
    message = f"{field}={_short_repr(value)} is invalid; allowed: {allowed_text}."
    if fix:
        message += f" Fix: {fix}"
    exc = error(message)
    exc.field = field
    return exc


class UnevenLoadersError(ConfigError):
    """Raised on every rank when the ranks' ``train_loader`` (or ``val_loader``) hold
    different numbers of batches: each step is a collective, so every rank must take the
    same number. Raised when the optimizer is built (validation) or an epoch starts
    (training), before a step; ``use_distributed_sampler=False`` lets a user shard unevenly."""
