"""A record's origin travels with it: through map, filter, flat map, timestamp assignment and async calls."""

from __future__ import annotations

import doctest
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import (
    BoundedOutOfOrdernessWatermarks,
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    OperatorHarness,
    Record,
    TimestampsAndWatermarksOperator,
    async_wait,
    async_wait_batch,
    elements,
)

from .scripted import Scripted, ScriptedBatch
from tests.properties import examples


def test_docstring_examples():
    result = doctest.testmod(elements)
    assert result.attempted > 0 and result.failed == 0


def test_record_keeps_its_origin_through_with_value_and_pickling():
    record = Record("a", 5, origin=(0, 3, 17))
    assert record.with_value("A") == Record("A", 5, (0, 3, 17))
    assert pickle.loads(pickle.dumps(record)) == record
    assert Record("a", 5) != record  # the origin is part of the record
    assert hash(Record("a", 5, (0, 3, 17))) == hash(record)


@pytest.mark.parametrize(
    "operator, expected",
    [
        # a map's output is the same record with another value
        (MapOperator(str.upper), [Record("A", 1, (7, 0)), Record("B", 2, None)]),
        # a filter keeps the records it passes as they are
        (FilterOperator(lambda v: v == "b"), [Record("b", 2, None)]),
        # the i-th output of a flat map gets origin + (i,); without an origin, none
        (
            FlatMapOperator(lambda v: [v, v * 2]),
            [Record("a", 1, (7, 0, 0)), Record("aa", 1, (7, 0, 1)), Record("b", 2, None), Record("bb", 2, None)],
        ),
    ],
    ids=["map", "filter", "flat_map"],
)
def test_plain_operators_pass_the_origin_on(operator, expected):
    h = OperatorHarness(operator)
    h.process_element("a", timestamp_ms=1, origin=(7, 0))
    h.process_element("b", timestamp_ms=2)
    assert h.output_records() == expected


def test_timestamp_assignment_keeps_the_origin():
    h = OperatorHarness(TimestampsAndWatermarksOperator(BoundedOutOfOrdernessWatermarks(0), timestamp_fn=lambda v: v["ts"]))
    h.process_element({"ts": 50}, origin=("split-1", 4))
    assert h.output_records() == [Record({"ts": 50}, 50, ("split-1", 4))]


@settings(max_examples=examples(50), deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(st.integers(), max_size=4), max_size=6))
def test_chained_flat_maps_extend_the_origin_by_each_output_position(fan_outs):
    # Every input becomes its lists' items, and every item again itself and its negation.
    h = OperatorHarness([FlatMapOperator(lambda v: v), FlatMapOperator(lambda v: [v, -v]), MapOperator(abs)])
    for row, items in enumerate(fan_outs):
        h.process_element(items, timestamp_ms=row, origin=("s", row))
    expected = [
        Record(abs(v), row, ("s", row, i, j))
        for row, items in enumerate(fan_outs) for i, v in enumerate(items) for j in (0, 1)
    ]
    assert h.output_records() == expected
    assert len({r.origin for r in expected}) == len(expected)


# ----------------------------------------------------------------------------- async operators


@pytest.mark.parametrize(
    "results, origins",
    [
        ([["x"]], [(5, 1)]),  # one result: the record's origin, as a map gives
        ([["x", "y", "z"]], [(5, 1), (5, 1, 1), (5, 1, 2)]),  # the first keeps it; the others get their position
        ([[]], []),  # no result, no output
    ],
    ids=["one", "several", "none"],
)
def test_async_results_keep_the_record_origin(results, origins):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2))
    h.process_element("a", timestamp_ms=1, origin=(5, 1))
    fn.complete("a", results[0])
    h.run_until_idle()
    assert [r.origin for r in h.output_records()] == origins
    assert {r.timestamp_ms for r in h.output_records()} <= {1}


def test_async_fallback_keeps_the_origin_and_a_record_without_one_gets_none():
    fn = Scripted(fallback=lambda v: f"{v}-fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100))
    h.process_element("a", timestamp_ms=1, origin=("s", 0))
    h.process_element("b", timestamp_ms=2)
    h.set_processing_time(100)
    assert h.output_records() == [Record("a-fallback", 1, ("s", 0)), Record("b-fallback", 2, None)]


def test_batched_results_keep_each_record_origin():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2))
    h.process_element("a", timestamp_ms=1, origin=(0, 0))
    h.process_element("b", timestamp_ms=2, origin=(0, 1))
    fn.complete(0, [["A"], ["B1", "B2"]])
    h.run_until_idle()
    assert h.output_records() == [Record("A", 1, (0, 0)), Record("B1", 2, (0, 1)), Record("B2", 2, (0, 1, 1))]


@pytest.mark.parametrize("batched", [False, True], ids=["async_wait", "async_wait_batch"])
def test_a_restored_record_keeps_its_origin(batched):
    fn: Any = ScriptedBatch() if batched else Scripted()

    def make():
        return async_wait_batch(fn, batch_size=1, capacity=1) if batched else async_wait(fn, capacity=1)

    h1 = OperatorHarness(make())
    h1.process_element("a", timestamp_ms=1, origin=(3, 9))
    h1.process_element("b", timestamp_ms=2, origin=(3, 10))  # waits for room
    snap = h1.snapshot()

    fn = ScriptedBatch() if batched else Scripted()
    h2 = OperatorHarness(make())
    h2.restore(snap)
    for _ in "ab":
        h2.run_until_idle()
        fn.complete(fn.in_flight()[0])  # a value, or a batch's position
    h2.run_until_idle()
    assert h2.output_records() == [Record("a", 1, (3, 9)), Record("b", 2, (3, 10))]


def test_origins_through_a_chain_of_map_async_and_flat_map():
    async def lookup(value):
        return [value, value.upper()] if value == "bb" else [value]

    h = OperatorHarness([MapOperator(lambda v: v * 2), async_wait(lookup), FlatMapOperator(lambda v: [v, len(v)])])
    h.process_element("a", timestamp_ms=1, origin=(0,))
    h.process_element("b", timestamp_ms=2, origin=(1,))
    h.run_until_idle()
    assert h.output_records() == [
        Record("aa", 1, (0, 0)), Record(2, 1, (0, 1)),
        Record("bb", 2, (1, 0)), Record(2, 2, (1, 1)),
        Record("BB", 2, (1, 1, 0)), Record(2, 2, (1, 1, 1)),
    ]
