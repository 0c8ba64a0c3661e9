"""Processing-time scheduling and the timer service.

``ManualProcessingTimeService`` delivers due timers as mails; the test is the mailbox thread and
runs them. ``TimerService`` keeps event-time and processing-time timers of
``(timestamp_ms, key, namespace)``, one of each, deletable, and fires them in timestamp order.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from actorflow.operators import (
    ConfigurationError,
    MailboxExecutor,
    ManualClock,
    ManualProcessingTimeService,
    TaskMailbox,
    Timer,
    TimerService,
)
from actorflow.operators.timers import DeadlineQueue


class Env:
    """A mailbox, a manual clock and a processing-time service on top of them."""

    def __init__(self, start_ms: int = 0) -> None:
        self.mailbox = TaskMailbox()
        self.clock = ManualClock(start_ms)
        self.pts = ManualProcessingTimeService(self.clock, MailboxExecutor(self.mailbox))

    def run_mails(self) -> int:
        n = 0
        while (mail := self.mailbox.try_take()) is not None:
            mail.run()
            n += 1
        return n

    def advance(self, timestamp_ms: int) -> int:
        """Move the clock and run the mails that fell due; returns how many mails ran."""
        self.pts.advance_to(timestamp_ms)
        return self.run_mails()


class Recorder:
    """A ``Triggerable`` that writes down what fired."""

    def __init__(self) -> None:
        self.event: list[tuple[int, Any, Any]] = []
        self.processing: list[tuple[int, Any, Any]] = []

    def on_event_time(self, timer: Timer) -> None:
        self.event.append((timer.timestamp_ms, timer.key, timer.namespace))

    def on_processing_time(self, timer: Timer) -> None:
        self.processing.append((timer.timestamp_ms, timer.key, timer.namespace))


# -------------------------------------------------------------- ManualProcessingTimeService


def test_due_timers_are_put_as_mails_in_timestamp_order_and_run_by_the_mailbox():
    env = Env()
    fired: list[tuple[str, int]] = []
    for ts, name in [(30, "c"), (10, "a"), (40, "d"), (20, "b")]:
        env.pts.register_timer(ts, lambda t, name=name: fired.append((name, t)))
    assert env.mailbox.size() == 0

    env.pts.advance_to(30)
    assert fired == []  # due timers are mails: nothing runs until the mailbox runs them
    assert env.mailbox.size() == 3
    assert env.run_mails() == 3
    assert fired == [("a", 10), ("b", 20), ("c", 30)]  # the callback gets its timestamp
    assert env.pts.pending() == 1

    assert env.advance(39) == 0
    assert env.advance(40) == 1
    assert fired[-1] == ("d", 40)
    assert env.pts.pending() == 0


def test_timers_with_the_same_timestamp_fire_in_registration_order():
    env = Env()
    fired: list[str] = []
    for name in "xyz":
        env.pts.register_timer(5, lambda _t, name=name: fired.append(name))
    env.advance(5)
    assert fired == ["x", "y", "z"]


def test_a_timer_registered_at_or_before_now_goes_to_the_mailbox_at_once():
    env = Env(start_ms=100)
    fired: list[int] = []
    env.pts.register_timer(100, fired.append)
    env.pts.register_timer(50, fired.append)
    assert env.mailbox.size() == 2
    env.run_mails()
    assert fired == [100, 50]  # each was put when registered


def test_timer_mails_describe_their_timestamp():
    env = Env()
    env.pts.register_timer(7, lambda _t: None)
    env.pts.advance_to(7)
    assert str(env.mailbox.try_take()) == "processing timer @7"


@pytest.mark.parametrize(
    "cancel_when",
    [
        "before_due",  # cancelled while still in the service's queue
        "in_mailbox",  # cancelled after it was put in the mailbox, before the mail ran
    ],
)
def test_a_cancelled_timer_never_runs(cancel_when):
    env = Env()
    fired: list[int] = []
    handle = env.pts.register_timer(10, fired.append)
    env.pts.register_timer(10, lambda t: fired.append(-t))  # a neighbour that does run
    if cancel_when == "before_due":
        handle.cancel()
        assert env.pts.pending() == 1
    env.pts.advance_to(10)
    if cancel_when == "before_due":
        assert env.mailbox.size() == 1  # a cancelled timer does not even become a mail
    else:
        assert env.mailbox.size() == 2
        handle.cancel()
    env.run_mails()
    assert fired == [-10]
    assert handle.cancelled


def test_many_cancelled_timers_are_dropped_and_the_live_ones_still_fire_in_order():
    # Every request's timeout is a timer, and nearly all are cancelled when the request completes.
    env = Env()
    fired: list[int] = []
    handles = [env.pts.register_timer(1_000 + i, fired.append) for i in range(500)]
    for i, handle in enumerate(handles):
        if i % 10:
            handle.cancel()
    handles[0].cancel()
    handles[0].cancel()  # twice is the same as once
    assert env.pts.pending() == 49
    assert env.pts.next_due_ms() == 1_010
    env.pts.advance_to(2_000)
    env.run_mails()
    assert fired == [1_000 + i for i in range(10, 500, 10)]
    assert env.pts.pending() == 0 and env.pts.next_due_ms() is None


def test_now_ms_follows_the_clock():
    env = Env(start_ms=3)
    assert env.pts.now_ms() == 3
    env.advance(8)
    assert env.pts.now_ms() == env.clock.now_ms() == 8


def test_processing_time_service_advance_cannot_go_backwards():
    env = Env(start_ms=10)
    with pytest.raises(ConfigurationError, match="never goes backwards"):
        env.pts.advance_to(9)


# --------------------------------------------------------------------- event-time timers

R, D = "register", "delete"


@pytest.mark.parametrize(
    "ops, watermark, fired, left",
    [
        # the same timer twice: one timer, one firing
        ([(R, 10, "k", None), (R, 10, "k", None)], 10, [(10, "k", None)], []),
        # same timestamp, different keys or namespaces: distinct timers, registration order
        (
            [(R, 10, "b", None), (R, 10, "a", None), (R, 10, "a", "w1")],
            10,
            [(10, "b", None), (10, "a", None), (10, "a", "w1")],
            [],
        ),
        # timestamp order, whatever the registration order; the watermark is inclusive
        (
            [(R, 30, "k", None), (R, 10, "k", None), (R, 20, "k", None), (R, 31, "k", None)],
            30,
            [(10, "k", None), (20, "k", None), (30, "k", None)],
            [(31, "k", None)],
        ),
        # a deleted timer does not fire
        ([(R, 10, "k", None), (R, 12, "j", None), (D, 10, "k", None)], 20, [(12, "j", None)], []),
        # deleting a timer that does not exist changes nothing
        ([(R, 10, "k", None), (D, 10, "other", None)], 10, [(10, "k", None)], []),
        # deleted, then registered again: it fires, once
        ([(R, 10, "k", None), (D, 10, "k", None), (R, 10, "k", None)], 10, [(10, "k", None)], []),
        # registered twice, deleted once: gone (there was only one)
        ([(R, 10, "k", None), (R, 10, "k", None), (D, 10, "k", None)], 10, [], []),
        # a watermark below every timer fires nothing
        ([(R, 10, "k", None)], 9, [], [(10, "k", None)]),
    ],
)
def test_event_time_timers(ops, watermark, fired, left):
    rec = Recorder()
    service = TimerService(rec, processing_time=None)
    for op, ts, key, ns in ops:
        if op == R:
            service.register_event_time_timer(ts, key, ns)
        else:
            service.delete_event_time_timer(ts, key, ns)
    service.advance_watermark(watermark)
    assert rec.event == fired
    assert [(t.timestamp_ms, t.key, t.namespace) for t in service.event_time_timers()] == left
    assert service.current_watermark_ms == watermark


def test_advance_watermark_fires_each_timer_once_as_the_watermark_moves():
    rec = Recorder()
    service = TimerService(rec, processing_time=None)
    for ts in (5, 15, 10, 25):
        service.register_event_time_timer(ts, "k")
    service.advance_watermark(10)
    assert [t for t, _, _ in rec.event] == [5, 10]
    service.advance_watermark(10)  # the same watermark again fires nothing new
    assert [t for t, _, _ in rec.event] == [5, 10]
    service.advance_watermark(30)
    assert [t for t, _, _ in rec.event] == [5, 10, 15, 25]
    # A fired timer is gone: registering it again makes a new one.
    service.register_event_time_timer(5, "k")
    service.advance_watermark(31)
    assert [t for t, _, _ in rec.event] == [5, 10, 15, 25, 5]


def test_a_timer_registered_while_firing_fires_in_the_same_advance_when_due():
    fired: list[int] = []
    service: TimerService

    class Chain:
        def on_event_time(self, timer: Timer) -> None:
            fired.append(timer.timestamp_ms)
            if timer.timestamp_ms < 30:
                service.register_event_time_timer(timer.timestamp_ms + 10, "k")

        def on_processing_time(self, timer: Timer) -> None:
            raise AssertionError("no processing-time timer here")

    service = TimerService(Chain(), processing_time=None)
    service.register_event_time_timer(10, "k")
    service.advance_watermark(25)
    assert fired == [10, 20]  # 30 is beyond the watermark
    assert [t.timestamp_ms for t in service.event_time_timers()] == [30]


# ---------------------------------------------------------------- processing-time timers


def test_processing_time_timers_fire_through_the_mailbox_in_order_deduplicated():
    env = Env()
    rec = Recorder()
    service = TimerService(rec, env.pts)
    service.register_processing_time_timer(20, "b")
    service.register_processing_time_timer(10, "a")
    service.register_processing_time_timer(10, "a")  # duplicate: kept once
    service.register_processing_time_timer(30, "c")
    env.pts.advance_to(25)
    assert rec.processing == []  # fired as mails, not inline
    env.run_mails()
    assert rec.processing == [(10, "a", None), (20, "b", None)]
    env.advance(30)
    assert rec.processing == [(10, "a", None), (20, "b", None), (30, "c", None)]
    assert service.processing_time_timers() == []


def test_deleted_processing_time_timers_do_not_fire():
    env = Env()
    rec = Recorder()
    service = TimerService(rec, env.pts)
    service.register_processing_time_timer(10, "a")
    service.register_processing_time_timer(15, "b")
    service.register_processing_time_timer(20, "c")
    service.delete_processing_time_timer(10, "a")  # the earliest, which the service scheduled
    service.delete_processing_time_timer(20, "c")
    env.advance(100)
    assert rec.processing == [(15, "b", None)]


def test_registering_an_earlier_processing_time_timer_reschedules():
    env = Env()
    rec = Recorder()
    service = TimerService(rec, env.pts)
    service.register_processing_time_timer(20, "late")
    service.register_processing_time_timer(10, "early")
    env.advance(10)
    assert rec.processing == [(10, "early", None)]  # not held back until 20
    env.advance(19)
    assert rec.processing == [(10, "early", None)]
    env.advance(20)
    assert rec.processing == [(10, "early", None), (20, "late", None)]


def test_a_processing_time_timer_at_or_before_now_fires_at_the_next_mail():
    env = Env(start_ms=50)
    rec = Recorder()
    service = TimerService(rec, env.pts)
    service.register_processing_time_timer(40, "overdue")
    assert env.run_mails() == 1
    assert rec.processing == [(40, "overdue", None)]


def test_processing_time_timers_need_a_processing_time_service():
    service = TimerService(Recorder(), processing_time=None)
    with pytest.raises(ConfigurationError, match="processing-time service"):
        service.register_processing_time_timer(10, "k")


def test_a_periodic_processing_time_timer_keeps_one_underlying_timer():
    """A timer re-registered from its own callback (a continuous trigger) must not pile up
    underlying timers: one is enough, and each period should cost one mail."""
    env = Env()
    fired: list[int] = []
    service: TimerService

    class Periodic:
        def on_event_time(self, timer: Timer) -> None:
            pass

        def on_processing_time(self, timer: Timer) -> None:
            fired.append(timer.timestamp_ms)
            service.register_processing_time_timer(timer.timestamp_ms + 10, timer.key)

    service = TimerService(Periodic(), env.pts)
    service.register_processing_time_timer(10, "k")
    mails_per_period = []
    scheduled = []
    for now in range(10, 61, 10):
        mails_per_period.append(env.advance(now))
        scheduled.append(env.pts.pending())
    assert fired == [10, 20, 30, 40, 50, 60]
    assert mails_per_period == [1] * 6
    assert scheduled == [1] * 6


# ----------------------------------------------------------------------- snapshot/restore


def test_snapshot_and_restore_timers():
    env = Env()
    rec = Recorder()
    service = TimerService(rec, env.pts)
    service.register_event_time_timer(30, "k", "w")
    service.register_event_time_timer(10, "k")
    service.register_event_time_timer(20, "gone")
    service.delete_event_time_timer(20, "gone")
    service.register_processing_time_timer(200, "p2")
    service.register_processing_time_timer(100, "p1")
    service.register_processing_time_timer(150, "gone")
    service.delete_processing_time_timer(150, "gone")
    service.advance_watermark(10)  # fires (10, "k")
    assert rec.event == [(10, "k", None)]

    snapshot = pickle.loads(pickle.dumps(service.snapshot()))  # a snapshot leaves the process
    assert snapshot == {
        "event": [(30, "k", "w")],
        "processing": [(100, "p1", None), (200, "p2", None)],
        "watermark": 10,
    }

    env2 = Env()
    rec2 = Recorder()
    restored = TimerService(rec2, env2.pts)
    restored.restore(snapshot)
    assert restored.current_watermark_ms == 10
    restored.register_event_time_timer(30, "k", "w")  # already there: still one
    restored.advance_watermark(40)
    assert rec2.event == [(30, "k", "w")]
    env2.advance(120)
    assert rec2.processing == [(100, "p1", None)]
    env2.advance(500)
    assert rec2.processing == [(100, "p1", None), (200, "p2", None)]
    # The original is untouched by the restored copy.
    assert [t.timestamp_ms for t in service.event_time_timers()] == [30]


def test_restored_processing_time_timers_that_are_overdue_fire_at_once():
    env = Env()
    service = TimerService(Recorder(), env.pts)
    service.register_processing_time_timer(100, "p")
    snapshot = service.snapshot()

    env2 = Env(start_ms=500)  # restored later than the timer's time
    rec2 = Recorder()
    TimerService(rec2, env2.pts).restore(snapshot)
    env2.run_mails()
    assert rec2.processing == [(100, "p", None)]


def test_snapshot_works_with_keys_that_do_not_order_against_each_other():
    """Keys and namespaces need to be hashable, not orderable: a snapshot must not sort them."""
    service = TimerService(Recorder(), processing_time=None)
    service.register_event_time_timer(10, None)
    service.register_event_time_timer(10, "user-1")
    service.register_event_time_timer(10, ("user", 2))
    snapshot = service.snapshot()
    assert sorted(map(repr, snapshot["event"])) == sorted(
        map(repr, [(10, None, None), (10, "user-1", None), (10, ("user", 2), None)])
    )


def test_a_deleted_and_reregistered_timer_is_snapshotted_once():
    from actorflow.operators import TimerService

    class Ignore:
        def on_event_time(self, timer):
            pass

        def on_processing_time(self, timer):
            pass

    service = TimerService(Ignore(), processing_time=None)
    service.register_event_time_timer(10, "k")
    service.delete_event_time_timer(10, "k")
    service.register_event_time_timer(10, "k")
    assert service.snapshot()["event"] == [(10, "k", None)]


# ------------------------------------------------------------------ deadlines that share a timeout


class Request:
    """An item of a ``DeadlineQueue``: times out once, unless its outcome came first."""

    def __init__(self, name: str, deadline_ms: int, log: list[tuple[str, int]]) -> None:
        self.name = name
        self.deadline_ms = deadline_ms
        self.timeout_timer: Any = None
        self._log = log

    def on_timeout(self, timestamp_ms: int = 0) -> None:
        self._log.append((self.name, timestamp_ms))

    def complete(self) -> None:
        """What ``AttemptHandler.finish`` does with the timer of a request that has its outcome."""
        timer, self.timeout_timer = self.timeout_timer, None
        if timer is not None:
            timer.cancel()


def test_deadlines_fire_in_order_each_once_and_only_for_requests_still_waiting() -> None:
    env, log = Env(), []
    deadlines = DeadlineQueue(env.pts)
    requests = [Request(f"r{i}", 100 + 10 * (i // 2), log) for i in range(6)]  # two per deadline
    assert all(deadlines.add(r) for r in requests)
    requests[0].complete()
    requests[3].complete()
    assert len(deadlines) == 4
    env.pts.advance_to(110)
    env.run_mails()
    assert log == [("r1", 100), ("r2", 110)]
    env.pts.advance_to(1_000)
    env.run_mails()
    assert log == [("r1", 100), ("r2", 110), ("r4", 120), ("r5", 120)]
    assert len(deadlines) == 0 and deadlines.held == 0
    requests[5].complete()  # an outcome after the timeout fired: nothing to cancel
    assert len(deadlines) == 0


def test_a_deadline_earlier_than_the_last_is_refused_and_the_queue_is_unchanged() -> None:
    env, log = Env(), []
    deadlines = DeadlineQueue(env.pts)
    assert deadlines.add(Request("a", 50, log))
    late_restore = Request("b", 40, log)
    assert not deadlines.add(late_restore)
    assert late_restore.timeout_timer is None and len(deadlines) == 1
    assert deadlines.add(Request("c", 50, log))  # the same deadline keeps the order


def test_a_deadline_passed_long_ago_fires_from_its_own_timer_among_the_others() -> None:
    """One firing takes only what was due at its timer's time; the rest fire from the next
    timer, which a retry timer due in between precedes."""
    env, log = Env(), []
    deadlines = DeadlineQueue(env.pts)
    deadlines.add(Request("a", 10, log))
    deadlines.add(Request("b", 30, log))
    env.pts.register_timer(20, lambda ts: log.append(("retry", ts)))
    env.pts.advance_to(100)
    env.run_mails()
    assert log == [("a", 10), ("retry", 20), ("b", 30)]


def test_no_timer_is_left_once_every_request_has_its_outcome() -> None:
    env, log = Env(), []
    deadlines = DeadlineQueue(env.pts)
    requests = [Request(str(i), 100, log) for i in range(3)]
    for r in requests:
        deadlines.add(r)
    assert env.pts.pending() == 1  # one timer for all three
    for r in requests:
        r.complete()
    assert env.pts.pending() == 0 and deadlines.held == 0
    env.pts.advance_to(500)
    assert env.run_mails() == 0 and log == []


def test_a_request_that_hangs_does_not_keep_the_finished_ones_behind_it() -> None:
    env, log = Env(), []
    deadlines = DeadlineQueue(env.pts)
    stuck = Request("stuck", 30_000, log)
    deadlines.add(stuck)
    for i in range(10_000):
        r = Request(str(i), 30_000 + i, log)
        deadlines.add(r)
        r.complete()
    assert len(deadlines) == 1
    assert deadlines.held <= 2 * len(deadlines) + 65
    env.pts.advance_to(40_000)
    env.run_mails()
    assert log == [("stuck", 30_000)]
