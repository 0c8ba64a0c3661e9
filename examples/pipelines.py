"""Small pipelines to run with the console command, e.g. ``actorflow run examples.pipelines:tagged_users``.

A pipeline is a ``DataStream`` or a function that returns one; the command calls it once Ray runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa

from actorflow.cluster import DataStream, from_arrow

__all__ = ["slow_users", "steady_users", "tagged_users"]


def tagged_users(n: int = 2_000) -> DataStream:
    """``n`` users, each tagged by an async call of about a millisecond, two instances, in order."""

    async def tag(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        return [{**row, "tag": f"user-{row['user']}"}]

    return from_arrow([pa.table({"user": list(range(n))})], parallelism=2, job_name="tagged-users").async_map(
        tag, capacity=50, name="tag")


def slow_users() -> DataStream:
    """A job that runs for about a minute: two requests in flight, 50 ms each (to watch with ``status``)."""

    async def slow(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.05)
        return [row]

    return from_arrow([pa.table({"user": list(range(2_400))})], parallelism=1, job_name="slow-users").async_map(
        slow, capacity=2, name="slow")


def steady_users(n: int = 40_000) -> DataStream:
    """Users tagged by an async call of a millisecond, two instances, for a few seconds: small
    enough to run under ``actorflow chaos`` in a test, long enough to be killed."""

    async def tag(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        return [{**row, "tag": f"user-{row['user']}"}]

    table = pa.table({"user": list(range(n))})
    return from_arrow([table.slice(i, 5_000) for i in range(0, n, 5_000)], parallelism=2, batch_size=200,
                      job_name="steady-users").async_map(tag, capacity=4, name="tag")
