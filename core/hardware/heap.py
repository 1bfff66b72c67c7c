"""Keeping the cyclic garbage collector off the import heap, so it never stalls the loop.
:func:`set_aside_import_heap` (``gc.freeze()``) is called once, at the end of ``import core``;
an application may call ``gc.unfreeze()`` to undo it.
"""

from __future__ import annotations

import gc

__all__ = ("set_aside_import_heap",)


def set_aside_import_heap() -> None:
    """Freeze the objects the collector tracks now (``gc.get_freeze_count()`` says how many:
    not called here, it walks every frozen object, about 25 ms after torch's import)."""
    # A full collection holds the GIL while it walks every tracked object: importing torch and
    # core leaves ~300,000 (twice that with torch's compiler), ~110 ms on a 2-core CPU, a stall
    # of the event loop whichever thread collects. Frozen (constant time; reference counting
    # still frees them), they are never walked. Only at import: a job frozen while alive forms
    # cycles with its hooks and callbacks and would never be freed once dropped. Modules core
    # loads on first use (the trackers) stay with the collector: a few thousand objects.
    gc.freeze()
