"""What the operator actor relies on: batches with event time beside the columns, Flink's
``of``/``with_gap`` constructors, and window bounds as datetimes for timestamp columns."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from actorflow.operators import OperatorHarness, SchemaError
from actorflow.operators.windows import (
    Aggregations,
    Count,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
    WindowOperator,
)


@pytest.mark.parametrize(
    "built, expected",
    [
        (TumblingEventTimeWindows.of(size_ms=60_000, offset_ms=5), TumblingEventTimeWindows(60_000, 5)),
        (SlidingEventTimeWindows.of(size_ms=10, slide_ms=5), SlidingEventTimeWindows(10, 5)),
        (EventTimeSessionWindows.with_gap(30), EventTimeSessionWindows(30)),
    ],
)
def test_flink_constructors_build_the_same_assigner(built, expected):
    assert type(built) is type(expected) and repr(built) == repr(expected)


def test_flink_constructors_validate_like_the_constructor():
    with pytest.raises(ValueError, match="size_ms must be > 0, got 0"):
        TumblingEventTimeWindows.of(size_ms=0)
    with pytest.raises(ValueError, match="gap_ms must be > 0, got -1"):
        EventTimeSessionWindows.with_gap(-1)


def _run(op, table, timestamps):
    h = OperatorHarness(op)
    h.open()
    op.process_timestamped_batch(table, pa.array(timestamps, pa.int64()))
    h.process_watermark(10_000)
    return h


@pytest.mark.parametrize("vectorised", [True, False], ids=["arrow_path", "per_record_path"])
def test_a_batch_with_event_time_beside_its_columns_gives_the_per_record_results(vectorised):
    table = pa.table({"user": ["a", "b", "a"], "amount": [1, 2, 3]})
    aggregate = Aggregations(n=Count(), total=Sum("amount"))
    op = WindowOperator("user" if vectorised else (lambda v: v["user"]), TumblingEventTimeWindows(10),
                        aggregate=aggregate)
    rows = _run(op, table, [1, 2, 13]).output_values()
    key = "user" if vectorised else "key"
    assert sorted(rows, key=lambda r: (r["window_start"], r[key])) == [
        {key: "a", "window_start": 0, "window_end": 10, "n": 1, "total": 1},
        {key: "b", "window_start": 0, "window_end": 10, "n": 1, "total": 2},
        {key: "a", "window_start": 10, "window_end": 20, "n": 1, "total": 3},
    ]


def test_a_null_event_time_in_a_batch_fails_naming_the_record():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    h.open()
    with pytest.raises(SchemaError, match=r"record \{'user': 'b'\} has timestamp_ms=None"):
        op.process_timestamped_batch(pa.table({"user": ["a", "b"]}), pa.array([1, None], pa.int64()))


def test_bounds_as_datetime_gives_utc_datetimes_of_the_same_instants():
    op = WindowOperator("user", TumblingEventTimeWindows(60_000), aggregate=Count(), bounds_as_datetime=True)
    h = OperatorHarness(op)
    h.process_element({"user": "a"}, 1_760_000_012_345)
    h.process_watermark(1_760_000_100_000)
    (row,) = h.output_values()
    utc = dt.timezone.utc
    assert row["window_start"] == dt.datetime(2025, 10, 9, 8, 53, tzinfo=utc)
    assert row["window_end"] - row["window_start"] == dt.timedelta(minutes=1)
    assert row["window_start"].timestamp() * 1000 == 1_760_000_012_345 - 1_760_000_012_345 % 60_000
