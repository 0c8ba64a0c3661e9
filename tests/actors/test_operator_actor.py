"""The operator actor on a real local Ray: one thread per chain, order, errors, names, tasks."""

from __future__ import annotations

import asyncio
import threading
import time

import pyarrow as pa
import pytest
import ray
from ray.util.state import list_actors

from actorflow.cluster import from_arrow
from tests.waiting import Background, find_actor, poll
from actorflow.operators import (
    DEAD_LETTER,
    AsyncFunction,
    FixedDelay,
    JobFailedError,
    Record,
    StreamOperator,
)

pytestmark = pytest.mark.ray


def _users(n, parts=2):
    table = pa.table({"user": list(range(n)), "ts": list(range(n))})
    step = -(-n // parts)
    return [table.slice(i, step) for i in range(0, n, step)]


class ThreadProbe(StreamOperator):
    """Records the thread of every call into the operator, and any re-entrance."""

    def open(self):
        self.threads = set()
        self.depth = 0
        self.reentered = False
        self.timer_threads = set()

    def _enter(self):
        self.threads.add(threading.get_ident())
        self.depth += 1
        self.reentered |= self.depth > 1

    def process_element(self, record):
        self._enter()
        now = self.context.processing_time.now_ms()
        self.context.processing_time.register_timer(now + 1, self._on_timer)
        self.output.collect(record)
        self.depth -= 1

    def _on_timer(self, ts):
        self._enter()
        self.timer_threads.add(threading.get_ident())
        self.depth -= 1

    def end_input(self):
        self.output.collect(Record({"user": -1, "ts": 0, "threads": len(self.threads | self.timer_threads),
                                    "reentered": self.reentered}, None))


class LoopThreadFunction(AsyncFunction):
    """Completes every request from a coroutine, recording the thread it was invoked on."""

    def open(self, context):
        self.loop = asyncio.get_running_loop()
        self.threads = set()

    def async_invoke(self, value, result_future):
        self.threads.add(threading.get_ident())

        async def later():
            await asyncio.sleep(0.001 * (value["user"] % 7))
            result_future.complete([{**value, "invoke_threads": len(self.threads)}])

        self.loop.create_task(later())


def test_every_mail_timer_and_invoke_runs_on_the_actor_loop_thread(ray_session):
    # Two sources push into one instance concurrently; the mailbox still runs one thing at a time.
    stream = (
        from_arrow(_users(2_000), parallelism=2, job_name="threads")
        .transform("probe", ThreadProbe, parallelism=1)
        .async_map(LoopThreadFunction(), capacity=16)
    )
    rows = stream.execute(progress=False).to_arrow().to_pylist()
    summary = [r for r in rows if r["user"] == -1]
    assert len(rows) == 2_001
    assert summary[0]["threads"] == 1 and summary[0]["reentered"] is False
    assert {r["invoke_threads"] for r in rows} == {1}


def test_ordered_output_equals_input_order_across_two_instances(ray_session):
    async def lookup(row):
        await asyncio.sleep(0.001 * ((row["user"] * 7919) % 13))  # completion order scrambled
        return [{**row, "double": row["user"] * 2}]

    n = 5_000
    out = from_arrow(_users(n), parallelism=2, job_name="ordered").async_map(lookup, capacity=50).execute(progress=False)
    table = out.to_arrow()
    assert table.column("user").to_pylist() == list(range(n))
    assert table.column("double").to_pylist() == [2 * i for i in range(n)]


def test_unordered_emits_every_record_once(ray_session):
    async def lookup(row):
        await asyncio.sleep(0.001 * (row["user"] % 5))
        return [row]

    n = 3_000
    table = (
        from_arrow(_users(n), parallelism=2, job_name="unordered")
        .async_map(lookup, ordered=False, capacity=40)
        .execute(progress=False)
        .to_arrow()
    )
    assert sorted(table.column("user").to_pylist()) == list(range(n))


def test_user_function_that_raises_fails_the_job_naming_operator_record_and_cause(ray_session):
    async def lookup(row):
        if row["user"] == 1234:
            raise KeyError("no segment for user 1234")
        return [row]

    stream = from_arrow(_users(3_000), parallelism=2, job_name="raises").async_map(lookup, capacity=10, name="enrich")
    with pytest.raises(JobFailedError) as info:
        stream.execute(progress=False)
    message = str(info.value)
    assert "raises/enrich[0/2]" in message
    assert "'user': 1234" in message and "KeyError" in message and "no segment for user 1234" in message


def test_failures_go_to_dead_letters_and_nothing_is_lost(ray_session):
    async def lookup(row):
        if row["user"] % 100 == 0:
            raise ConnectionError(f"503 for {row['user']}")
        return [row]

    n = 2_000
    result = (
        from_arrow(_users(n), parallelism=2, job_name="dlq")
        .async_map(lookup, capacity=20, retry=FixedDelay(2, 1), on_error="dead_letter")
        .execute(progress=False)
    )
    good = result.to_arrow().column("user").to_pylist()
    dead = result.side_outputs[DEAD_LETTER]
    assert sorted(good + [d.value["user"] for d in dead]) == list(range(n))
    assert {d.value["user"] for d in dead} == set(range(0, n, 100))
    assert all(d.attempts == 2 and d.error_type == "ConnectionError" for d in dead)


def test_a_hanging_service_hits_the_timeout_and_gets_the_fallback(ray_session):
    async def lookup(row):
        if row["user"] % 50 == 0:
            await asyncio.sleep(3600)  # hangs
        return [{**row, "source": "service"}]

    result = (
        from_arrow(_users(500), parallelism=1, job_name="hangs")
        .async_map(lookup, capacity=20, timeout_ms=300, fallback=lambda row: [{**row, "source": "fallback"}])
        .execute(progress=False)
        .to_arrow()
        .to_pylist()
    )
    assert [r["user"] for r in result] == list(range(500))
    assert {r["user"] for r in result if r["source"] == "fallback"} == set(range(0, 500, 50))


def test_blocking_function_runs_in_micro_batched_ray_tasks(ray_session):
    def lookup(row):
        time.sleep(0.01)
        return [{**row, "pid": __import__("os").getpid()}]

    n = 2_000
    table = (
        from_arrow(_users(n), parallelism=2, job_name="blocking")
        .async_map(lookup, capacity=100)
        .execute(progress=False)
        .to_arrow()
    )
    assert table.column("user").to_pylist() == list(range(n))
    driver = __import__("os").getpid()
    assert driver not in set(table.column("pid").to_pylist())  # ran in Ray workers


def _running_job(stream):
    return Background(lambda: stream.execute(progress=False))



def test_actors_are_named_job_operator_index_parallelism_while_running(ray_session):
    async def slow(row):
        await asyncio.sleep(0.05)
        return [row]

    stream = from_arrow(_users(2_000), parallelism=2, job_name="named").async_map(slow, capacity=4, name="enrich")
    thread = _running_job(stream)
    # The source is chained into the enrich instances (same parallelism), which keep the output.
    expected = {"named/enrich[0/2]", "named/enrich[1/2]"}
    gcs = ray.get_runtime_context().gcs_address
    names = poll(lambda: expected <= (n := {a.name for a in list_actors(address=gcs, filters=[("state", "=", "ALIVE")])}) and n)
    assert expected <= names
    actor = ray.get_actor("named/enrich[0/2]", namespace="actorflow")
    assert repr(actor).startswith("Actor(") and ray.get(actor.stats.remote())["name"] == "named/enrich[0/2]"
    _stop(expected)
    assert thread.failed_with(JobFailedError, "an actor died"), thread.error


@pytest.mark.parametrize("chained", [True, False], ids=["chained-source", "source-actor"])
def test_backpressure_holds_the_source_back_while_a_slow_stage_drains(ray_session, chained):
    async def slow(row):
        await asyncio.sleep(0.01)
        return [row]

    n = 20_000
    table = pa.table({"user": list(range(n))})
    job = f"backpressure-{'chained' if chained else 'actor'}"
    parallelism = 1 if chained else 2
    stream = from_arrow([table], parallelism=1, batch_size=100, job_name=job).async_map(
        slow, capacity=2, parallelism=parallelism)
    thread = _running_job(stream)
    reader_name = f"{job}/async_map[0/1]" if chained else f"{job}/source[0/1]"
    reader = poll(lambda: find_actor(reader_name))
    poll(lambda: ray.get(reader.progress.remote()) > 0)
    time.sleep(2.0)
    sent = ray.get(reader.progress.remote())
    # At 2 requests per 10 ms per instance the stage needs ~50-100 s for everything; the reader
    # may run ahead only by what, per instance, the channel credits (4 batches), the input gate
    # (4) and the batch being taken apart hold, with room to spare: not by the whole input.
    assert sent <= parallelism * 15 * 100, sent
    _stop([reader_name] + [f"{job}/async_map[{i}/{parallelism}]" for i in range(parallelism)])
    assert thread.failed_with(JobFailedError, "an actor died"), thread.error


def test_an_instance_whose_downstream_takes_no_more_counts_its_backpressured_time(ray_session):
    async def slow(row):
        await asyncio.sleep(0.01)
        return [row]

    n = 20_000
    stream = (from_arrow([pa.table({"user": list(range(n)), "ts": list(range(n))})], parallelism=1, batch_size=100,
                         timestamp_column="ts", job_name="backpressured")
              .map(lambda row: row)
              .async_map(slow, capacity=2, parallelism=2))
    thread = _running_job(stream)
    fast = poll(lambda: find_actor("backpressured/map[0/1]"))
    slow_instance = poll(lambda: find_actor("backpressured/async_map[0/2]"))
    poll(lambda: ray.get(fast.stats.remote())["records_in"] > 0)
    time.sleep(2.0)
    fast_figures, slow_figures = ray.get([fast.stats.remote(), slow_instance.stats.remote()])
    assert fast_figures["backpressured_ms"] > 1_000, fast_figures  # most of the 2 s: the slow stage is full
    assert slow_figures["backpressured_ms"] == 0, slow_figures  # nothing holds the last stage back
    # Event time 0 .. n ms in 1970: the watermark trails the wall clock by about now - watermark.
    now_ms = int(time.time() * 1000)
    assert abs(fast_figures["watermark_lag_ms"] - (now_ms - fast_figures["watermark_ms"])) < 10_000, fast_figures
    _stop(["backpressured/source[0/1]", "backpressured/map[0/1]", "backpressured/async_map[0/2]",
           "backpressured/async_map[1/2]"])
    assert thread.failed_with(JobFailedError, "an actor died"), thread.error


def test_a_source_actor_spreads_batches_over_every_instance_of_a_wider_stage(ray_session):
    async def tag(row):
        return [{**row, "pid": __import__("os").getpid()}]

    n = 4_000
    stream = from_arrow(_users(n, parts=1), parallelism=1, batch_size=100, job_name="widen").async_map(
        tag, capacity=10, parallelism=2, ordered=False)
    table = stream.execute(progress=False).to_arrow()
    assert sorted(table.column("user").to_pylist()) == list(range(n))
    assert len(set(table.column("pid").to_pylist())) == 2  # both instances took batches


def _stop(names):
    # Killing one actor fails the job, whose clean-up kills the rest: some may be gone already.
    for name in names:
        actor = find_actor(name)
        if actor is not None:
            ray.kill(actor)



def test_each_instance_reports_the_cpu_of_its_event_loop_and_of_its_process(ray_session):
    # Each record spins the thread it runs on for 20 ms of CPU: the event loop's, for an async def.
    async def spin(row):
        started = time.thread_time()
        while time.thread_time() - started < 0.02:
            pass
        return [row]

    result = from_arrow(_users(30, parts=1), parallelism=1).async_map(spin, capacity=4).execute(progress=False)
    (figures,) = result.figures
    assert figures["event_loop_cpu_ms"] >= 30 * 20, figures
    assert figures["process_cpu_ms"] >= figures["event_loop_cpu_ms"], figures
