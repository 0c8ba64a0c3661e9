"""Batched async calls: flushes by size, time, watermark and end of input; order; outcomes per
record; timeouts, retries and fallbacks per batch; snapshots mid-buffer and mid-flight."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from actorflow.operators.elements import MAX_WATERMARK
from actorflow.operators import (
    DEAD_LETTER,
    ConfigurationError,
    FixedDelay,
    OperatorHarness,
    Record,
    ResultFuture,
    ResultTypeError,
    UserFunctionError,
    Watermark,
    async_wait_batch,
    empty_result,
)

from .scripted import ScriptedBatch


class Transient(Exception):
    pass


def feed(h: OperatorHarness, values: str, ts0: int = 0) -> None:
    for i, v in enumerate(values):
        h.process_element(v, timestamp_ms=ts0 + i)


# ------------------------------------------------------------------------------ flushing


def test_a_full_buffer_leaves_as_one_call():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=3))
    feed(h, "ab")
    assert fn.calls == []
    h.process_element("c", timestamp_ms=2)
    assert fn.batches() == [["a", "b", "c"]]
    fn.complete(0)
    h.run_until_idle()
    assert h.output == [Record("a", 0), Record("b", 1), Record("c", 2)]


def test_a_partial_buffer_leaves_batch_timeout_ms_after_its_first_record():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=10, batch_timeout_ms=50))
    h.set_processing_time(100)
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(120)
    h.process_element("b", timestamp_ms=2)
    h.set_processing_time(149)
    assert fn.calls == []
    h.set_processing_time(150)  # 50 ms after "a", not after "b"
    assert fn.batches() == [["a", "b"]]
    h.set_processing_time(1_000)
    assert len(fn.calls) == 1  # the timer of a flushed buffer does not fire again


def test_end_of_input_flushes_the_buffer_and_drains():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=10))
    feed(h, "ab")
    h.end_input()
    assert fn.batches() == [["a", "b"]] and not h.is_finished
    fn.complete(0)
    h.run_until_idle()
    assert h.output_values() == ["a", "b"] and h.is_finished


def test_ordered_output_keeps_input_order_across_size_time_watermark_and_end_flushes():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, batch_timeout_ms=50, capacity=4))
    feed(h, "ab", ts0=10)  # size
    h.process_element("c", timestamp_ms=20)
    h.set_processing_time(50)  # time
    h.process_element("d", timestamp_ms=30)
    h.process_watermark(30)  # watermark
    h.process_element("e", timestamp_ms=40)
    h.end_input()  # end of input
    assert fn.batches() == [["a", "b"], ["c"], ["d"], ["e"]]
    for i in (3, 1, 2, 0):  # complete in reverse-ish order
        fn.complete(i, [[v.upper()] for v in fn.calls[i][0]])
        h.run_until_idle()
    assert h.output == [
        Record("A", 10), Record("B", 11), Record("C", 20), Record("D", 30), Watermark(30), Record("E", 40),
        Watermark(MAX_WATERMARK),  # the end of input ends event time, after the last record
    ]
    assert h.is_finished


def test_unordered_a_watermark_flushes_the_partial_buffer_and_is_never_crossed():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, mode="unordered", batch_size=5, capacity=4))
    feed(h, "ab")
    h.process_watermark(5)
    assert fn.batches() == [["a", "b"]]  # flushed by the watermark
    feed(h, "cd", ts0=6)
    h.process_watermark(10)
    fn.complete(1)  # "c", "d" complete first, but stay behind watermark 5
    h.run_until_idle()
    assert h.output == []
    fn.complete(0)
    h.run_until_idle()
    assert h.output == [Record("a", 0), Record("b", 1), Watermark(5), Record("c", 6), Record("d", 7), Watermark(10)]


def test_unordered_batches_leave_in_completion_order_within_a_segment():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, mode="unordered", batch_size=2, capacity=4))
    feed(h, "abcd")
    fn.complete(1)
    h.run_until_idle()
    assert h.output_values() == ["c", "d"]
    fn.complete(0)
    h.run_until_idle()
    assert h.output_values() == ["c", "d", "a", "b"]


def test_every_output_keeps_its_own_records_timestamp():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2))
    h.process_element("a", timestamp_ms=7)
    h.process_element("b", timestamp_ms=None)
    fn.complete(0, [["a1", "a2"], []])
    h.run_until_idle()
    assert h.output == [Record("a1", 7), Record("a2", 7)]


def test_at_most_capacity_batches_in_flight_and_a_full_operator_blocks_its_input():
    fn = ScriptedBatch()
    op = async_wait_batch(fn, batch_size=2, capacity=1)
    h = OperatorHarness(op)
    feed(h, "abcdef")
    assert fn.batches() == [["a", "b"]]  # one batch in flight; "c", "d" fill the buffer
    assert op.batches_in_flight == 1 and op.buffered == 2
    assert op.is_blocked() and h.pending_input == 1  # "e" waits in the operator, "f" in the input
    fn.complete(0)
    h.run_until_idle()
    assert fn.batches() == [["a", "b"], ["c", "d"]] and op.buffered == 2  # "e", "f" buffered now
    assert not op.is_blocked() and h.pending_input == 0
    assert h.output_values() == ["a", "b"]


# ---------------------------------------------------------------------- outcomes per record


@pytest.mark.parametrize(
    "results",
    [
        [["a"]],  # one list short
        [["a"], ["b"], ["c"]],  # one list too many
        [["a"], "b"],  # not a list for the second record
    ],
)
def test_a_result_of_the_wrong_shape_is_a_result_type_error_for_every_record(results):
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, on_error="dead_letter"), name="job/score[0/1]")
    feed(h, "ab")
    fn.complete(0, results)
    h.run_until_idle()
    letters = h.side_outputs[DEAD_LETTER]
    assert [d.value for d in letters] == ["a", "b"]
    assert all(d.error_type == "ResultTypeError" and "expected one list" in d.error for d in letters)
    assert h.output == []


def test_a_wrong_shape_fails_the_operator_with_a_result_type_error_naming_the_record():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2), name="job/score[0/1]")
    feed(h, "ab")
    with pytest.raises(ResultTypeError) as info:
        fn.complete(0, [["a"]])
        h.run_until_idle()
    assert "job/score[0/1]" in str(info.value) and "'a'" in str(info.value)
    assert "1 result lists for a batch of 2 records" in str(info.value)


def test_a_failed_batch_gives_each_record_its_own_dead_letter():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=3, on_error="dead_letter"), name="j/op[0/1]")
    feed(h, "abc", ts0=5)
    fn.fail(0, Transient("503"))
    h.run_until_idle()
    letters = h.side_outputs[DEAD_LETTER]
    assert [(d.value, d.timestamp_ms, d.attempts, d.error_type) for d in letters] == [
        ("a", 5, 1, "Transient"), ("b", 6, 1, "Transient"), ("c", 7, 1, "Transient"),
    ]
    assert all("503" in d.error and d.operator == "j/op[0/1]" for d in letters)


def test_a_failed_batch_fails_the_operator_and_later_batches_emit_nothing():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, mode="unordered", batch_size=1, capacity=2))
    feed(h, "ab")
    with pytest.raises(UserFunctionError, match="'a'"):
        fn.fail(0, KeyError("x"))
        h.run_until_idle()
    fn.complete(1)
    h.run_until_idle()
    assert h.output == []


# -------------------------------------------------------------- timeouts, retries, fallbacks


def test_a_failed_batch_is_retried_as_a_whole_with_the_strategys_delay():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, retry=FixedDelay(3, 100)))
    feed(h, "ab")
    fn.fail(0, Transient())
    h.set_processing_time(99)
    assert len(fn.calls) == 1
    h.set_processing_time(100)
    assert fn.calls == [(["a", "b"], 1), (["a", "b"], 2)]
    fn.complete(1)
    h.run_until_idle()
    assert h.output_values() == ["a", "b"]


def test_the_result_predicate_looks_at_each_records_results():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, retry=FixedDelay(2, 10, retry_on_result=empty_result)))
    feed(h, "ab")
    fn.complete(0, [["a"], []])  # "b" got nothing: the batch runs again
    h.set_processing_time(10)
    assert len(fn.calls) == 2
    fn.complete(1, [["a"], []])  # out of attempts: the results stand
    h.run_until_idle()
    assert h.output_values() == ["a"]


def test_one_deadline_spans_the_batchs_attempts_and_the_fallback_answers_per_record():
    fn = ScriptedBatch(fallback=lambda v: f"{v}-fallback")
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, timeout_ms=100, retry=FixedDelay(10, 40)))
    feed(h, "ab", ts0=3)
    fn.fail(0, Transient())
    h.set_processing_time(40)
    fn.fail(1, Transient())
    h.set_processing_time(80)
    assert len(fn.calls) == 3
    h.set_processing_time(100)  # the deadline of the first attempt ends the third
    assert h.output == [Record("a-fallback", 3), Record("b-fallback", 4)]
    assert fn.timeouts == [["a", "b"]]
    h.set_processing_time(1_000)
    assert len(fn.calls) == 3


def test_a_timeout_without_fallback_is_a_dead_letter_per_record():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, timeout_ms=50, on_error="dead_letter"))
    feed(h, "ab")
    h.set_processing_time(50)
    assert [(d.value, d.error_type) for d in h.side_outputs[DEAD_LETTER]] == [
        ("a", "AsyncTimeoutError"), ("b", "AsyncTimeoutError"),
    ]


def test_a_batch_completed_before_its_timeout_mail_runs_wins():
    fn = ScriptedBatch(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait_batch(fn, batch_size=1, timeout_ms=50), auto_run=False)
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.processing_time.advance_to(50)
    fn.complete(0)
    h.run_until_idle()
    assert h.output == [Record("a", 1)] and fn.timeouts == []


def test_the_deadline_starts_when_the_batch_leaves_not_when_a_record_is_buffered():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=5, batch_timeout_ms=30, timeout_ms=50, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(30)  # the batch leaves
    h.set_processing_time(79)
    assert DEAD_LETTER not in h.side_outputs
    h.set_processing_time(80)
    assert [d.error_type for d in h.side_outputs[DEAD_LETTER]] == ["AsyncTimeoutError"]


def test_end_of_input_cuts_no_batch_retry_short():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, retry=FixedDelay(3, 100), on_error="dead_letter"))
    feed(h, "ab")
    fn.fail(0, Transient())
    h.end_input()
    assert len(fn.calls) == 1
    h.set_processing_time(100)
    fn.fail(1, Transient())
    h.set_processing_time(200)
    assert [a for _, a in fn.calls] == [1, 2, 3]
    fn.complete(2)
    h.run_until_idle()
    assert h.output_values() == ["a", "b"] and h.is_finished


# ------------------------------------------------------------------------- function shapes


def test_an_async_def_batch_function_is_awaited():
    async def double(values):
        await asyncio.sleep(0)
        return [[v * 2] for v in values]

    h = OperatorHarness(async_wait_batch(double, batch_size=2))
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    h.run_until_idle()
    assert h.output == [Record(2, 1), Record(4, 2)]


def test_an_object_with_async_invoke_batch_is_accepted():
    class Plain:
        def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
            result_future.complete([[len(values)] for _ in values])

    class Coroutine:
        async def async_invoke_batch(self, values):
            return [[-v] for v in values]

    h = OperatorHarness(async_wait_batch(Plain(), batch_size=2))
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    assert h.output_values() == [2, 2]
    h = OperatorHarness(async_wait_batch(Coroutine(), batch_size=2))
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    h.run_until_idle()
    assert h.output_values() == [-1, -2]


def test_a_raising_async_def_batch_function_fails_each_record():
    async def broken(values):
        raise Transient("down")

    h = OperatorHarness(async_wait_batch(broken, batch_size=2, on_error="dead_letter"))
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    h.run_until_idle()
    assert [d.value for d in h.side_outputs[DEAD_LETTER]] == [1, 2]


def test_each_attempt_of_a_batch_gets_its_own_copies_of_the_inputs():
    seen: list[list[Any]] = []
    futures: list[ResultFuture] = []

    class Mutating:
        def async_invoke_batch(self, values, result_future):
            seen.append([dict(v) for v in values])
            for v in values:
                v["n"] += 100
            futures.append(result_future)

    h = OperatorHarness(async_wait_batch(Mutating(), batch_size=2, retry=FixedDelay(2, 10)))
    h.process_element({"n": 1}, timestamp_ms=1)
    h.process_element({"n": 2}, timestamp_ms=2)
    futures[0].complete_exceptionally(Transient())
    h.set_processing_time(10)
    assert seen == [[{"n": 1}, {"n": 2}]] * 2


def test_requests_in_flight_counts_the_records_of_batches_that_left():
    fn = ScriptedBatch()
    op = async_wait_batch(fn, batch_size=2, capacity=2)
    h = OperatorHarness(op)
    feed(h, "abc")
    assert (op.requests_in_flight, op.buffered) == (2, 1)  # "a", "b" left; "c" waits in the buffer
    fn.complete(0, [["A"], ["B"]])
    h.run_until_idle()
    assert (op.requests_in_flight, op.buffered) == (0, 1)

def test_copy_inputs_false_hands_the_batch_the_records_own_values():
    got: list[Any] = []

    class Keep:
        def async_invoke_batch(self, values, result_future):
            got.extend(values)
            result_future.complete([[v] for v in values])

    row = {"n": 1}
    # object_reuse: the operator keeps the caller's object, not a copy of it.
    h = OperatorHarness(async_wait_batch(Keep(), batch_size=1, copy_inputs=False, object_reuse=True))
    h.process_element(row, timestamp_ms=1)
    h.run_until_idle()
    assert got[0] is row


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be an int > 0, got 0"),
        ({"batch_size": 2, "batch_timeout_ms": 0}, "batch_timeout_ms must be an int > 0 or None, got 0"),
        ({"batch_size": 2, "capacity": 0}, "capacity (batches in flight) must be > 0, got 0"),
        ({"batch_size": 4, "queue_capacity": 3}, "queue_capacity must be an int >= batch_size (4), got 3"),
        ({"batch_size": 2, "mode": "sorted"}, "mode must be 'ordered', 'unordered' or 'key_ordered', got 'sorted'"),
    ],
)
def test_bad_configuration_is_rejected_at_construction(kwargs, message):
    with pytest.raises(ConfigurationError) as info:
        async_wait_batch(ScriptedBatch(), **kwargs)
    assert str(info.value) == message


def test_an_async_generator_batch_function_is_rejected():
    async def streaming(values):
        yield [[v] for v in values]

    with pytest.raises(ConfigurationError, match="async generator"):
        async_wait_batch(streaming, batch_size=2)


# --------------------------------------------------------------------------- snapshots


def run_out(h: OperatorHarness, fn: ScriptedBatch, now: int) -> None:
    """End the input and complete every batch, oldest first, with results of its values."""
    h.end_input()
    for _ in range(100):
        if h.is_finished:
            return
        if fn.in_flight():
            fn.complete(fn.in_flight()[0])
            h.run_until_idle()
        else:
            now += 1_000
            h.set_processing_time(now)
    raise AssertionError("the operator did not drain")


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_snapshot_mid_buffer_and_mid_flight_then_restore_equals_an_uninterrupted_run(mode):
    def make(fn):
        return async_wait_batch(fn, mode=mode, batch_size=3, batch_timeout_ms=100, capacity=2)

    def first_part(h, fn):
        feed(h, "abc")  # batch 0, in flight
        h.process_watermark(2)
        feed(h, "de", ts0=3)  # a partial buffer, its timer due at 100
        h.set_processing_time(40)

    fn_ref = ScriptedBatch()
    ref = OperatorHarness(make(fn_ref))
    first_part(ref, fn_ref)
    ref.process_element("f", timestamp_ms=5)  # fills the buffer: batch 1
    run_out(ref, fn_ref, 40)

    fn1 = ScriptedBatch()
    h1 = OperatorHarness(make(fn1))
    first_part(h1, fn1)
    snapshot = h1.snapshot()
    state = pickle.loads(snapshot).chain[0]
    assert state["flush_remaining_ms"] == 60
    assert [i[1] for i in state["items"] if i[0] == "record"] == ["a", "b", "c", "d", "e"]
    before = list(h1.output)
    h1.close()

    fn2 = ScriptedBatch()
    h2 = OperatorHarness(make(fn2), start_ms=40)
    # The whole snapshot: with the task's, event time had begun (the end fires it, as in ref).
    h2.restore(snapshot)
    h2.open()
    assert fn2.batches() == [["a", "b", "c"]]  # the in-flight batch runs again, as it was
    h2.process_element("f", timestamp_ms=5)
    run_out(h2, fn2, 40)
    assert fn2.batches() == fn_ref.batches()
    assert before + list(h2.output) == list(ref.output)


def test_a_restored_partial_buffer_rearms_its_flush_timer_with_the_time_it_had_left():
    def make(fn):
        return async_wait_batch(fn, batch_size=10, batch_timeout_ms=100)

    fn1 = ScriptedBatch()
    h1 = OperatorHarness(make(fn1))
    h1.process_element("a", timestamp_ms=1)
    h1.set_processing_time(30)
    snapshot = h1.snapshot()

    fn2 = ScriptedBatch()
    h2 = OperatorHarness(make(fn2), start_ms=30)
    h2.restore(snapshot)
    h2.open()
    h2.set_processing_time(99)
    assert fn2.calls == []
    h2.set_processing_time(100)
    assert fn2.batches() == [["a"]]


def test_a_restored_batch_keeps_its_attempt_count_and_remaining_deadline():
    def make(fn):
        return async_wait_batch(fn, batch_size=2, timeout_ms=100, retry=FixedDelay(3, 10), on_error="dead_letter")

    fn1 = ScriptedBatch()
    h1 = OperatorHarness(make(fn1))
    feed(h1, "ab")
    fn1.fail(0, Transient())
    h1.set_processing_time(10)  # second attempt
    h1.set_processing_time(30)
    state = pickle.loads(h1.snapshot()).chain[0]
    assert state["batches"] == [(0, 2, 70)]

    fn2 = ScriptedBatch()
    h2 = OperatorHarness(make(fn2), start_ms=30)
    h2.restore(pickle.dumps([state]))
    h2.open()
    fn2.fail(0, Transient())
    h2.set_processing_time(40)  # the third and last attempt
    fn2.fail(1, Transient())
    h2.run_until_idle()
    assert [d.attempts for d in h2.side_outputs[DEAD_LETTER]] == [3, 3]
