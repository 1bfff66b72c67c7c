"""Keeping the cyclic garbage collector off the import heap, so it never stalls the loop.

A full collection walks every object the collector tracks, holding the GIL throughout:
no other thread runs meanwhile, the event loop's thread included, whichever thread the
collection started on. Importing torch and core leaves about 300,000 such objects (modules,
functions, classes), none of them garbage; a full collection over them takes about 110 ms
on a 2-core CPU, and one started by a training's step thread or a worker thread is a
110 ms stall of the application's event loop. With torch's compiler loaded the heap
doubles and so does the stall.

:func:`set_aside_import_heap` moves the objects alive at that point into the collector's
permanent generation (``gc.freeze()``: constant time; reference counting still frees
them), so full collections walk only what was made afterwards. ``core`` calls it once, at
the end of ``import core``: what is alive then is the interpreter's and the libraries'
import-time heap, no run's objects (the modules ``core`` loads on first use, such as the
trackers, stay with the collector: a few thousand objects). Not after building a job's
parts: a frozen object is never collected, and a job's parts form reference cycles with
it (step hooks, callbacks), so a job frozen while alive would never be freed once dropped
(its model and optimizer state included). An application may call ``gc.unfreeze()`` to undo it.
"""

from __future__ import annotations

import gc

__all__ = ("set_aside_import_heap",)


def set_aside_import_heap() -> None:
    """Freeze the objects the collector tracks now (``gc.get_freeze_count()`` says how many:
    not called here, it walks every frozen object, about 25 ms after torch's import)."""
    gc.freeze()
