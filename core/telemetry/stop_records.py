"""The records of a stop that cannot wait for a step boundary as usual (see
``core.telemetry.records`` for the schema's rules).

No ``from __future__ import annotations``: checks read annotations.
"""

from typing import Annotated, Literal

from core.telemetry.record_common import Common

__all__ = ("ForcedExit", "SignalReceived", "StepThreadAbandoned", "StepThreadParked")


class SignalReceived(Common):
    """When a second SIGTERM/SIGINT arrives during a stop (a third one exits at once)."""

    signal: Annotated[str, "SIGTERM or SIGINT"]
    action: Annotated[Literal["hurry"], "what the signal does"]
    note: Annotated[str, "what happens next, in words"]


class StepThreadAbandoned(Common):
    """Error: at a stop, the step thread did not reach a step boundary within stop_grace_s
    (inside a step or, with several ranks, where parking is not possible, waiting for the train
    loader)."""

    stop_grace_s: Annotated[float, "the most a stop waits for a running step"]
    waited_s: Annotated[float, "the seconds this stop waited"]
    waiting_for: Annotated[Literal["step", "data"], "where the thread was: a step, its loader"]
    last_checkpoint: Annotated[str | None, "the last good checkpoint"]
    step: Annotated[int, "optimizer steps completed"]
    reason: Annotated[str, "what happened, in words"]


class StepThreadParked(Common):
    """Warning: at a stop, the step thread still waited for the train loader after
    loader_grace_s; it was parked at that step boundary (it never steps again) and the stop
    checkpoint is written from there."""

    loader_grace_s: Annotated[float, "the most a stop waits for the loader"]
    waited_s: Annotated[float, "the seconds this stop waited"]
    step: Annotated[int, "optimizer steps completed (the checkpoint's step)"]
    note: Annotated[str, "what follows, in words"]


class ForcedExit(Common):
    """Error: a third stop signal; the process exits without waiting for the checkpoint."""

    signal: Annotated[str, "SIGTERM or SIGINT"]
    last_checkpoint: Annotated[str | None, "the last good checkpoint"]
