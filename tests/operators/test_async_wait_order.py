"""Async I/O: ordered and unordered output, watermarks, capacity."""

from __future__ import annotations

import datetime
import decimal
import pickle
import threading
from typing import Any

import pytest

from actorflow.operators import (
    DEAD_LETTER,
    AsyncBatchFunction,
    AsyncFunction,
    ConfigurationError,
    FixedDelay,
    MapOperator,
    OperatorHarness,
    Record,
    RecordError,
    ResultFuture,
    Watermark,
    async_wait,
    async_wait_batch,
)

from actorflow.operators.async_attempt import copy_input

from .scripted import Immediate, Scripted


def test_ordered_output_follows_input_order_whatever_the_completion_order():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=10))
    for v, ts in [("a", 1), ("b", 2), ("c", 3)]:
        h.process_element(v, timestamp_ms=ts)
    fn.complete("c")
    fn.complete("b")
    assert h.output == []  # "a" still blocks the head
    fn.complete("a")
    h.run_until_idle()
    assert h.output == [Record("a", 1), Record("b", 2), Record("c", 3)]


def test_ordered_watermark_waits_for_the_records_before_it():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=10))
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    h.process_watermark(2)
    h.process_element(3, timestamp_ms=3)
    fn.complete(3, [6])
    fn.complete(2, [4])
    h.run_until_idle()
    assert h.output == []
    fn.complete(1, [2])
    h.run_until_idle()
    assert h.output == [Record(2, 1), Record(4, 2), Watermark(2), Record(6, 3)]


def test_unordered_output_follows_completion_order_within_a_segment():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=10))
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    fn.complete("b")
    h.run_until_idle()
    assert h.output == [Record("b", 2)]
    fn.complete("a")
    h.run_until_idle()
    assert h.output == [Record("b", 2), Record("a", 1)]


def test_unordered_record_never_overtakes_a_watermark_and_vice_versa():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=10))
    h.process_element("a", timestamp_ms=1)
    h.process_watermark(5)
    h.process_element("b", timestamp_ms=6)
    fn.complete("b")  # "b" is done, but the watermark and "a" are ahead of it
    h.run_until_idle()
    assert h.output == []
    fn.complete("a")
    h.run_until_idle()
    assert h.output == [Record("a", 1), Watermark(5), Record("b", 6)]


def test_watermark_on_an_empty_queue_is_emitted_at_once():
    h = OperatorHarness(async_wait(Scripted(), mode="unordered", capacity=1))
    h.process_watermark(7)
    assert h.output == [Watermark(7)]


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_watermarks_count_against_capacity(mode):
    fn = Scripted()
    op = async_wait(fn, mode=mode, capacity=2)
    h = OperatorHarness(op)
    h.process_element("a", timestamp_ms=1)
    h.process_watermark(1)  # takes the second slot: the queue is now full
    h.process_element("b", timestamp_ms=2)
    assert fn.calls == [("a", 1)]  # "b" waits for room, no request yet
    assert op.in_flight == 2 and op.is_blocked()
    fn.complete("a")
    h.run_until_idle()
    assert fn.calls == [("a", 1), ("b", 1)]
    assert h.output == [Record("a", 1), Watermark(1)]


def test_full_queue_suspends_input_instead_of_blocking_the_mailbox():
    fn = Scripted()
    op = async_wait(fn, mode="ordered", capacity=2)
    h = OperatorHarness(op)
    for v in "abcde":
        h.process_element(v, timestamp_ms=0)
    # Two requests in flight; "c" waits inside the operator, "d" and "e" stay in the input.
    assert [v for v, _ in fn.calls] == ["a", "b"]
    assert h.pending_input == 2
    assert not h.processor.is_default_action_available
    # The mailbox still runs: a completion gets through and lets input flow again.
    fn.complete("a")
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == ["a", "b", "c"]
    fn.complete("b"); fn.complete("c")
    h.run_until_idle()
    fn.complete("d"); fn.complete("e")
    h.run_until_idle()
    assert h.output_values() == list("abcde")


def test_in_flight_requests_never_exceed_capacity():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=3))
    for i in range(20):
        h.process_element(i, timestamp_ms=i)
    peak = 0
    while fn.in_flight():
        peak = max(peak, len(fn.in_flight()))
        fn.complete(fn.in_flight()[-1])
        h.run_until_idle()
    assert peak == 3
    assert sorted(h.output_values()) == list(range(20))


def test_output_keeps_the_input_timestamp_for_every_result():
    h = OperatorHarness(async_wait(Immediate(lambda v: [v, v * 10]), capacity=4))
    h.process_element(3, timestamp_ms=42)
    h.process_element(4, timestamp_ms=None)
    assert h.output == [Record(3, 42), Record(30, 42), Record(4, None), Record(40, None)]


def test_an_empty_result_emits_nothing_but_frees_the_slot():
    fn = Scripted()
    op = async_wait(fn, capacity=1)
    h = OperatorHarness(op)
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    fn.complete("a", [])
    h.run_until_idle()
    fn.complete("b")
    h.run_until_idle()
    assert h.output == [Record("b", 2)]


class Mutating(AsyncFunction):
    """Changes its argument, as a careless enrichment function does (``row["x"] = ...``)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.futures: list[ResultFuture] = []

    def async_invoke(self, value, result_future):
        self.seen.append(value if isinstance(value, str) else dict(value))
        if isinstance(value, dict):
            value["user"] += 1000
        self.futures.append(result_future)


def test_each_attempt_gets_its_own_copy_of_the_input():
    fn = Mutating()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(3, 10)))
    h.process_element({"user": 1}, timestamp_ms=1)
    # The first attempt changed its argument; neither the snapshot nor the retry sees it.
    assert pickle.loads(h.snapshot()).chain[0]["items"][0][1] == {"user": 1}
    fn.futures[0].complete_exceptionally(ConnectionError("503"))
    h.set_processing_time(10)
    fn.futures[1].complete_exceptionally(ConnectionError("503"))
    h.set_processing_time(20)
    assert fn.seen == [{"user": 1}] * 3
    fn.futures[2].complete(["ok"])
    h.run_until_idle()
    assert h.output == [Record("ok", 1)]


@pytest.mark.parametrize("make", [
    lambda fn, **kw: async_wait(fn, **kw),
    lambda fn, **kw: async_wait_batch(_OneByOne(fn), batch_size=1, **kw),
], ids=["async_wait", "async_wait_batch"])
def test_a_shallow_copy_gives_each_attempt_its_own_row_and_shares_what_is_nested(make):
    fn = Mutating()
    h = OperatorHarness(make(fn, capacity=2, retry=FixedDelay(2, 10), copy_inputs="shallow"))
    tags = ["a"]
    h.process_element({"user": 1, "tags": tags}, timestamp_ms=1)
    assert fn.seen[0] == {"user": 1, "tags": ["a"]}
    assert pickle.loads(h.snapshot()).chain[0]["items"][0][1] == {"user": 1, "tags": ["a"]}
    fn.seen[0]["tags"].append("b")  # a nested value is the record's own: "shallow" is for scalars
    fn.futures[0].complete_exceptionally(ConnectionError("503"))
    h.set_processing_time(10)
    assert fn.seen[1] == {"user": 1, "tags": ["a", "b"]} and tags == ["a", "b"]
    fn.futures[1].complete(["ok"])
    h.run_until_idle()
    assert h.output == [Record("ok", 1)]


class _OneByOne(AsyncBatchFunction):
    """A batch function of one value at a time, over an ``AsyncFunction``."""

    def __init__(self, fn):
        self.fn = fn

    def async_invoke_batch(self, values, result_future):
        [value] = values

        class One:
            def complete(self, results):
                result_future.complete([results])

            def complete_exceptionally(self, error):
                result_future.complete_exceptionally(error)

        self.fn.async_invoke(value, One())


@pytest.mark.parametrize("copy_inputs", ["deep", 1, None])
def test_copy_inputs_is_true_false_or_shallow(copy_inputs):
    with pytest.raises(ConfigurationError) as info:
        async_wait(Scripted(), copy_inputs=copy_inputs)
    assert str(info.value) == f"copy_inputs must be True, False or 'shallow', got {copy_inputs!r}"


def test_an_immutable_input_is_not_copied():
    fn = Mutating()
    value = "".join(["a", "b"])  # a str built at run time, not an interned constant
    h = OperatorHarness(async_wait(fn, capacity=2))
    h.process_element(value, timestamp_ms=1)
    assert fn.seen[0] is value


@pytest.mark.parametrize("on_error", ["fail", "dead_letter"])
def test_an_input_that_cannot_be_copied_is_a_record_error_naming_operator_and_record(on_error):
    fn = Mutating()
    h = OperatorHarness(
        async_wait(fn, capacity=2, on_error=on_error, retry=FixedDelay(3, 10)), name="job/enrich[0/1]"
    )
    if on_error == "fail":
        with pytest.raises(RecordError) as info:
            h.process_element(threading.Lock(), timestamp_ms=7)
        message = str(info.value)
    else:
        h.process_element(threading.Lock(), timestamp_ms=7)
        [letter] = h.side_outputs[DEAD_LETTER]
        assert letter.attempts == 1  # not retried: every attempt would fail the same way
        message = letter.error
    assert "job/enrich[0/1]" in message and "lock" in message and "timestamp_ms=7" in message
    assert "cannot be copied" in message
    assert fn.seen == []  # the user's function never saw it


def test_chain_map_then_async_then_map():
    fn = Scripted()
    h = OperatorHarness([MapOperator(lambda v: v + 1), async_wait(fn, capacity=2), MapOperator(lambda v: v * 100)])
    h.process_element(1, timestamp_ms=5)
    h.process_watermark(5)
    fn.complete(2)
    h.run_until_idle()
    assert h.output == [Record(200, 5), Watermark(5)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": 0}, "capacity must be an int > 0 or 'auto', got 0"),
        ({"mode": "sorted"}, "mode must be 'ordered', 'unordered' or 'key_ordered', got 'sorted'"),
        ({"timeout_ms": -5}, "timeout_ms must be an int > 0 or None, got -5"),
        ({"on_error": "ignore"}, "on_error must be 'fail' or 'dead_letter', got 'ignore'"),
        ({"retry": 3}, "retry must be a RetryStrategy, got int"),
    ],
)
def test_bad_configuration_is_rejected_at_construction(kwargs, message):
    with pytest.raises(ConfigurationError) as info:
        async_wait(Scripted(), **kwargs)
    assert str(info.value) == message


def test_a_plain_function_that_is_not_async_is_rejected():
    with pytest.raises(ConfigurationError, match="expected an async def function"):
        async_wait(lambda v: [v])


def test_a_larger_queue_lets_requests_behind_a_slow_head_start_while_results_wait_their_turn():
    fn = Scripted()
    op = async_wait(fn, mode="ordered", capacity=2, queue_capacity=4)
    h = OperatorHarness(op)
    for v in "abcdef":
        h.process_element(v, timestamp_ms=0)
    assert [v for v, _ in fn.calls] == ["a", "b"]  # two requests at most
    fn.complete("b")
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == ["a", "b", "c"]  # "b" waits in the queue, "c" starts
    fn.complete("c")
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == ["a", "b", "c", "d"]
    fn.complete("d")
    h.run_until_idle()
    # Four queue slots: "a" in flight, "b", "c", "d" done; "e" waits although a request is free.
    assert [v for v, _ in fn.calls] == ["a", "b", "c", "d"] and op.requests_in_flight == 1
    assert op.is_blocked() and h.output_values() == []
    fn.complete("a")
    h.run_until_idle()
    assert h.output_values() == ["a", "b", "c", "d"]
    assert [v for v, _ in fn.calls] == list("abcdef")
    fn.complete("f"); fn.complete("e")
    h.run_until_idle()
    assert h.output_values() == list("abcdef")


def test_queue_capacity_below_capacity_is_rejected():
    with pytest.raises(ConfigurationError, match=r"queue_capacity must be an int >= capacity \(3\), got 2"):
        async_wait(Scripted(), capacity=3, queue_capacity=2)


@pytest.mark.parametrize(
    "value",
    [
        # a flat row of scalars: copied by dict(), the fast path
        {"id": 1, "ts": datetime.datetime(2024, 1, 1), "price": decimal.Decimal("1.5"), "name": "a", "none": None},
        # a row with a nested list: deep-copied
        {"id": 1, "tags": ["a", "b"]},
        # a row with a nested dict: deep-copied
        {"id": 1, "address": {"city": "Berlin"}},
    ],
)
def test_a_row_copy_shares_nothing_that_the_function_could_change(value):
    copied = copy_input(value, 1)
    assert copied == value and copied is not value
    for key, item in value.items():
        if isinstance(item, (list, dict)):
            assert copied[key] is not item
    copied["id"] = 99
    for item in copied.values():
        if isinstance(item, list):
            item.append("z")
        if isinstance(item, dict):
            item["city"] = "Paris"
    assert value["id"] == 1 and value.get("tags", ["a", "b"]) == ["a", "b"]
    assert value.get("address", {"city": "Berlin"}) == {"city": "Berlin"}
