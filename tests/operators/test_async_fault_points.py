"""The async operators report their chaos moments through ``OperatorContext.fault_point``: a
retry timer registered ("retry_wait") and an outcome recorded before its emission ("completion").
The harness lists them in ``fault_points`` when it watches them."""

from __future__ import annotations

from actorflow.operators import FixedDelay, OperatorHarness, Record, async_wait, async_wait_batch
from actorflow.operators.operator import OperatorContext, no_fault_point

from .scripted import Scripted, ScriptedBatch


def test_a_retry_wait_and_each_completion_are_reported_in_order():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=10, retry=FixedDelay(3, 10)), watch_fault_points=True)
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    fn.fail("a", RuntimeError("503"))
    h.run_until_idle()
    assert h.fault_points == ["retry_wait"]
    fn.complete("b")
    h.run_until_idle()
    # b completed, and waits behind a: the moment is between completion and emission.
    assert h.fault_points == ["retry_wait", "completion"] and h.output == []
    h.set_processing_time(10)
    fn.complete("a")
    h.run_until_idle()
    assert h.fault_points == ["retry_wait", "completion", "completion"]
    assert h.output == [Record("a", 1), Record("b", 2)]


def test_the_batch_operator_reports_its_moments_too():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, capacity=2, retry=FixedDelay(3, 10)), watch_fault_points=True)
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    fn.fail(0, RuntimeError("503"))
    h.run_until_idle()
    assert h.fault_points == ["retry_wait"]
    h.set_processing_time(10)
    fn.complete(1)
    h.run_until_idle()
    assert h.fault_points == ["retry_wait", "completion", "completion"]  # one per record


def test_unwatched_moments_are_not_reported_and_the_context_holds_the_no_op():
    fn = Scripted()
    op = async_wait(fn, capacity=10, retry=FixedDelay(3, 10))
    h = OperatorHarness(op)
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", RuntimeError("503"))
    h.set_processing_time(10)
    fn.complete("a")
    h.run_until_idle()
    assert h.output == [Record("a", 1)] and h.fault_points == []
    # Unarmed, the operators skip the call altogether.
    assert op.context.fault_point is no_fault_point
    assert OperatorContext.__dataclass_fields__["fault_point"].default is no_fault_point
