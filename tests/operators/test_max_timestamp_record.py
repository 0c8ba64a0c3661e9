"""The record that moved the watermark: the built-in generators keep what the caller says of the
record with the largest timestamp, so that late records can name the one that made them late."""

from __future__ import annotations

import pickle

import pytest

from actorflow.operators.clock import ManualClock
from actorflow.operators.elements import Watermark
from actorflow.operators.watermarks import BoundedOutOfOrdernessWatermarks, WatermarksWithIdleness

YEAR_9999_MS = 253_402_214_400_000  # 9999-12-31T00:00:00Z


@pytest.mark.parametrize(
    "events, expected",
    [
        ([(1_000, "a"), (900, "b")], "a"),  # an earlier timestamp moves nothing
        ([(1_000, "a"), (1_000, "b")], "a"),  # an equal one neither: the first to reach it stays
        ([(1_000, "a"), (YEAR_9999_MS, "absurd"), (2_000, "c")], "absurd"),  # one absurd row holds it for good
        ([], None),  # no record, nothing to name
    ],
    ids=["earlier", "equal", "absurd", "none"],
)
def test_the_generator_keeps_the_record_of_its_largest_timestamp(events, expected):
    g = BoundedOutOfOrdernessWatermarks(5_000)
    for timestamp_ms, record in events:
        g.on_event(timestamp_ms, record)
    assert g.max_record == expected


def test_an_absurd_timestamp_moves_the_watermark_and_the_generator_names_its_record():
    g = BoundedOutOfOrdernessWatermarks(5_000)
    g.on_event(1_760_000_000_000, "row 0")
    g.on_event(YEAR_9999_MS, "row 17")
    g.on_event(1_760_000_001_000, "row 18")
    assert g.on_periodic_emit() == [Watermark(YEAR_9999_MS - 5_001)]
    assert g.max_record == "row 17"


def test_idleness_passes_the_record_to_the_generator_it_wraps():
    g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=ManualClock(0))
    g.on_event(50, "row 0")
    g.on_event(60, "row 1")
    g.on_event(55)  # a caller that says nothing of the record keeps the one before
    assert g.max_record == "row 1" and g.watermarks.max_record == "row 1"


def test_idleness_around_a_generator_of_the_users_gives_it_the_timestamp_alone():
    class Highest:  # a generator that takes only the timestamp, as the protocol says
        def __init__(self) -> None:
            self.seen: list[int] = []

        def on_event(self, timestamp_ms: int) -> None:
            self.seen.append(timestamp_ms)

        def on_periodic_emit(self) -> list:
            return []

    inner = Highest()
    g = WatermarksWithIdleness(inner, idleness_ms=100, clock=ManualClock(0))
    g.on_event(50, "row 0")
    assert inner.seen == [50] and g.max_record is None


def test_a_generator_pickled_before_it_kept_records_restores_and_keeps_them_from_then_on():
    # A checkpoint's generator from before: no max_record, no _keeps_records in its __dict__.
    old = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=ManualClock(0))
    del old.__dict__["_keeps_records"], old.watermarks.__dict__["max_record"]
    restored = pickle.loads(pickle.dumps(old))
    assert restored.max_record is None
    restored.on_event(70, "row 3")
    assert restored.watermarks.max_timestamp_ms == 70
