"""actorflow: Flink's async I/O, window operator, mailbox and checkpoints on Ray actors, from and to Spark.

``import actorflow as af`` is the one import a user needs::

    import actorflow as af

    spark = af.spark_session()
    enriched = af.enrich(spark.range(1_000), lookup, timeout_ms=2_000, capacity=100)
    counts = (
        af.from_spark(events, timestamp_column="ts")
        .key_by("user")
        .window(af.windows.TumblingEventTimeWindows(size_ms=60_000))
        .aggregate(af.windows.Aggregations(n=af.windows.Count()))
        .to_spark()
    )

The entry points load on first use, so that ``import actorflow`` (and any ``actorflow.operators``
module a worker imports) costs neither Ray's nor Spark's import time. The namespaces:

- ``af.windows``: assigners, triggers, evictors and aggregations;
- ``af.retry``: retry strategies and predicates;
- ``af.errors``: the exception tree;
- ``af.testing``: the operator harness, the manual clock, and the chaos helpers.

The rings underneath (``actorflow.operators``, ``actorflow.actors``, ``actorflow.cluster``,
``actorflow.spark_bridge``) hold the rest; what they export beyond this facade is internal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it; each is imported the first time the name is read.
_ENTRY_POINTS = {
    "enrich": "actorflow.spark_bridge.enrich",
    "enrich_async": "actorflow.spark_bridge.enrich",
    "enrich_stream": "actorflow.spark_bridge.enrich",
    "rerun_dead_letters": "actorflow.spark_bridge.dead_letters",
    "from_spark": "actorflow.spark_bridge.streams",
    "last_job": "actorflow.spark_bridge.streams",
    "spark_session": "actorflow.spark_bridge.session",
    "stop_spark": "actorflow.spark_bridge.session",
    "ensure_ray": "actorflow.spark_bridge.session",
    "on_spark_cluster": "actorflow.spark_bridge.spark_cluster",
    "from_arrow": "actorflow.cluster.datastream",
    "DataStream": "actorflow.cluster.datastream",
    "SparkDataStream": "actorflow.spark_bridge.streams",
    "StreamingRun": "actorflow.spark_bridge.streaming",
    "JobResult": "actorflow.cluster.job",
    "AsyncFunction": "actorflow.operators.async_function",
    "ResultFuture": "actorflow.operators.async_function",
    "AsyncBatchFunction": "actorflow.operators.async_batch_function",
    "arrow_batch": "actorflow.operators.arrow_batch",
    "DeadLetter": "actorflow.operators.async_wait_operator",
    "current_request_key": "actorflow.operators.request_keys",
    "current_request_keys": "actorflow.operators.request_keys",
    "ActorflowError": "actorflow.operators.errors",
    "Service": "actorflow.operators.service",
    "AdaptiveCapacity": "actorflow.operators.service",
    "RateLimit": "actorflow.operators.service",
    "CircuitBreaker": "actorflow.operators.service",
    "LookupCache": "actorflow.operators.service",
    "Hedge": "actorflow.operators.service",
    "ServiceOverloaded": "actorflow.operators.service",
}
_NAMESPACES = ("errors", "retry", "testing", "windows")

__all__ = sorted([*_ENTRY_POINTS, *_NAMESPACES, "__version__"])

if TYPE_CHECKING:
    from . import errors, retry, testing, windows
    from .cluster.datastream import DataStream, from_arrow
    from .cluster.job import JobResult
    from .operators.arrow_batch import arrow_batch
    from .operators.async_batch_function import AsyncBatchFunction
    from .operators.async_function import AsyncFunction, ResultFuture
    from .operators.async_wait_operator import DeadLetter
    from .operators.errors import ActorflowError
    from .operators.request_keys import current_request_key, current_request_keys
    from .operators.service import (
        AdaptiveCapacity,
        CircuitBreaker,
        Hedge,
        LookupCache,
        RateLimit,
        Service,
        ServiceOverloaded,
    )
    from .spark_bridge.dead_letters import rerun_dead_letters
    from .spark_bridge.enrich import enrich, enrich_async, enrich_stream
    from .spark_bridge.session import ensure_ray, spark_session, stop_spark
    from .spark_bridge.spark_cluster import on_spark_cluster
    from .spark_bridge.streaming import StreamingRun
    from .spark_bridge.streams import SparkDataStream, from_spark, last_job


def __getattr__(name: str) -> Any:
    if name in _NAMESPACES:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    elif name in _ENTRY_POINTS:
        value = getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    else:
        raise AttributeError(f"module 'actorflow' has no attribute {name!r}")
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
