"""execute_async(): a job awaited on a running event loop leaves the loop free while it runs."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from actorflow.cluster import from_arrow
from actorflow.operators import JobFailedError
from tests.loop_watch import while_ticking

pytestmark = pytest.mark.ray

ROWS = 300


async def _slow(row):
    await asyncio.sleep(0.02)
    return [{**row, "seen": True}]


def _stream(job_name):
    # 300 calls of 20 ms, 4 at a time: the job takes 1.5 s or more.
    return from_arrow([pa.table({"user": list(range(ROWS))})], parallelism=1, job_name=job_name).async_map(
        _slow, capacity=4, timeout_ms=10_000)


def test_the_loop_keeps_ticking_while_the_job_runs(ray_session):
    stream = _stream("execute-async")
    watched = asyncio.run(while_ticking(lambda: stream.execute_async(progress=False)))
    assert watched.result.to_arrow().column("user").to_pylist() == list(range(ROWS))
    assert watched.elapsed_s >= 1.5
    assert watched.longest_gap_s < 0.5, watched  # a blocked loop would miss every tick of the job


def test_the_watch_sees_a_blocking_execute(ray_session):
    # The control: execute() called on the loop's own thread stops every tick until the job ends.
    stream = _stream("execute-blocking")

    async def blocking():
        return stream.execute(progress=False)

    watched = asyncio.run(while_ticking(blocking))
    assert watched.result.output_rows == ROWS
    assert watched.longest_gap_s >= 0.9 * watched.elapsed_s, watched


def test_two_jobs_awaited_at_once_each_finish_with_their_own_output(ray_session):
    async def both():
        return await asyncio.gather(
            from_arrow([pa.table({"user": [1, 2, 3]})], parallelism=1, job_name="together-a")
            .async_map(_slow, capacity=2).execute_async(progress=False),
            from_arrow([pa.table({"user": [7, 8]})], parallelism=1, job_name="together-b")
            .async_map(_slow, capacity=2).execute_async(progress=False),
        )

    a, b = asyncio.run(both())
    assert (a.job, a.to_arrow().column("user").to_pylist()) == ("together-a", [1, 2, 3])
    assert (b.job, b.to_arrow().column("user").to_pylist()) == ("together-b", [7, 8])


def test_a_failed_job_raises_at_the_await(ray_session):
    async def broken(row):
        raise ValueError(f"no profile for {row['user']}")

    stream = from_arrow([pa.table({"user": [1]})], parallelism=1, job_name="execute-async-fails").async_map(broken)
    with pytest.raises(JobFailedError, match="no profile for 1"):
        asyncio.run(stream.execute_async(progress=False))
