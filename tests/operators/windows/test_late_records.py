"""A late record says which windows it missed and why, in the side output and in the metrics."""

from __future__ import annotations

import pyarrow as pa
import pytest

from actorflow.operators import OperatorHarness
from actorflow.operators.windows import (
    Count,
    EventTimeSessionWindows,
    LateReason,
    LateRecord,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowOperator,
)


def _late_counts(op: WindowOperator) -> dict[str, int]:
    m = op.metrics
    return {"dropped": m.late_records_dropped, "behind_watermark": m.late_behind_watermark,
            "past_allowed_lateness": m.late_past_allowed_lateness, "window_closed": m.late_window_closed}


def test_without_lateness_a_record_behind_the_watermark_names_its_window_and_the_watermark():
    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"k": "a"}, 3)
    h.process_watermark(25)
    h.process_element({"k": "a", "n": 2}, 4)
    assert h.side_output("late") == [LateRecord({"k": "a", "n": 2}, 4, LateReason.BEHIND_WATERMARK, ((0, 10),), 25)]
    assert _late_counts(op) == {"dropped": 0, "behind_watermark": 1, "past_allowed_lateness": 0, "window_closed": 0}


def test_past_the_allowed_lateness_it_is_late_for_that_reason_and_within_it_not_at_all():
    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count(), allowed_lateness_ms=5,
                        late_data_tag="late")
    h = OperatorHarness(op)
    h.process_watermark(12)
    h.process_element({"k": "a"}, 8)  # its window [0,10) is kept until 14: not late
    h.process_watermark(14)
    h.process_element({"k": "b"}, 9)
    assert h.side_output("late") == [LateRecord({"k": "b"}, 9, LateReason.PAST_ALLOWED_LATENESS, ((0, 10),), 14)]
    assert _late_counts(op)["past_allowed_lateness"] == 1 and _late_counts(op)["behind_watermark"] == 0


def test_a_sliding_record_names_every_window_it_missed_and_is_not_late_while_one_is_open():
    op = WindowOperator("k", SlidingEventTimeWindows(20, 10), aggregate=Count(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_watermark(25)
    h.process_element({"k": "a"}, 15)  # [10,30) is open: not late
    h.process_element({"k": "a"}, 5)  # [0,20) and [-10,10) both ended
    [late] = h.side_output("late")
    assert late.value == {"k": "a"} and late.reason is LateReason.BEHIND_WATERMARK
    assert sorted(late.windows) == [(-10, 10), (0, 20)]


def test_a_record_that_would_reopen_a_closed_session_is_late_because_its_window_closed():
    op = WindowOperator("k", EventTimeSessionWindows(5), aggregate=Count(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"k": "a"}, 0)
    h.process_watermark(6)  # [0,5) fires and is cleaned up
    h.process_element({"k": "a", "again": True}, 3)
    assert h.side_output("late") == [
        LateRecord({"k": "a", "again": True}, 3, LateReason.WINDOW_CLOSED, ((3, 8),), 6)]
    assert _late_counts(op)["window_closed"] == 1


def test_without_a_side_output_each_is_dropped_and_counted_by_reason():
    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    h.process_watermark(30)
    h.process_element({"k": "a"}, 1)
    h.process_element({"k": "a"}, 2)
    assert h.side_outputs == {}
    assert _late_counts(op) == {"dropped": 2, "behind_watermark": 2, "past_allowed_lateness": 0, "window_closed": 0}


@pytest.mark.parametrize("path", ["per_record", "arrow"])
def test_the_arrow_path_gives_the_same_late_records(path):
    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"k": "a", "ts": 3}, 3)
    h.process_watermark(20)
    rows = [{"k": "a", "ts": 4}, {"k": "b", "ts": 25}, {"k": "b", "ts": 11}]
    if path == "arrow":
        op.process_batch(pa.Table.from_pylist(rows), "ts")
    else:
        for row in rows:
            h.process_element(row, row["ts"])
    assert h.side_output("late") == [
        LateRecord({"k": "a", "ts": 4}, 4, LateReason.BEHIND_WATERMARK, ((0, 10),), 20),
        LateRecord({"k": "b", "ts": 11}, 11, LateReason.BEHIND_WATERMARK, ((10, 20),), 20),  # [10,20) ended at 19
    ]
    assert _late_counts(op)["behind_watermark"] == 2


def test_pre_aggregated_rows_that_come_late_are_counted_behind_the_watermark():
    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    h.process_watermark(20)
    table = pa.table({"k": ["a", "a", "b"], "ts": [1, 2, 25]})
    partials = op.pre_aggregate(table, table.column("ts"))
    assert partials is not None
    op.process_partials(partials, table.num_rows)
    assert _late_counts(op) == {"dropped": 2, "behind_watermark": 2, "past_allowed_lateness": 0, "window_closed": 0}
