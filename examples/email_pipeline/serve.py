"""Run the app with uvicorn inside the current asyncio program, on 127.0.0.1.

Example::

    async with serving(create_app(settings), port=0) as server:   # 0: a free port
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.get("/health")
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

__all__ = ("HOST", "Serving", "serving")

#: Where the service listens: this machine only.
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Serving:
    """A server running in a task of this event loop: its base URL, and its end."""

    url: str
    task: asyncio.Task[None]

    async def wait_closed(self) -> None:
        """Return once the server has stopped (after Ctrl-C, for one)."""
        await asyncio.shield(self.task)


@asynccontextmanager
async def serving(app: FastAPI, port: int = 0) -> AsyncIterator[Serving]:
    """Serve ``app`` on ``127.0.0.1:port`` in a task of this event loop (``port=0`` picks a
    free port); on exit, shut down gracefully (the lifespan's end cancels a run in flight,
    which keeps its checkpoint). uvicorn handles Ctrl-C: the server stops, then
    ``KeyboardInterrupt`` is raised again once it has.

    >>> async with serving(app) as server:  # doctest: +SKIP
    ...     server.url
    'http://127.0.0.1:43125'
    """
    config = uvicorn.Config(app, host=HOST, port=port, lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():  # it could not bind or start: raise its error
                await task
                raise RuntimeError(f"uvicorn stopped before it started on {HOST}:{port}")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield Serving(url=f"http://{HOST}:{bound}", task=task)
    finally:
        server.should_exit = True
        await task
