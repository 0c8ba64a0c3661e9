"""Async I/O: snapshots hold every element not yet emitted; restore replays them."""

from __future__ import annotations

import asyncio
import pickle

from actorflow.operators import (
    DEAD_LETTER,
    FixedDelay,
    OperatorHarness,
    Record,
    Watermark,
    async_wait,
)
from actorflow.operators.state import STATE_FORMAT_VERSION

from .scripted import Scripted


def restored(make_op, snapshot, *, start_ms=0):
    h = OperatorHarness(make_op(), start_ms=start_ms)
    h.restore(snapshot)
    return h


def test_snapshot_holds_in_flight_completed_unemitted_and_watermarks_in_order():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=5, timeout_ms=1_000))
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    h.process_watermark(2)
    h.process_element("c", timestamp_ms=3)
    fn.complete("b")  # completed, but not emitted: "a" is still ahead of it
    h.set_processing_time(400)
    state = pickle.loads(h.snapshot()).chain[0]
    assert state == {
        "format": "async_wait",
        "version": STATE_FORMAT_VERSION,
        "items": [
            ("record", "a", 1, 1, 600, None, None, "test/operator[0/1]/#0"),
            ("record", "b", 2, 1, 600, None, None, "test/operator[0/1]/#1"),  # its input is kept, and it will run again
            ("watermark", 2),
            ("record", "c", 3, 1, 600, None, None, "test/operator[0/1]/#2"),
        ],
        "sequence": 3,
    }


def test_restore_with_a_full_queue_and_the_waiting_element_does_not_deadlock():
    def make():
        return async_wait(fn, mode="ordered", capacity=2)

    fn = Scripted()
    h1 = OperatorHarness(make())
    for v in "abc":
        h1.process_element(v, timestamp_ms=ord(v))
    # "a" and "b" fill the queue; "c" waits for room inside the operator.
    assert [v for v, _ in fn.calls] == ["a", "b"]
    snap = h1.snapshot()
    assert [item[1] for item in pickle.loads(snap).chain[0]["items"]] == ["a", "b", "c"]

    fn = Scripted()
    h2 = restored(make, snap)
    h2.open()
    assert [v for v, _ in fn.calls] == ["a", "b"]  # replayed up to capacity; "c" waits again
    h2.process_element("d", timestamp_ms=ord("d"))  # new input queues behind "c"
    while fn.in_flight():
        fn.complete(fn.in_flight()[0])
        h2.run_until_idle()
    assert h2.output_values() == list("abcd")
    assert [v for v, _ in fn.calls] == list("abcd")


def test_restore_keeps_the_remaining_deadline_not_a_fresh_one():
    fn = Scripted(fallback=lambda v: "fallback")

    def make():
        return async_wait(fn, capacity=2, timeout_ms=100)

    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1)
    h1.set_processing_time(70)
    snap = h1.snapshot()  # 30 ms left

    h2 = restored(make, snap, start_ms=5_000)
    h2.open()
    h2.set_processing_time(5_029)
    assert h2.output == []
    h2.set_processing_time(5_030)
    assert h2.output == [Record("fallback", 1)]


def test_restore_keeps_the_attempt_count():
    fn = Scripted()

    def make():
        return async_wait(fn, capacity=2, retry=FixedDelay(3, 10), on_error="dead_letter")

    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1)
    fn.fail("a", RuntimeError("503"))
    h1.set_processing_time(10)  # attempt 2 in flight
    snap = h1.snapshot()
    assert pickle.loads(snap).chain[0]["items"] == [("record", "a", 1, 2, None, None, None, "test/operator[0/1]/#0")]

    fn = Scripted()
    h2 = restored(make, snap)
    h2.open()
    fn.fail("a", RuntimeError("503"))  # attempt 2 fails again
    h2.set_processing_time(10)  # attempt 3, the last one
    fn.fail("a", RuntimeError("503"))
    h2.run_until_idle()
    [letter] = h2.side_outputs[DEAD_LETTER]
    assert letter.attempts == 3


def test_snapshot_during_a_retry_wait_restores_as_the_next_attempt():
    fn = Scripted()
    h1 = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(3, 1_000)))
    h1.process_element("a", timestamp_ms=1)
    fn.fail("a", RuntimeError("503"))
    h1.run_until_idle()
    # And the rest of the wait.
    assert pickle.loads(h1.snapshot()).chain[0]["items"] == [("record", "a", 1, 2, None, 1_000, None, "test/operator[0/1]/#0")]


def test_unordered_snapshot_keeps_watermark_segments():
    fn = Scripted()

    def make():
        return async_wait(fn, mode="unordered", capacity=10)

    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1)
    h1.process_watermark(5)
    h1.process_element("b", timestamp_ms=6)
    snap = h1.snapshot()

    fn = Scripted()
    h2 = restored(make, snap)
    h2.open()
    fn.complete("b")
    h2.run_until_idle()
    assert h2.output == []  # "b" still may not overtake the watermark
    fn.complete("a")
    h2.run_until_idle()
    assert h2.output == [Record("a", 1), Watermark(5), Record("b", 6)]


def test_async_def_function_runs_on_the_coroutine_runner_and_timeout_cancels_it():
    release = {}
    cancelled = []

    async def lookup(value):
        release[value] = asyncio.Event()
        try:
            await release[value].wait()
        except asyncio.CancelledError:
            cancelled.append(value)
            raise
        return [f"{value}!"]

    h = OperatorHarness(async_wait(lookup, mode="unordered", capacity=4, timeout_ms=100, on_error="dead_letter"))
    h.process_element("fast", timestamp_ms=1)
    h.process_element("hangs", timestamp_ms=2)
    release["fast"].set()
    h.run_until_idle()
    assert h.output == [Record("fast!", 1)]
    h.set_processing_time(100)
    h.run_until_idle()
    assert cancelled == ["hangs"]
    assert [d.value for d in h.side_outputs[DEAD_LETTER]] == ["hangs"]


def test_a_record_restored_while_waiting_for_a_retry_waits_the_rest_of_its_backoff():
    fn = Scripted()

    def make():
        return async_wait(fn, capacity=2, retry=FixedDelay(3, 1_000))

    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1)
    fn.fail("a", RuntimeError("503"))
    h1.set_processing_time(400)  # 600 ms of the backoff are left
    snap = h1.snapshot()

    fn = Scripted()
    h2 = restored(make, snap, start_ms=9_000)
    h2.open()
    h2.set_processing_time(9_599)
    assert fn.calls == []  # not a fresh attempt at once
    h2.set_processing_time(9_600)
    assert [v for v, _ in fn.calls] == ["a"]
    fn.fail("a", RuntimeError("503"))  # attempt 2 fails: one more, the last
    h2.set_processing_time(10_600)
    fn.complete("a")
    h2.run_until_idle()
    assert h2.output_values() == ["a"] and len(fn.calls) == 2


def test_a_record_restored_past_its_deadline_gets_its_timeout_not_a_fresh_attempt():
    fn = Scripted(fallback=lambda v: "fallback")

    def make():
        return async_wait(fn, capacity=2, timeout_ms=100)

    # A snapshot taken at the deadline, before the timeout's mail ran, holds no time left. (The
    # harness fires due timers at once, so the state is written here as the operator writes it.)
    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1)
    h1.set_processing_time(99)
    snap = pickle.loads(h1.snapshot()).chain
    assert snap[0]["items"] == [("record", "a", 1, 1, 1, None, None, "test/operator[0/1]/#0")]
    # Written in the six-field form of snapshots taken before records had an origin.
    snap_state = pickle.dumps([[("record", "a", 1, 1, 0, None)]] + snap[1:])

    fn = Scripted(fallback=lambda v: "fallback")
    h2 = restored(make, snap_state, start_ms=5_000)
    h2.open()
    h2.run_until_idle()
    assert fn.calls == [] and h2.output == [Record("fallback", 1)]


def test_a_result_that_arrives_after_the_mailbox_closed_is_dropped_quietly_in_its_thread():
    # The task stopped (a failure elsewhere, a restore); the element is in the checkpoint and will
    # be replayed. The service thread that completes it late must see no error.
    import threading

    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=1_000))
    h.process_element("a", timestamp_ms=1)
    h.processor.quiesce()
    errors: list[BaseException] = []

    def late_completion():
        try:
            fn.complete("a")
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    thread = threading.Thread(target=late_completion)
    thread.start()
    thread.join(5)
    assert errors == [] and h.output == []


def test_a_timer_that_fires_after_the_mailbox_closed_is_dropped_quietly():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100))
    h.process_element("a", timestamp_ms=1)
    h.processor.quiesce()
    h.set_processing_time(500)  # the deadline's timer is due, but no mail may enter any more
    assert h.output == []
