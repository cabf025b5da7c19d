"""Python's cyclic garbage collector, held off while a burst of long-lived objects is made.

Importing torch and transformers and loading a model make a few hundred thousand objects that live as long as
the process or the model. The collector walks every tracked object each time the long-lived ones have grown by a
quarter, so a start of `specula generate` spent about 0.8 s in 7 full passes over them (2 vCPUs AMD EPYC). Held
off during such a burst, it does once what the burst needs at its end: after the imports, their objects are
frozen (they live as long as the process; the collector never walks them again); after a model's load, one
collection over what is not frozen, so that what the load left unreachable is freed and a model let go later is
freed as before."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

_froze = False  # the process's first burst of imports is frozen; later calls (in one process) import nothing new


@contextmanager
def collected_after(freeze: bool = False) -> Iterator[None]:
    """No cyclic collection inside the block; after it, with `freeze` (for the objects of a process's first
    imports, which live as long as it), every object so far frozen, the first time in the process only; else one
    collection. Inside another such block, the outer block's end does it."""
    global _froze
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        if freeze and not _froze:
            _froze = True
            gc.freeze()
        elif not freeze:
            gc.collect()
