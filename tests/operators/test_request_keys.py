"""Idempotency keys of async requests: made from the origin, or from the count of records taken in.

A key is the same on every attempt of its record and after a restore; one made from an origin
does not depend on timing.
"""

from __future__ import annotations

import asyncio
import doctest
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorflow.operators import (
    DEAD_LETTER,
    AsyncBatchFunction,
    AsyncFunction,
    FixedDelay,
    OperatorHarness,
    ResultFuture,
    async_wait,
    async_wait_batch,
    current_request_key,
    current_request_keys,
    request_keys,
)
from actorflow.operators.async_attempt import DeadLetter
from actorflow.operators.errors import RecordError

from .scripted import Scripted, ScriptedBatch
from tests.properties import examples


def keys_in(snapshot: bytes) -> list[str]:
    """The keys of the records in the snapshot of a one-operator harness."""
    return [item[-1] for item in pickle.loads(snapshot).chain[0]["items"] if item[0] == "record"]


def test_docstring_examples():
    result = doctest.testmod(request_keys)
    assert result.attempted > 0 and result.failed == 0


def test_a_key_is_the_prefix_and_the_origin_or_the_count_of_records_taken_in():
    h = OperatorHarness(async_wait(Scripted(), capacity=10), request_key_prefix="clicks/enrich")
    h.process_element("a", origin=(0, 3, 17))
    h.process_element("b")  # the second record taken in
    h.process_element("c", origin=("part-1", 0))
    h.process_element("d")
    assert keys_in(h.snapshot()) == ["clicks/enrich/0.3.17", "clicks/enrich/#1", "clicks/enrich/part-1.0", "clicks/enrich/#3"]


def test_without_a_prefix_the_key_starts_with_the_operator_name_in_its_context():
    h = OperatorHarness(async_wait(Scripted(), capacity=10), name="job/lookup[1/4]")
    h.process_element("a", origin=(5,))
    assert keys_in(h.snapshot()) == ["job/lookup[1/4]/5"]


def test_the_async_operators_of_one_chain_have_keys_of_their_own():
    h = OperatorHarness([async_wait(Scripted(), capacity=10), async_wait(Scripted(), capacity=10)],
                        request_key_prefix="job/enrich")
    h.process_element("a", origin=(1,))
    first, second = pickle.loads(h.snapshot()).chain
    assert [item[-1] for item in first["items"]] == ["job/enrich#0/1"]
    assert second["items"] == []  # nothing has reached it yet


def test_the_count_of_records_taken_in_is_restored_from_the_snapshot():
    def make():
        return async_wait(Scripted(), capacity=10)

    h1 = OperatorHarness(make(), request_key_prefix="p")
    for v in "abc":
        h1.process_element(v)
    snap = h1.snapshot()
    assert pickle.loads(snap).chain[0]["sequence"] == 3

    h2 = OperatorHarness(make(), request_key_prefix="p")
    h2.restore(snap)
    h2.process_element("d")
    assert keys_in(h2.snapshot()) == ["p/#0", "p/#1", "p/#2", "p/#3"]


def test_batched_records_have_keys_of_their_own_and_keep_them_through_a_restore():
    fn = ScriptedBatch()

    def make():
        return async_wait_batch(fn, batch_size=2, capacity=1)

    h1 = OperatorHarness(make(), request_key_prefix="p")
    for i, v in enumerate("abcde"):
        h1.process_element(v, origin=(i,) if v != "c" else None)
    snap = h1.snapshot()
    state = pickle.loads(snap).chain[0]
    assert [item[5] for item in state["items"]] == ["p/0", "p/1", "p/#2", "p/3", "p/4"]
    assert state["sequence"] == 5

    fn = ScriptedBatch()
    h2 = OperatorHarness(make(), request_key_prefix="p")
    h2.restore(snap)
    h2.process_element("f")
    fn.complete(0)  # a and b leave: room for f
    h2.run_until_idle()
    assert h2.output_values() == ["a", "b"]
    assert [item[5] for item in pickle.loads(h2.snapshot()).chain[0]["items"]] == ["p/#2", "p/3", "p/4", "p/#5"]


def test_records_of_a_snapshot_without_keys_get_them_at_the_restore():
    # A bare list of six-field items: the format from before records had an origin and a key.
    old = pickle.dumps([[("record", "a", 1, 1, None, None), ("watermark", 1), ("record", "b", 2, 1, None, None)]])
    h = OperatorHarness(async_wait(Scripted(), capacity=10), request_key_prefix="p")
    h.restore(old)
    h.process_element("c")
    assert keys_in(h.snapshot()) == ["p/#0", "p/#1", "p/#2"]


# ------------------------------------------------------------------------ reading the key


class Keyed(Scripted):
    """A scripted function that notes, per request, the key of its future and of the context."""

    def __init__(self, fallback: Any = None) -> None:
        super().__init__(fallback)
        self.keys: list[tuple[str, Any, str | None, str | None]] = []  # (call, value, future's, context's)

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        self.keys.append(("invoke", value, result_future.idempotency_key, current_request_key()))
        super().async_invoke(value, result_future)

    def timeout(self, value: Any, result_future: ResultFuture) -> None:
        self.keys.append(("timeout", value, result_future.idempotency_key, current_request_key()))
        super().timeout(value, result_future)


def test_an_async_function_reads_the_key_from_its_future_and_from_the_context():
    class Lookup(AsyncFunction):
        def async_invoke(self, value, result_future):
            result_future.complete([(value, result_future.idempotency_key, current_request_key())])

    h = OperatorHarness(async_wait(Lookup()), request_key_prefix="clicks/enrich")
    h.process_element("u1", origin=(0, 7))
    h.process_element("u2")
    assert h.output_values() == [
        ("u1", "clicks/enrich/0.7", "clicks/enrich/0.7"),
        ("u2", "clicks/enrich/#1", "clicks/enrich/#1"),
    ]
    assert current_request_key() is None and current_request_keys() is None  # outside a request


class AwaitsInvoke(AsyncFunction):
    """PyFlink's shape: ``async def async_invoke(self, value) -> list``."""

    def __init__(self, gates: dict[str, asyncio.Event]) -> None:
        self.gates = gates

    async def async_invoke(self, value):
        before = current_request_key()
        await self.gates.setdefault(value, asyncio.Event()).wait()
        return [(value, before, current_request_key())]


class AwaitsInvokeWithFuture(AwaitsInvoke):
    async def async_invoke(self, value, result_future):  # type: ignore[override]
        result_future.complete(await super().async_invoke(value))


@pytest.mark.parametrize("shape", ["async def", "async def async_invoke(value)", "async def async_invoke(value, rf)"])
def test_a_coroutine_keeps_its_own_key_while_other_requests_run_between_its_steps(shape):
    gates: dict[str, asyncio.Event] = {}

    async def lookup(value):
        return await AwaitsInvoke(gates).async_invoke(value)

    fn = {
        "async def": lookup,
        "async def async_invoke(value)": AwaitsInvoke(gates),
        "async def async_invoke(value, rf)": AwaitsInvokeWithFuture(gates),
    }[shape]
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=3), request_key_prefix="p")
    h.process_element("a", origin=(1,))
    h.process_element("b", origin=(2,))
    h.process_element("c")
    for value in "bca":  # each resumes after the others started
        gates[value].set()
        h.run_until_idle()
    assert h.output_values() == [("b", "p/2", "p/2"), ("c", "p/#2", "p/#2"), ("a", "p/1", "p/1")]
    assert current_request_key() is None


def test_the_tasks_a_coroutine_starts_see_its_key_and_none_leaks_into_the_next_request():
    async def part(name):
        await asyncio.sleep(0)
        return name, current_request_key()

    async def lookup(value):
        parts = await asyncio.gather(part("left"), part("right"))
        return [(value, current_request_key(), parts)]

    h = OperatorHarness(async_wait(lookup, capacity=2), request_key_prefix="p")
    h.process_element("a", origin=(1,))
    h.process_element("b", origin=(2,))
    h.run_until_idle()
    assert h.output_values() == [
        ("a", "p/1", [("left", "p/1"), ("right", "p/1")]),
        ("b", "p/2", [("left", "p/2"), ("right", "p/2")]),
    ]
    assert current_request_key() is None


def test_an_async_def_timeout_reads_the_key_of_the_record_it_answers_for():
    class Hangs(AsyncFunction):
        async def async_invoke(self, value):
            await asyncio.Event().wait()

        async def timeout(self, value):
            return [("fallback", value, current_request_key())]

    h = OperatorHarness(async_wait(Hangs(), timeout_ms=100), request_key_prefix="p")
    h.process_element("a", origin=("s", 3))
    h.set_processing_time(100)
    h.run_until_idle()
    assert h.output_values() == [("fallback", "a", "p/s.3")]


def test_every_attempt_and_the_timeout_of_a_record_present_the_same_key():
    fn = Keyed(fallback=lambda v: f"{v}-fallback")
    h = OperatorHarness(async_wait(fn, timeout_ms=1_000, retry=FixedDelay(3, 100)), request_key_prefix="p")
    h.process_element("a", origin=(4, 2))
    h.process_element("b")
    fn.fail("a", RuntimeError("503"))
    h.set_processing_time(100)  # attempt 2 of "a"
    fn.fail("a", RuntimeError("503"))
    h.set_processing_time(200)  # attempt 3 of "a"
    h.set_processing_time(1_000)  # both time out
    assert sorted(fn.keys) == [
        ("invoke", "a", "p/4.2", "p/4.2"),
        ("invoke", "a", "p/4.2", "p/4.2"),
        ("invoke", "a", "p/4.2", "p/4.2"),
        ("invoke", "b", "p/#1", "p/#1"),
        ("timeout", "a", "p/4.2", "p/4.2"),
        ("timeout", "b", "p/#1", "p/#1"),
    ]
    assert h.output_values() == ["a-fallback", "b-fallback"]


@pytest.mark.parametrize("with_origin", [True, False], ids=["origin", "sequence"])
def test_a_restore_presents_the_keys_the_records_had_in_every_state(with_origin):
    def make():
        return async_wait(fn, capacity=3, retry=FixedDelay(3, 1_000))

    def origin(i):
        return ("part-7", 100 + i) if with_origin else None

    fn = Keyed()
    h1 = OperatorHarness(make(), request_key_prefix="job/enrich")
    h1.process_element("x", origin=origin(0))
    fn.complete("x")  # emitted: taken in before the snapshot, not in it
    for i, value in enumerate("abcde", start=1):
        h1.process_element(value, origin=origin(i))
    fn.fail("b", RuntimeError("503"))  # "b" waits for its retry
    fn.complete("c")  # "c" is complete, but ordered behind "a", still in flight
    h1.run_until_idle()
    # "d" waits for room inside the operator; "e" was not taken in.
    assert h1.output_values() == ["x"] and h1.pending_input == 1
    before = {value: key for _, value, key, _ in fn.keys}
    snap = h1.snapshot()

    fn = Keyed()
    h2 = OperatorHarness(make(), request_key_prefix="job/enrich")
    h2.restore(snap)
    h2.process_element("e", origin=origin(5))  # input after the snapshot comes again
    h2.set_processing_time(1_000)  # the rest of "b"'s backoff
    h2.process_element("f", origin=origin(6))
    while fn.in_flight():
        fn.complete(fn.in_flight()[0])
        h2.run_until_idle()
    assert h2.output_values() == ["a", "b", "c", "d", "e", "f"]
    after = {value: key for _, value, key, _ in fn.keys}
    assert {v: after[v] for v in "abc"} == {v: before[v] for v in "abc"}
    if with_origin:
        assert after == {v: f"job/enrich/part-7.{100 + i}" for i, v in enumerate("abcdef", start=1)}
    else:
        assert after == {v: f"job/enrich/#{i}" for i, v in enumerate("abcdef", start=1)}
    assert all(future_key == context_key for _, _, future_key, context_key in fn.keys)


# ------------------------------------------------------------------------------- batches


def test_a_batch_function_reads_the_keys_of_its_records_from_its_future_and_from_the_context():
    seen: list[tuple[Any, ...]] = []

    class Score(AsyncBatchFunction):
        def async_invoke_batch(self, values, result_future):
            seen.append((result_future.idempotency_keys, current_request_keys(), result_future.idempotency_key,
                         current_request_key()))
            result_future.complete([[v] for v in values])

    h = OperatorHarness(async_wait_batch(Score(), batch_size=3), request_key_prefix="p")
    h.process_element("a", origin=(0,))
    h.process_element("b")
    h.process_element("c", origin=(2,))
    # One key per record, in order; a batch has no single key.
    assert seen == [(["p/0", "p/#1", "p/2"], ["p/0", "p/#1", "p/2"], None, None)]
    assert current_request_keys() is None


def test_an_async_def_batch_function_reads_the_keys_of_its_batch_across_awaits():
    gates: list[asyncio.Event] = []

    async def score(values):
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        return [[(v, k)] for v, k in zip(values, current_request_keys())]

    h = OperatorHarness(async_wait_batch(score, batch_size=2, capacity=2, mode="unordered"), request_key_prefix="p")
    for i, value in enumerate("abcd"):
        h.process_element(value, origin=(i,))
    gates[1].set()
    h.run_until_idle()
    gates[0].set()
    h.run_until_idle()
    assert h.output_values() == [("c", "p/2"), ("d", "p/3"), ("a", "p/0"), ("b", "p/1")]


def test_a_batch_presents_the_same_keys_on_a_retry_on_its_timeout_and_after_a_restore():
    fn = ScriptedBatch(fallback=lambda v: f"{v}-fallback")
    timeouts: list[list[str] | None] = []
    timeout_batch = fn.timeout_batch

    def noting_timeout(values, result_future):
        timeouts.append(current_request_keys())
        timeout_batch(values, result_future)

    fn.timeout_batch = noting_timeout  # type: ignore[method-assign]

    def make():
        return async_wait_batch(fn, batch_size=2, timeout_ms=1_000, retry=FixedDelay(3, 100))

    h1 = OperatorHarness(make(), request_key_prefix="p")
    h1.process_element("a", origin=(0,))
    h1.process_element("b")
    fn.fail(0, RuntimeError("503"))
    h1.set_processing_time(100)  # attempt 2, in flight at the snapshot
    snap = h1.snapshot()
    h1.set_processing_time(1_000)
    assert [f.idempotency_keys for f in fn.futures] == [["p/0", "p/#1"]] * 2
    assert timeouts == [["p/0", "p/#1"]]

    futures = fn.futures = []
    h2 = OperatorHarness(make(), request_key_prefix="p")
    h2.restore(snap)
    h2.open()
    assert [f.idempotency_keys for f in futures] == [["p/0", "p/#1"]]


# ------------------------------------------------------------------------------ property


@pytest.mark.parametrize("with_origin", [True, False], ids=["origin", "sequence"])
@settings(max_examples=examples(100), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 8),
    capacity=st.integers(1, 4),
    mode=st.sampled_from(["ordered", "unordered"]),
    data=st.data(),
)
def test_a_record_presents_one_key_whatever_the_completions_retries_and_restores(with_origin, n, capacity, mode, data):
    """Every attempt of every record, in any interleaving of completions, failures, retries and
    snapshot -> restore, presents the key an uninterrupted run gives it: from its origin (which
    has nothing to do with the order of arrival), or from its position in the input."""
    origins = data.draw(st.permutations(range(n)), label="origins")
    expected = {v: f"j/op/s.{origins[v]}" if with_origin else f"j/op/#{v}" for v in range(n)}

    def make() -> OperatorHarness:
        op = async_wait(fn, mode=mode, capacity=capacity, retry=FixedDelay(3, 10), on_error="dead_letter")
        return OperatorHarness(op, request_key_prefix="j/op")

    def offer(v: int) -> None:
        h.process_element(v, timestamp_ms=v, origin=("s", origins[v]) if with_origin else None)

    fn = Keyed()
    h = make()
    keys: list[tuple[Any, ...]] = []
    fed = 0
    for _ in range(data.draw(st.integers(0, 30), label="steps")):
        step = data.draw(st.sampled_from(["feed", "feed", "complete", "fail", "tick", "restore"]), label="step")
        if step == "feed" and fed < n:
            offer(fed)
            fed += 1
        elif step in ("complete", "fail") and fn.in_flight():
            value = data.draw(st.sampled_from(fn.in_flight()), label=step)
            if step == "complete":
                fn.complete(value)
            else:
                fn.fail(value, RuntimeError("503"))
            h.run_until_idle()
        elif step == "tick":
            h.set_processing_time(h.clock.now_ms() + 10)
        elif step == "restore":
            backlog = h.pending_input  # offered but not taken in: it comes again after the restore
            snap = h.snapshot()
            h.close()
            keys += fn.keys
            fn = Keyed()
            h = make()
            h.restore(snap)
            h.open()
            for v in range(fed - backlog, fed):
                offer(v)
    while fed < n or fn.in_flight() or not h.is_finished:
        if fed < n:
            offer(fed)
            fed += 1
        elif fed == n:
            h.end_input()
            fed += 1
        for value in fn.in_flight():
            fn.complete(value)
        h.set_processing_time(h.clock.now_ms() + 10)
    keys += fn.keys
    assert sorted({(value, future_key) for _, value, future_key, _ in keys}) == sorted(expected.items())
    assert all(future_key == context_key for _, _, future_key, context_key in keys)
    h.close()


def test_a_key_given_by_a_column_is_the_key_of_every_request_of_its_record():
    seen = []

    async def lookup(row):
        seen.append(current_request_key())
        return [row["id"]]

    h = OperatorHarness(async_wait(lookup, capacity=10, idempotency_key="key"), request_key_prefix="clicks/enrich")
    h.process_element({"id": 1, "key": "first-run/0.0.4"}, origin=(0, 0, 0))
    h.process_element({"id": 2, "key": "first-run/0.1.9"}, origin=(0, 0, 1))
    h.run_until_idle()
    assert h.output_values() == [1, 2]
    assert seen == ["first-run/0.0.4", "first-run/0.1.9"]  # not the keys made from their origins


@pytest.mark.parametrize("key", [None, "", 7])
def test_a_given_key_that_is_not_a_string_fails_naming_the_record(key):
    h = OperatorHarness(async_wait(Scripted(), capacity=10, idempotency_key="key"))
    with pytest.raises(RecordError, match=rf"idempotency key must be a string that is not empty, got {key!r}"):
        h.process_element({"id": 1, "key": key})


def test_a_dead_letter_keeps_the_key_of_its_requests():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=10, on_error="dead_letter"), request_key_prefix="clicks/enrich")
    h.process_element("a", origin=(0, 2, 5))
    fn.fail("a", ConnectionError("refused"))
    h.run_until_idle()
    [letter] = h.side_output(DEAD_LETTER)
    assert (letter.value, letter.request_key, letter.error_type) == ("a", "clicks/enrich/0.2.5", "ConnectionError")
    assert DeadLetter.from_state(letter.to_state()) == letter
