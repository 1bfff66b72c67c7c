"""SIGTERM and SIGINT as a graceful stop (finish the step, checkpoint, exit 143 / 130).

Used when ``core`` owns the process (the examples, or ``handle_signals=True``): the first
signal cancels the run's scope, which the step thread sees at its next step boundary.
"""

from __future__ import annotations

import signal
import threading

import anyio

__all__ = ("STOP_SIGNALS", "watch_stop_signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def watch_stop_signals(scope: anyio.CancelScope, received: list[int]) -> None:
    """Wait for SIGTERM/SIGINT; record it in ``received`` and cancel ``scope``."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "handle_signals=True needs train() to run in the main thread's event loop; "
            "install your own handlers otherwise."
        )
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for signum in signals:
            received.append(int(signum))
            scope.cancel()
            return
