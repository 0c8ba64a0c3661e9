"""``async_map_batch`` on a real local Ray: every kind of batch function, flushes by size and by
time, timeouts and fallbacks, dead letters per record, blocking batches on Ray tasks; and
``async_map``'s ``copy_inputs``."""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from actorflow.cluster import from_arrow
from actorflow.operators import (
    DEAD_LETTER,
    AsyncBatchFunction,
    ConfigurationError,
    FixedDelay,
    Record,
    StreamOperator,
    arrow_batch,
)

pytestmark = pytest.mark.ray


def _users(n, parts=2):
    table = pa.table({"user": list(range(n))})
    step = -(-n // parts)
    return [table.slice(i, step) for i in range(0, n, step)]


def _tagged(values, **extra):
    """Each value with the first user and the size of its batch, so a test can see the batches."""
    return [[{**v, "batch": values[0]["user"], "size": len(values), **extra}] for v in values]


def _batches(rows):
    """Batch sizes in the order their first records appear."""
    sizes = {}
    for r in rows:
        sizes.setdefault(r["batch"], r["size"])
    return list(sizes.values())


class Trickle(StreamOperator):
    """Lets its input through ``chunk`` records every ``gap_ms``, on processing-time timers.

    Watermarks wait in line with the records, so none overtakes a held record.
    """

    def __init__(self, chunk, gap_ms):
        self.chunk, self.gap_ms = chunk, gap_ms

    def open(self):
        self.held = deque()
        self.timer = None

    def process_element(self, record):
        self._hold(record)

    def process_watermark(self, watermark):
        self._hold(watermark)

    def _hold(self, element):
        self.held.append(element)
        if self.timer is None:
            now = self.context.processing_time.now_ms()
            self.timer = self.context.processing_time.register_timer(now + self.gap_ms, self._on_timer)

    def _on_timer(self, _ts):
        self.timer = None
        records = 0
        while self.held and records < self.chunk:
            element = self.held.popleft()
            if isinstance(element, Record):
                self.output.collect(element)
                records += 1
            else:
                self.output.emit_watermark(element)
        if self.held:
            now = self.context.processing_time.now_ms()
            self.timer = self.context.processing_time.register_timer(now + self.gap_ms, self._on_timer)
        self.context.signal_progress()

    def is_drained(self):
        return not self.held


def test_async_def_keeps_input_order_across_size_and_time_flushes(ray_session):
    async def lookup(values):
        await asyncio.sleep(0.001 * ((values[0]["user"] * 7) % 5))  # batches complete out of order
        return _tagged(values)

    n = 40
    rows = (
        from_arrow(_users(n, parts=1), parallelism=1, job_name="batch-flushes")
        .transform("trickle", lambda: Trickle(chunk=6, gap_ms=150))
        .async_map_batch(lookup, batch_size=4, batch_timeout_ms=20, capacity=3)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [r["user"] for r in rows] == list(range(n))
    # Every 6 records: a batch of 4 leaves full, the other 2 leave 20 ms later on their timer,
    # long before the next 6 arrive; the last 4 leave full.
    assert _batches(rows) == [4, 2] * 6 + [4]


def test_many_batches_over_two_instances_keep_input_order(ray_session):
    async def lookup(values):
        await asyncio.sleep(0.001 * ((values[0]["user"] * 7919) % 13))
        return _tagged(values)

    n = 5_000
    rows = (
        from_arrow(_users(n), parallelism=2, job_name="batch-ordered")
        .async_map_batch(lookup, batch_size=64, batch_timeout_ms=5, capacity=4)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [r["user"] for r in rows] == list(range(n))
    assert max(r["size"] for r in rows) == 64


def test_unordered_emits_every_record_once(ray_session):
    async def lookup(values):
        await asyncio.sleep(0.001 * (values[0]["user"] % 7))
        return [[v] for v in values]

    n = 3_000
    table = (
        from_arrow(_users(n), parallelism=2, job_name="batch-unordered")
        .async_map_batch(lookup, batch_size=50, ordered=False, capacity=4)
        .execute(progress=False)
        .to_arrow()
    )
    assert sorted(table.column("user").to_pylist()) == list(range(n))


def test_blocking_batches_run_as_ray_tasks_at_most_capacity_at_once(ray_session):
    def lookup(values):
        started = time.time()
        time.sleep(0.05)
        return _tagged(values, pid=os.getpid(), started=started, ended=time.time())

    n = 600
    rows = (
        from_arrow(_users(n, parts=1), parallelism=1, job_name="batch-blocking")
        .map(lambda row: {**row, "actor_pid": os.getpid()})
        .async_map_batch(lookup, batch_size=25, capacity=3)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [r["user"] for r in rows] == list(range(n))
    assert set(_batches(rows)) == {25}
    # Not on the operator actor (whose loop must never block), nor on the driver.
    assert not {r["pid"] for r in rows} & ({r["actor_pid"] for r in rows} | {os.getpid()})
    spans = {r["batch"]: (r["started"], r["ended"]) for r in rows}
    most = max(sum(1 for s, e in spans.values() if s <= t < e) for t, _ in spans.values())
    assert 2 <= most <= 3  # batches overlap, and never more than capacity


def test_a_blocking_batch_past_its_deadline_is_abandoned_and_gets_the_fallback(ray_session):
    def lookup(values):
        if any(v["user"] == 40 for v in values):
            time.sleep(30)  # hangs; its late result must be ignored
        return [[{**v, "source": "service"}] for v in values]

    started = time.time()
    rows = (
        from_arrow(_users(200, parts=1), parallelism=1, job_name="batch-abandoned")
        # 5 s: enough for any other batch's task even when a worker process must start under load.
        .async_map_batch(lookup, batch_size=20, capacity=2, timeout_ms=5_000,
                         fallback=lambda row: [{**row, "source": "fallback"}])
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert time.time() - started < 25  # the job did not wait for the hung batch
    assert [r["user"] for r in rows] == list(range(200))
    assert {r["user"] for r in rows if r["source"] == "fallback"} == set(range(40, 60))


def test_an_async_batch_that_hangs_times_out_and_each_record_gets_the_fallback(ray_session):
    async def lookup(values):
        if values[0]["user"] == 30:
            await asyncio.sleep(3600)
        return [[{**v, "source": "service"}] for v in values]

    rows = (
        from_arrow(_users(100, parts=1), parallelism=1, job_name="batch-timeout")
        .async_map_batch(lookup, batch_size=10, capacity=2, timeout_ms=300,
                         fallback=lambda row: [{**row, "source": "fallback"}])
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [r["user"] for r in rows] == list(range(100))
    assert {r["user"] for r in rows if r["source"] == "fallback"} == set(range(30, 40))


@pytest.mark.parametrize("kind", ["async", "blocking"])
def test_a_failing_batch_gives_each_of_its_records_a_dead_letter_after_its_retries(ray_session, kind):
    def check(values):
        if any(v["user"] % 100 == 0 for v in values):
            raise ConnectionError(f"503 for the batch from {values[0]['user']}")
        return [[v] for v in values]

    async def async_check(values):
        return check(values)

    n = 1_000
    result = (
        from_arrow(_users(n), parallelism=2, job_name=f"batch-dlq-{kind}")
        .async_map_batch(async_check if kind == "async" else check, batch_size=10, capacity=3,
                         retry=FixedDelay(2, 1), on_error="dead_letter")
        .execute(progress=False)
    )
    good = result.to_arrow().column("user").to_pylist()
    dead = result.side_outputs[DEAD_LETTER]
    # One dead letter per record of each failing batch (users 0-9, 100-109, ...), none lost.
    assert sorted(d.value["user"] for d in dead) == [u for u in range(n) if u % 100 < 10]
    assert sorted(good + [d.value["user"] for d in dead]) == list(range(n))
    assert all(d.attempts == 2 and d.error_type == "ConnectionError" for d in dead)


def test_a_blocking_batch_with_the_wrong_number_of_results_dead_letters_each_of_its_records(ray_session):
    def short(values):
        return [[v] for v in values][: 1 if values[0]["user"] == 20 else None]  # one batch loses rows

    result = (
        from_arrow(_users(100, parts=1), parallelism=1, job_name="batch-wrong-shape")
        .async_map_batch(short, batch_size=10, capacity=2, on_error="dead_letter")
        .execute(progress=False)
    )
    assert result.to_arrow().column("user").to_pylist() == [u for u in range(100) if not 20 <= u < 30]
    dead = result.side_outputs[DEAD_LETTER]
    assert [d.value["user"] for d in dead] == list(range(20, 30))
    assert all(d.error_type == "ResultTypeError" and "returned 1 result lists for a batch of 10" in d.error for d in dead)

class Scores(AsyncBatchFunction):
    """An ``AsyncBatchFunction`` completing from a coroutine it starts on the actor's loop."""

    def open(self, context):
        self.loop = asyncio.get_running_loop()

    def async_invoke_batch(self, values, result_future):
        async def later():
            await asyncio.sleep(0.002)
            result_future.complete([[{**v, "score": v["user"] % 3}] for v in values])

        self.loop.create_task(later())


def test_an_async_batch_function_object_is_accepted(ray_session):
    rows = (
        from_arrow(_users(500), parallelism=2, job_name="batch-object")
        .async_map_batch(Scores(), batch_size=32, capacity=2)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [(r["user"], r["score"]) for r in rows] == [(u, u % 3) for u in range(500)]


def _double(table):
    return pa.table({"double": pc.multiply(table["user"], 2), "pid": [os.getpid()] * table.num_rows})


async def _async_double(table):
    await asyncio.sleep(0.001)
    return _double(table)


@pytest.mark.parametrize("fn", [_double, _async_double], ids=["blocking", "async"])
def test_an_arrow_batch_function_gets_a_table_and_its_columns_are_merged(ray_session, fn):
    rows = (
        from_arrow(_users(1_000), parallelism=2, job_name=f"batch-arrow-{fn.__name__.strip('_')}")
        .map(lambda row: {**row, "actor_pid": os.getpid()})
        .async_map_batch(arrow_batch(fn), batch_size=100, batch_timeout_ms=10, capacity=2)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [(r["user"], r["double"]) for r in rows] == [(u, 2 * u) for u in range(1_000)]
    in_task = not {r["pid"] for r in rows} & {r["actor_pid"] for r in rows}
    assert in_task == (fn is _double)  # a blocking model runs in Ray tasks, a coroutine on the actor


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be an int > 0, got 0"),
        ({"batch_size": 1.5}, "batch_size must be an int > 0, got 1.5"),
        ({"batch_size": 8, "batch_timeout_ms": -1}, "batch_timeout_ms must be an int > 0 or None, got -1"),
        ({"batch_size": 8, "capacity": 0}, "capacity (batches in flight) must be > 0, got 0"),
        ({"batch_size": 8, "timeout_ms": 0}, "timeout_ms must be an int > 0 or None, got 0"),
        ({"batch_size": 8, "fallback": "none"}, "fallback must be callable, got str"),
        ({"batch_size": 8, "on_error": "skip"}, "on_error must be 'fail' or 'dead_letter', got 'skip'"),
        ({"batch_size": 8, "queue_capacity": 4}, "queue_capacity must be an int >= batch_size (8), got 4"),
    ],
)
def test_bad_configuration_is_rejected_when_the_stream_is_built(kwargs, message):
    async def lookup(values):
        return [[v] for v in values]

    with pytest.raises(ConfigurationError) as info:
        from_arrow([pa.table({"user": [1]})]).async_map_batch(lookup, **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "fn, message",
    [
        (42, "needs an async def f(values), a blocking def f(values), an AsyncBatchFunction or arrow_batch(f); got int"),
        (Scores, "got the class Scores; expected Scores()"),  # the class, not an instance
    ],
)
def test_what_is_not_a_batch_function_is_rejected_when_the_stream_is_built(fn, message):
    with pytest.raises(ConfigurationError) as info:
        from_arrow([pa.table({"user": [1]})]).async_map_batch(fn, batch_size=8)
    assert message in str(info.value)


@pytest.mark.parametrize("method", ["async_map", "async_map_batch"])
def test_a_bad_copy_inputs_is_rejected_when_the_stream_is_built(method):
    async def echo(value):
        return [value]

    options = {"batch_size": 8} if method == "async_map_batch" else {}
    with pytest.raises(ConfigurationError, match=r"copy_inputs must be True, False or 'shallow', got 'deep'"):
        getattr(from_arrow([pa.table({"user": [1]})]), method)(echo, copy_inputs="deep", **options)


@pytest.mark.parametrize("copy_inputs, seen_by_retry", [(True, 1), (False, 1001)])
def test_async_map_copy_inputs_decides_whether_a_retry_sees_what_the_first_attempt_changed(
    ray_session, copy_inputs, seen_by_retry
):
    calls = []

    async def careless(row):
        seen = row["user"]
        row["user"] += 1000  # changes its argument
        calls.append(seen)
        if len(calls) == 1:
            raise ConnectionError("503")  # the first attempt fails after the change
        return [{"user": 1, "seen": seen}]

    rows = (
        from_arrow([pa.table({"user": [1]})], job_name=f"copy-{str(copy_inputs).lower()}")
        .async_map(careless, retry=FixedDelay(2, 1), copy_inputs=copy_inputs)
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert rows == [{"user": 1, "seen": seen_by_retry}]
