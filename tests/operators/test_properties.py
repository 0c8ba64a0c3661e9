"""Property tests of the async I/O operator, through the harness.

1. Ordered output equals input order.
2. Nothing crosses a watermark (unordered mode).
3. Each element has exactly one outcome, whatever the interleaving of completion, failure, retry
   and timeout.
4. Snapshot -> restore -> continue equals an uninterrupted run.

Hypothesis draws the inputs and the schedule (which request completes when, when time moves).
Everything is deterministic: a manual clock, no threads, no sleeps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actorflow.operators.elements import MAX_WATERMARK
from actorflow.operators import (
    DEAD_LETTER,
    FixedDelay,
    OperatorHarness,
    Record,
    Watermark,
    async_wait,
)

from .scripted import Scripted
from tests.properties import examples

PROPERTY = settings(
    max_examples=examples(100),
    deadline=None,
    derandomize=True,  # the same examples on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: An input script: a record (its value is its position) or a watermark.
script_items = st.lists(st.sampled_from(["record", "record", "record", "watermark"]), max_size=10)


def feed_script(items: list[str]) -> list[Record | Watermark]:
    """Records get distinct values and increasing timestamps; watermarks follow them."""
    elements: list[Record | Watermark] = []
    for i, kind in enumerate(items):
        elements.append(Record(i, 10 * i) if kind == "record" else Watermark(10 * i))
    return elements


def offer(h: OperatorHarness, element: Record | Watermark) -> None:
    if isinstance(element, Record):
        h.process_element(element.value, timestamp_ms=element.timestamp_ms)
    else:
        h.process_watermark(element.timestamp_ms)


def ended(elements: list[Any]) -> list[Any]:
    """``elements`` as they leave once the input ends: the end ends event time (a final
    ``Watermark(MAX_WATERMARK)``) where a watermark had come in, as the runtime does."""
    began = any(isinstance(e, Watermark) for e in elements)
    return [*elements, Watermark(MAX_WATERMARK)] if began else list(elements)


def segments(elements: list[Any]) -> tuple[list[Counter], list[Watermark]]:
    """Split a stream at its watermarks: the records of each segment (a multiset), and the
    watermarks in order."""
    segs: list[Counter] = [Counter()]
    marks: list[Watermark] = []
    for e in elements:
        if isinstance(e, Watermark):
            marks.append(e)
            segs.append(Counter())
        else:
            segs[-1][e] += 1
    return segs, marks


def complete_one(fn: Scripted, data: st.DataObject) -> None:
    # The result re-enters through the mailbox: the harness runs it at its next call, before
    # it feeds anything else (the same order as running it at once, and cheaper).
    fn.complete(data.draw(st.sampled_from(fn.in_flight()), label="complete"))


def drive(
    h: OperatorHarness, fn: Scripted, elements: list[Any], data: st.DataObject, check: Any = lambda: None
) -> None:
    """Feed ``elements`` and complete requests, interleaved as hypothesis draws, then end the
    input and complete whatever is left, in a drawn order; ``check()`` runs after every step."""
    fed = 0
    while fed < len(elements) or fn.in_flight():
        if fed < len(elements) and (not fn.in_flight() or data.draw(st.booleans(), label="feed")):
            offer(h, elements[fed])
            fed += 1
        else:
            complete_one(fn, data)
        check()
    h.end_input()
    while fn.in_flight():
        complete_one(fn, data)
        h.run_until_idle()
        check()


# ------------------------------------------------------------------ 1. ordered = input order


@PROPERTY
@given(
    values=st.lists(st.integers(-1000, 1000), unique=True, max_size=10),
    watermark_after=st.sets(st.integers(0, 10), max_size=3),
    capacity=st.integers(1, 5),
    extra_queue=st.sampled_from([0, 0, 1, 4]),
    data=st.data(),
)
def test_ordered_output_equals_input_order(values, watermark_after, capacity, extra_queue, data):
    fn = Scripted()
    queue_capacity = capacity + extra_queue
    op = async_wait(fn, mode="ordered", capacity=capacity, queue_capacity=queue_capacity)
    h = OperatorHarness(op)
    inputs: list[Record | Watermark] = []
    for i, v in enumerate(values):
        inputs.append(Record(v, 100 + 10 * i))
        if i in watermark_after:
            inputs.append(Watermark(100 + 10 * i))  # watermarks count against capacity too

    def within_bounds() -> None:
        h.run_until_idle()  # let completions re-enter first
        assert len(fn.in_flight()) == op.requests_in_flight <= capacity
        assert op.in_flight <= queue_capacity

    drive(h, fn, inputs, data, within_bounds)
    assert h.is_finished
    # Values in input order, each with its own timestamp, watermarks where they came in.
    assert h.output == ended(inputs)
    assert sorted(v for v, _ in fn.calls) == sorted(values)  # one request each
    h.close()


# ------------------------------------------------------------- 2. nothing crosses a watermark


@PROPERTY
@given(items=script_items, capacity=st.integers(1, 5), data=st.data())
def test_unordered_no_record_crosses_a_watermark(items, capacity, data):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=capacity))
    elements = feed_script(items)
    drive(h, fn, elements, data)
    assert h.is_finished

    out = h.output
    assert [e for e in out if isinstance(e, Watermark)] == [e for e in ended(elements) if isinstance(e, Watermark)]
    for w in (e for e in elements if isinstance(e, Watermark)):
        input_before = {e for e in elements[: elements.index(w)] if isinstance(e, Record)}
        emitted_before = {e for e in out[: out.index(w)] if isinstance(e, Record)}
        # every record emitted before W was input before W, and vice versa
        assert emitted_before == input_before, f"records crossed {w}"
    records = Counter(e for e in elements if isinstance(e, Record))
    assert Counter(e for e in out if isinstance(e, Record)) == records  # nothing lost or doubled
    h.close()


# ------------------------------------------------------------------ 3. exactly one outcome


def normalize(value: Any) -> Any:
    """Map every result shape back to the input value it came from."""
    if isinstance(value, tuple) and value[0] in ("fallback", "stale"):
        return value[1]
    return value


@st.composite
def outcome_configs(draw):
    return {
        "mode": draw(st.sampled_from(["ordered", "unordered"])),
        "capacity": draw(st.integers(1, 5)),
        "timeout_ms": draw(st.one_of(st.none(), st.integers(5, 60))),
        "fallback": draw(st.booleans()),
        "retry": draw(
            st.one_of(
                st.none(),
                st.builds(FixedDelay, st.integers(2, 3), st.integers(0, 20)),
            )
        ),
    }


ACTIONS = ["feed", "feed", "complete", "fail", "advance", "race", "stale"]


@PROPERTY
@given(
    n=st.integers(0, 6),
    config=outcome_configs(),
    data=st.data(),
)
def test_each_element_has_exactly_one_outcome(n, config, data):
    fn = Scripted(fallback=(lambda v: ("fallback", v)) if config["fallback"] else None)
    h = OperatorHarness(
        async_wait(
            fn,
            mode=config["mode"],
            capacity=config["capacity"],
            timeout_ms=config["timeout_ms"],
            retry=config["retry"],
            on_error="dead_letter",
        )
    )
    values = list(range(n))
    now = 0
    fed = 0

    def advance(by: int) -> None:
        nonlocal now
        now += by
        h.set_processing_time(now)

    def act(action: str) -> None:
        nonlocal fed
        in_flight = fn.in_flight()
        if action == "feed":
            h.process_element(values[fed], timestamp_ms=fed)
            fed += 1
        elif action == "complete" and in_flight:
            fn.complete(data.draw(st.sampled_from(in_flight), label="complete"))
            h.run_until_idle()
        elif action == "fail" and in_flight:
            fn.fail(data.draw(st.sampled_from(in_flight), label="fail"), ConnectionError("service down"))
            h.run_until_idle()
        elif action == "advance":
            advance(data.draw(st.integers(1, 40), label="advance"))
        elif action == "race" and in_flight:
            # A completion (or failure) and the timers of a time step, both queued before either
            # runs, in a drawn order: the outcome must still be one.
            value = data.draw(st.sampled_from(in_flight), label="race")
            succeed = data.draw(st.booleans(), label="race-succeeds")
            completion_first = data.draw(st.booleans(), label="completion-first")
            by = data.draw(st.integers(1, 60), label="race-advance")
            h.auto_run = False
            try:
                if not completion_first:
                    advance(by)
                if succeed:
                    fn.complete(value)
                else:
                    fn.fail(value, TimeoutError("slow"))
                if completion_first:
                    advance(by)
            finally:
                h.auto_run = True
            h.run_until_idle()
        elif action == "stale" and fn.pending:
            # Complete the first attempt's future again: a no-op unless it is still the live one.
            value = data.draw(st.sampled_from(sorted(fn.pending)), label="stale")
            fn.pending[value][0].complete([("stale", value)])
            h.run_until_idle()

    for _ in range(data.draw(st.integers(0, 20), label="steps")):
        action = data.draw(st.sampled_from(ACTIONS), label="action")
        if action == "feed" and fed >= n:
            action = "advance"
        act(action)
    while fed < n:
        act("feed")
    h.end_input()
    # Keep mixing after the end of input (it cuts no retry short: retries keep their timers),
    # then drive time past every deadline and finish off whatever is still waiting for its
    # service.
    for _ in range(data.draw(st.integers(0, 10), label="tail-steps")):
        act(data.draw(st.sampled_from(["complete", "fail", "advance", "race", "stale"]), label="tail"))
    advance(1_000)
    for _ in range(100):
        if h.is_finished:
            break
        if fn.in_flight():
            act(data.draw(st.sampled_from(["complete", "fail"]), label="finish"))
        else:
            advance(1_000)
    assert h.is_finished, "the operator did not drain"

    outputs = h.output_values()
    dead_letters = h.side_outputs.get(DEAD_LETTER, [])
    emitted = [normalize(v) for v in outputs]
    dead = [d.value for d in dead_letters]
    assert Counter(emitted + dead) == Counter(values), f"emitted={emitted} dead={dead}"
    # The outcome is the one that won the race: once the timeout fired, it decides (a fallback,
    # or a timeout failure); otherwise the outcome is the service's (a result or its failure).
    error_types = {d.value: d.error_type for d in dead_letters}
    for v in values:
        if v in fn.timeouts:
            if config["fallback"]:
                assert ("fallback", v) in outputs, f"{v} timed out but its outcome is not the fallback"
            else:
                assert error_types.get(v) == "AsyncTimeoutError", f"{v} timed out: {error_types.get(v)}"
        else:
            assert ("fallback", v) not in outputs
            assert error_types.get(v) in (None, "ConnectionError", "TimeoutError")
    # Attempts stay within the retry strategy's budget.
    max_attempts = 1 if config["retry"] is None else config["retry"].max_attempts
    assert all(attempt <= max_attempts for _, attempt in fn.calls)
    h.close()


# ---------------------------------------------- 4. snapshot -> restore = uninterrupted run


def results_of(value: int) -> list[Any]:
    """Deterministic results that depend on the value only: one or two outputs."""
    return [value] * (1 + value % 2)


@st.composite
def snapshot_schedules(draw):
    items = draw(st.lists(st.sampled_from(["record", "record", "watermark"]), min_size=3, max_size=10))
    elements = feed_script(items)
    ops: list[tuple[str, int]] = []
    fed_records: list[int] = []
    for i, element in enumerate(elements):
        ops.append(("feed", i))
        if isinstance(element, Record):
            fed_records.append(element.value)
        # Complete up to two of the records fed so far (a no-op if not in flight), the newest
        # or the oldest ones alike, so that some requests stay in flight and some complete
        # behind an incomplete one.
        for _ in range(draw(st.integers(0, 2))):
            if fed_records:
                k = draw(st.integers(0, len(fed_records) - 1))
                ops.append(("complete", fed_records[k] if draw(st.booleans()) else fed_records[-1 - k]))
    # The snapshot point, counted from the end or from the start (hypothesis favours small
    # numbers, and both ends are interesting).
    offset = draw(st.integers(0, len(ops)))
    return {
        "elements": elements,
        "ops": ops,
        "snapshot_at": offset if draw(st.booleans()) else len(ops) - offset,
        "capacity": draw(st.sampled_from([4, 2, 5, 1, 3])),
    }


def apply_op(h: OperatorHarness, fn: Scripted, op: tuple[str, Any], elements: list[Any]) -> None:
    kind, arg = op
    if kind == "feed":
        offer(h, elements[arg])
    elif arg in fn.in_flight():  # "complete": results depend on the value only; the result
        fn.complete(arg, results_of(arg))  # mail runs at the harness's next call


def finish(h: OperatorHarness, fn: Scripted) -> None:
    h.end_input()
    for _ in range(100):
        if not fn.in_flight():
            break
        value = fn.in_flight()[0]
        fn.complete(value, results_of(value))
        h.run_until_idle()
    assert h.is_finished


def same_stream(mode: str, actual: list[Any], expected: list[Any]) -> bool:
    if mode == "ordered":
        return actual == expected
    return segments(actual) == segments(expected)


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
@settings(PROPERTY, max_examples=examples(60))  # three harnesses per example, and two modes
@given(schedule=snapshot_schedules())
# r0 in flight, then W, then r2 completed behind it (unemitted in both modes), r3 in flight.
@example(
    schedule={
        "elements": [Record(0, 0), Watermark(10), Record(2, 20), Record(3, 30)],
        "ops": [("feed", 0), ("feed", 1), ("feed", 2), ("complete", 2), ("feed", 3)],
        "snapshot_at": 5,
        "capacity": 5,
    }
)
# capacity 1: r0 in flight, r1 waits for room inside the operator at the snapshot.
@example(
    schedule={
        "elements": [Record(0, 0), Record(1, 10), Watermark(20)],
        "ops": [("feed", 0), ("feed", 1), ("complete", 0), ("feed", 2)],
        "snapshot_at": 2,
        "capacity": 1,
    }
)
def test_snapshot_restore_continue_equals_an_uninterrupted_run(mode, schedule):
    elements, ops = schedule["elements"], schedule["ops"]
    config = dict(mode=mode, capacity=schedule["capacity"])

    # The uninterrupted run.
    fn_ref = Scripted()
    ref = OperatorHarness(async_wait(fn_ref, **config))
    for op in ops:
        apply_op(ref, fn_ref, op, elements)
    finish(ref, fn_ref)

    # The interrupted run: h1 up to the snapshot (the first point at or after snapshot_at where
    # the harness holds no unprocessed input), then a new operator restored from it.
    fn1 = Scripted()
    h1 = OperatorHarness(async_wait(fn1, **config))
    h1.open()
    i = 0
    while i < len(ops) and (i < schedule["snapshot_at"] or h1.pending_input):
        apply_op(h1, fn1, ops[i], elements)
        i += 1
    h1.run_until_idle()  # run the results that came in: the snapshot is taken between mails
    while h1.pending_input:  # out of ops with input still queued: make room (results do not
        apply_op(h1, fn1, ("complete", fn1.in_flight()[-1]), elements)  # depend on the order)
        h1.run_until_idle()
    snapshot = h1.snapshot()
    before = list(h1.output)
    fed_records = [e for e in elements[: sum(1 for k, _ in ops[:i] if k == "feed")] if isinstance(e, Record)]
    emitted_values = {r.value for r in h1.output_records()}
    unemitted = [r.value for r in fed_records if r.value not in emitted_values]
    h1.close()

    fn2 = Scripted()
    h2 = OperatorHarness(async_wait(fn2, **config))
    h2.restore(snapshot)
    h2.open()
    # Elements in flight at the snapshot (completed but unemitted ones included) are invoked again.
    replayed = [v for v, _ in fn2.calls]
    assert set(replayed) <= set(unemitted)
    if mode == "ordered":
        assert replayed == unemitted[: len(replayed)]
    for op in ops[i:]:
        apply_op(h2, fn2, op, elements)
    finish(h2, fn2)
    assert set(unemitted) <= {v for v, _ in fn2.calls}
    assert not ({v for v, _ in fn2.calls} & emitted_values)  # nothing emitted is asked again

    combined = before + list(h2.output)
    assert same_stream(mode, combined, list(ref.output)), (
        f"before snapshot: {before}\nafter restore: {h2.output}\nuninterrupted: {ref.output}"
    )
    # And both equal the input stream's records with their results.
    expected = [Record(v, e.timestamp_ms) for e in elements if isinstance(e, Record) for v in results_of(e.value)]
    assert Counter(r for r in combined if isinstance(r, Record)) == Counter(expected)
    ref.close()
    h2.close()
