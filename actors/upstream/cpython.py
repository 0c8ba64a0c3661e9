"""CPython's cyclic garbage collector: freeze what a Ray worker's imports built.

Verified on CPython 3.11 (3.11.7) (``gc.freeze``, ``gc.get_freeze_count``, ``gc.set_threshold``).

What a worker imports lives as long as its process. ``freeze_what_is_built()`` collects once and
moves every object left to the permanent generation, so that the collection an actor makes before
it starts walks only its own objects: a millisecond instead of about 40. ``relax_collector()`` is
what a long-lived actor does as it starts: freeze what it built and collect less often, so that the
collector's full passes (tens of ms each) do not stall its event loop under every request.
"""

from __future__ import annotations

import gc

from . import enabled, failed

__all__ = ["ACTOR_THRESHOLDS", "freeze_what_is_built", "relax_collector"]

#: The collector's thresholds in an actor: records are mostly acyclic and freed by reference counting.
ACTOR_THRESHOLDS = (50_000, 50, 100)


def freeze_what_is_built() -> bool:
    """Collect once and freeze every object left (switch ``ACTORFLOW_NO_GC_FREEZE``); True if it did."""
    if not enabled("gc_freeze"):
        return False
    try:
        gc.collect()
        gc.freeze()
    except Exception as error:  # noqa: BLE001 - costs the collector's time only
        failed("gc_freeze", error)
        return False
    return True


def relax_collector() -> bool:
    """Freeze what this process built and raise the collector's thresholds (``ACTOR_THRESHOLDS``),
    unless ``ACTORFLOW_NO_GC_FREEZE`` is set; True if it did."""
    if not enabled("gc_freeze"):
        return False
    try:
        gc.freeze()
        gc.set_threshold(*ACTOR_THRESHOLDS)
    except Exception as error:  # noqa: BLE001 - costs the collector's time only
        failed("gc_freeze", error)
        return False
    return True
