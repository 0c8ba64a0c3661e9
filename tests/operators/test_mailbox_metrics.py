"""What an instance publishes of its mailbox: the depth by priority, the age of the oldest mail,
and why the default action waits, if it does."""

from __future__ import annotations

from actorflow.operators import MapOperator, OperatorHarness, async_wait
from actorflow.operators.clock import ManualClock
from actorflow.operators.mailbox import MIN_PRIORITY, Mail, TaskMailbox
from actorflow.operators.stream_task import Suspended

from .scripted import Scripted


def test_the_depth_is_counted_by_the_priority_take_compares():
    mb = TaskMailbox()
    for priority in (0, 2, 2):
        mb.put(Mail(lambda: None, priority=priority))
    mb.put(Mail(lambda: None, priority=2, deferrable=True))  # waits like the lowest
    assert mb.depth_by_priority() == {MIN_PRIORITY: 1, 0: 1, 2: 2}
    mb.try_take(2)
    assert mb.depth_by_priority() == {MIN_PRIORITY: 1, 0: 1, 2: 1}


def test_the_oldest_mail_is_the_one_that_waited_longest_and_none_when_empty():
    clock = ManualClock(1_000)
    mb = TaskMailbox(clock)
    assert mb.oldest_mail_age_ms() is None
    mb.put(Mail(lambda: None, description="old"))
    clock.advance_by(50)
    mb.put_first(Mail(lambda: None, description="urgent"))  # in front, but younger
    clock.advance_by(5)
    assert mb.oldest_mail_age_ms() == 55
    mb.try_take(MIN_PRIORITY)  # the urgent one
    assert mb.oldest_mail_age_ms() == 55
    mb.try_take(MIN_PRIORITY)
    assert mb.oldest_mail_age_ms() is None


def test_a_task_without_input_waits_for_input():
    h = OperatorHarness(MapOperator(lambda v: v, "same"))
    h.process_element(1, 1)
    assert h.task.suspended is Suspended.NO_INPUT


def test_a_full_async_queue_says_so_and_the_completion_ends_the_wait():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=1))
    h.process_element("a", 1)
    h.process_element("b", 2)  # no room: it waits in front of the operator
    assert h.task.suspended is Suspended.ASYNC_QUEUE_FULL
    fn.complete("a")
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == ["a", "b"]  # "b" took the slot "a" left
    fn.complete("b")
    h.run_until_idle()
    assert h.task.suspended is Suspended.NO_INPUT and h.output_values() == ["a", "b"]


def test_a_channel_whose_barrier_came_first_holds_back_its_items():
    h = OperatorHarness(MapOperator(lambda v: v, "same"), num_inputs=2)
    h.process_barrier(1, channel=0)
    h.process_element("behind the barrier", 1, channel=0)
    assert h.task.suspended is Suspended.BARRIER_ALIGNMENT and h.output_values() == []
    h.process_barrier(1, channel=1)
    assert h.output_values() == ["behind the barrier"] and h.task.suspended is Suspended.NO_INPUT


def test_a_full_output_is_backpressure_even_with_a_full_queue():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=1))
    h.process_element("a", 1)
    h.task.host.output_is_full = lambda: True  # downstream takes no more
    h.process_element("b", 2)
    assert h.task.suspended is Suspended.BACKPRESSURE


def test_after_the_end_of_input_it_waits_for_the_last_requests():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=4))
    h.process_element("a", 1)
    h.end_input()
    assert h.task.suspended is Suspended.FINISHING
    fn.complete("a")
    h.run_until_idle()
    assert h.is_finished
