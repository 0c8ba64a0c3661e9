"""What a test author reaches for: the operator harness, the async operators, the manual clock, and the chaos helpers.

>>> import actorflow as af
>>> h = af.testing.OperatorHarness(af.testing.MapOperator(str.upper))
>>> h.process_element("a", timestamp_ms=1)
>>> h.output_values()
['A']

The chaos helpers (``ChaosMonkey``, ``compare_outputs``, ``kill_actor``, ``kill_node``) need Ray and load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .operators.clock import ManualClock
from .operators.elements import CheckpointBarrier, Record, Watermark, WatermarkStatus
from .operators.async_batch_operator import async_wait_batch
from .operators.async_wait_operator import async_wait
from .operators.harness import OperatorHarness
from .operators.operator import FilterOperator, FlatMapOperator, MapOperator

_CHAOS = ("ChaosMonkey", "ChaosReport", "compare_outputs", "kill_actor", "kill_node")

__all__ = [
    "CheckpointBarrier", "FilterOperator", "FlatMapOperator", "ManualClock", "MapOperator", "OperatorHarness", "Record",
    "Watermark", "WatermarkStatus", "async_wait", "async_wait_batch", *_CHAOS,
]

if TYPE_CHECKING:
    from .cluster.chaos import ChaosMonkey, ChaosReport, compare_outputs, kill_actor, kill_node


def __getattr__(name: str) -> Any:
    if name in _CHAOS:
        value = getattr(importlib.import_module("actorflow.cluster.chaos"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'actorflow.testing' has no attribute {name!r}")
