"""Async I/O: a watermark status queues behind the records before it, as a watermark does.

A status that overtook a record in flight would tell the valve downstream that the channel is
idle while that record is still to come: another input's watermark would pass, and the record
would arrive late.
"""

from __future__ import annotations

import pytest

from actorflow.operators import OperatorHarness, Record, Watermark, WatermarkStatus, async_wait, async_wait_batch

from .scripted import Scripted, ScriptedBatch

IDLE, ACTIVE = WatermarkStatus.IDLE(), WatermarkStatus.ACTIVE()


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_idle_waits_for_the_record_in_flight_before_it(mode):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode=mode, capacity=10))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    assert h.output == []  # r1's request is still open
    fn.complete("r1")
    h.run_until_idle()
    assert h.output == [Record("r1", 1), IDLE]


@pytest.mark.parametrize("mode, want", [
    # Input order.
    ("ordered", [Record("r1", 1), IDLE, Record("r2", 2), ACTIVE]),
    # A status is a barrier between record groups, as a watermark is: r2 completed first, but
    # it came after IDLE.
    ("unordered", [Record("r1", 1), IDLE, Record("r2", 2), ACTIVE]),
])
def test_a_status_is_never_overtaken_and_never_overtakes(mode, want):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode=mode, capacity=10))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    h.process_element("r2", timestamp_ms=2)
    h.process_watermark_status(False)
    fn.complete("r2")
    h.run_until_idle()
    assert h.output == []
    fn.complete("r1")
    h.run_until_idle()
    assert h.output == want


def test_unordered_records_between_two_statuses_leave_in_completion_order():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=10))
    h.process_watermark_status(True)
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    h.process_watermark_status(False)
    fn.complete("b")
    h.run_until_idle()
    assert h.output == [IDLE, Record("b", 2)]  # an empty queue lets the status out at once
    fn.complete("a")
    h.run_until_idle()
    assert h.output == [IDLE, Record("b", 2), Record("a", 1), ACTIVE]


def test_a_status_takes_a_queue_slot_and_waits_for_room():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=1))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    h.process_element("r2", timestamp_ms=2)
    assert h.output == [] and fn.in_flight() == ["r1"]
    fn.complete("r1")
    h.run_until_idle()
    assert h.output == [Record("r1", 1), IDLE]
    fn.complete("r2")
    h.run_until_idle()
    assert h.output == [Record("r1", 1), IDLE, Record("r2", 2)]


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_a_snapshot_keeps_a_queued_status_in_its_place(mode):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode=mode, capacity=10))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    h.process_element("r2", timestamp_ms=2)
    h.process_watermark(2)
    fn.complete("r2")
    h.run_until_idle()
    snapshot = h.snapshot()

    fn2 = Scripted()
    h2 = OperatorHarness(async_wait(fn2, mode=mode, capacity=10))
    h2.restore(snapshot)
    h2.open()
    assert [v for v, _ in fn2.calls] == ["r1", "r2"]  # replayed; the status keeps its place
    fn2.complete("r2")
    h2.run_until_idle()
    assert h2.output == []
    fn2.complete("r1")
    h2.run_until_idle()
    # A watermark on the idle input made it active first (the valve's ACTIVE): both kept their place.
    assert h2.output == [Record("r1", 1), IDLE, Record("r2", 2), ACTIVE, Watermark(2)]


def test_a_status_waiting_for_room_is_in_the_snapshot_too():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=1))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)  # no room: it waits behind r1
    snapshot = h.snapshot()

    fn2 = Scripted()
    h2 = OperatorHarness(async_wait(fn2, capacity=1))
    h2.restore(snapshot)
    h2.open()
    fn2.complete("r1")
    h2.run_until_idle()
    assert h2.output == [Record("r1", 1), IDLE]


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_batch_a_status_flushes_the_buffer_and_waits_for_its_batch(mode):
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=10, mode=mode, capacity=2))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    h.process_element("r2", timestamp_ms=2)
    h.process_watermark_status(False)
    assert fn.batches() == [["r1"], ["r2"]]  # a batch never spans a status
    assert h.output == []
    fn.complete(1)
    h.run_until_idle()
    assert h.output == []
    fn.complete(0)
    h.run_until_idle()
    assert h.output == [Record("r1", 1), IDLE, Record("r2", 2), ACTIVE]


def test_batch_a_snapshot_keeps_a_queued_status_in_its_place():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=10, capacity=2))
    h.process_element("r1", timestamp_ms=1)
    h.process_watermark_status(True)
    h.process_element("r2", timestamp_ms=2)
    snapshot = h.snapshot()

    fn2 = ScriptedBatch()
    h2 = OperatorHarness(async_wait_batch(fn2, batch_size=10, capacity=2))
    h2.restore(snapshot)
    h2.open()
    assert fn2.batches() == [["r1"]]  # r2 is back in the buffer
    h2.end_input()
    assert fn2.batches() == [["r1"], ["r2"]]
    fn2.complete(1)
    fn2.complete(0)
    h2.run_until_idle()
    assert h2.output[:3] == [Record("r1", 1), IDLE, Record("r2", 2)]
