"""SIGTERM and SIGINT as a graceful stop (finish the step, checkpoint, exit 143 / 130).

Used when ``core`` owns the process (the examples, or ``handle_signals=True``): the first
signal stops the run at a step boundary, a second hurries the stop, a third exits at once
(docs/checkpoints-and-reliability.md). A program that goes on after ``SignalReceived``
re-installs its own handlers.
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
        # The process is on its way out: a late repeat must not kill it with a traceback or a
        # raw -15 halfway through its cleanup (Python restores the default action while it
        # shuts down; an ignored signal stays ignored).
        if received:
            for stop_signal in STOP_SIGNALS:
                signal.signal(stop_signal, signal.SIG_IGN)
