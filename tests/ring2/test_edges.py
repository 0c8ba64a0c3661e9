"""Edges of the Ray shell: per-record outcomes of blocking batches, background failures, progress."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from cluster import from_arrow

pytestmark = pytest.mark.ray


def test_a_slow_call_in_a_blocking_batch_times_out_alone(ray_session):
    # Every task carries 25 calls; two of them hang far past the deadline. Only those two may
    # get the fallback: the other rows of their tasks finish in time and keep their results, and
    # the rows queued behind the tasks do not wait for the hung calls' slots. (The deadline has
    # room for a worker process that starts under the first calls on a busy machine.)
    slow = {7, 42}

    def lookup(row):
        time.sleep(8.0 if row["user"] in slow else 0.01)
        return [{**row, "how": "called"}]

    n = 100
    table = (
        from_arrow([pa.table({"user": list(range(n))})], parallelism=1, job_name="blocking-slow")
        .async_map(lookup, capacity=50, timeout_ms=3_000, fallback=lambda row: [{**row, "how": "fallback"}])
        .execute(progress=False)
        .to_arrow()
    )
    how = dict(zip(table.column("user").to_pylist(), table.column("how").to_pylist()))
    assert sorted(how) == list(range(n))
    assert {u for u, h in how.items() if h == "fallback"} == slow


def test_a_hung_blocking_call_frees_its_task_slot_after_the_timeout(ray_session):
    # One task slot (max_tasks=1), and the first task's only call hangs: the rows behind it must
    # still run once that call has timed out, instead of waiting for the hung thread.
    def lookup(row):
        time.sleep(30.0 if row["user"] == 0 else 0.001)
        return [row]

    start = time.monotonic()
    table = (
        from_arrow([pa.table({"user": list(range(20))})], parallelism=1, batch_size=1, job_name="blocking-hung")
        .async_map(lookup, capacity=1, max_tasks=1, timeout_ms=500, fallback=lambda row: [{**row, "user": -1}])
        .execute(progress=False)
        .to_arrow()
    )
    assert table.column("user").to_pylist() == [-1] + list(range(1, 20))
    assert time.monotonic() - start < 25  # well before the hung call would have returned
