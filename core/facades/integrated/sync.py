"""Telling whether the calling thread is inside a running event loop, for the synchronous
facades that run one of their own (``anyio.run`` cannot nest in a running loop)."""

from __future__ import annotations

import asyncio
import sys

__all__ = ("running_event_loop",)


def running_event_loop() -> str | None:
    """``"asyncio"`` or ``"trio"`` when that library runs an event loop in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return "asyncio"
    trio = sys.modules.get("trio")  # only a program that imported trio can be running it
    if trio is None:
        return None
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
    return "trio"
