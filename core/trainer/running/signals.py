"""SIGTERM and SIGINT as a graceful stop (finish the step, checkpoint, exit 143 / 130).

Used when ``core`` owns the process (the examples, or ``handle_signals=True``). The handlers
stay installed until ``train()`` returns, so a repeated signal never kills the run before
its stop checkpoint:

1. the first signal cancels the run's scope: the step thread stops at its next step
   boundary and the stop checkpoint is written;
2. a second one means "hurry": a step thread waiting for its loader is parked at once, a
   running step gets at most a few more seconds (``core.trainer.running.step_thread``); the stop
   still checkpoints at the boundary when it gets one;
3. a third one means "force": ``on_force`` ends the process at once (it says why, and
   where the last good checkpoint is).

After a run stopped by a signal, ``train()`` leaves SIGTERM and SIGINT ignored: the
checkpoint is written and the process is on its way out (``SignalReceived.exit_code``), so
a late repeat must not kill it with a traceback or a raw -15 halfway through its cleanup
(Python resets its own handlers to the default action while it shuts down; an ignored
signal stays ignored). A program that goes on after ``SignalReceived`` re-installs its own.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import anyio

__all__ = ("STOP_SIGNALS", "watch_stop_signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HURRY, _FORCE = 2, 3


async def watch_stop_signals(
    scope: anyio.CancelScope,
    received: list[int],
    *,
    on_hurry: Callable[[int], None],
    on_force: Callable[[int], None],
) -> None:
    """Record each SIGTERM/SIGINT in ``received``; cancel ``scope`` on the first, call
    ``on_hurry`` on the second and ``on_force`` on the third."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "handle_signals=True needs train() to run in the main thread's event loop; "
            "install your own handlers otherwise."
        )
    try:
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async for signum in signals:
                received.append(int(signum))
                if len(received) == 1:
                    scope.cancel()
                elif len(received) == _HURRY:
                    on_hurry(int(signum))
                elif len(received) >= _FORCE:
                    on_force(int(signum))
    finally:
        if received:  # the process is on its way out: a late repeat must not kill it raw
            for stop_signal in STOP_SIGNALS:
                signal.signal(stop_signal, signal.SIG_IGN)
