"""A record's origin travels with it: through map, filter, flat map and timestamp assignment."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import (
    BoundedOutOfOrdernessWatermarks,
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    OperatorHarness,
    Record,
    TimestampsAndWatermarksOperator,
)


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


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
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
