"""Per-operator executors in a chain, futures from submit(), exclusive sections, the end of the loop.

Flink's ``MailboxExecutorImpl`` / ``TaskMailboxImpl`` / ``MailboxProcessor`` semantics. Threads are
real where the contract is about threads; every wait is bounded.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from typing import Any

import pytest

from actorflow.operators import (
    MIN_PRIORITY,
    Mail,
    MailboxExecutor,
    MailboxProcessor,
    MailboxState,
    MailboxThreadError,
    OperatorHarness,
    Record,
    StreamOperator,
    TaskMailbox,
)
from actorflow.operators.mailbox_processor import CoalescingInbox

WAIT_S = 5.0


from .test_mailbox import run_in_thread  # noqa: E402 - one helper for both mailbox test files


# ------------------------------------------------------------------ one executor per operator


class Yielding(StreamOperator):
    """Puts a mail of its own for every record, forwards the record, then yields (or not)."""

    def __init__(self, tag: str, log: list[str], *, yields: bool) -> None:
        self.tag = tag
        self.log = log
        self.yields = yields

    def process_element(self, record: Record) -> None:
        self.context.mailbox_executor.execute(lambda: self.log.append(f"{self.tag}-mail"), f"{self.tag} mail")
        self.output.collect(record)
        if self.yields:
            while self.context.mailbox_executor.try_yield():
                pass
            self.log.append(f"{self.tag}-yielded")


def test_a_downstream_operators_yield_never_runs_an_upstream_operators_mail():
    log: list[str] = []
    h = OperatorHarness([Yielding("up", log, yields=True), Yielding("down", log, yields=True)])
    h.process_element("x", timestamp_ms=1)
    # "down" runs inside "up"'s process_element: its yield runs its own mail, not "up"'s.
    assert log == ["down-mail", "down-yielded", "up-mail", "up-yielded"]
    assert h.output == [Record("x", 1)]


def test_an_upstream_operators_yield_may_run_a_downstream_operators_mail():
    log: list[str] = []
    h = OperatorHarness([Yielding("up", log, yields=True), Yielding("down", log, yields=False)])
    h.process_element("x", timestamp_ms=1)
    assert log == ["up-mail", "down-mail", "up-yielded"]


def test_each_operator_of_a_chain_gets_the_executor_of_its_position():
    ops = [StreamOperator(), StreamOperator(), StreamOperator()]
    OperatorHarness(ops)
    assert [op.context.mailbox_executor.priority for op in ops] == [0, 1, 2]


def test_timers_of_a_downstream_operator_fire_as_mails_of_its_priority():
    fired: list[str] = []

    class Timed(StreamOperator):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def open(self) -> None:
            self.context.processing_time.register_timer(10, lambda ts: fired.append(self.tag))

    h = OperatorHarness([Timed("up"), Timed("down")], auto_run=False)
    h.open()
    h.processing_time.advance_to(10)
    # Only the downstream timer qualifies for a yield at the downstream operator's priority.
    mail = h.processor.mailbox.try_take(1)
    assert mail is not None
    mail.run()
    assert fired == ["down"]
    h.run_until_idle()
    assert fired == ["down", "up"]


# ------------------------------------------------------------------------- submit() futures


def test_submit_returns_a_future_with_the_mails_result():
    mb = TaskMailbox()
    ex = MailboxExecutor(mb, priority=0)
    future = ex.submit(lambda a, b: a * b, "multiply", 6, 7)
    assert not future.done()
    assert ex.try_yield()
    assert future.result(timeout=0) == 42


def test_submit_hands_the_exception_to_the_future_and_the_loop_goes_on():
    log: list[str] = []
    processor = MailboxProcessor(lambda ctl: ctl.all_actions_completed())
    ex = processor.executor(0)

    def boom() -> None:
        raise KeyError("missing")

    future = ex.submit(boom, "boom")
    ex.execute(lambda: log.append("after"), "after")
    processor.run_mailbox_loop()  # does not raise
    assert isinstance(future.exception(timeout=0), KeyError)
    assert log == ["after"]


def test_execute_still_fails_the_loop_on_an_exception():
    processor = MailboxProcessor(lambda ctl: ctl.all_actions_completed())

    def boom() -> None:
        raise KeyError("missing")

    processor.executor(0).execute(boom, "boom")
    with pytest.raises(KeyError):
        processor.run_mailbox_loop()


def test_futures_of_mails_dropped_by_close_are_cancelled():
    processor = MailboxProcessor(lambda ctl: None)
    ex = processor.executor(0)
    ran: list[str] = []
    future = ex.submit(lambda: ran.append("never"), "dropped")
    dropped = processor.close()
    assert [str(m) for m in dropped] == ["dropped"]
    assert future.cancelled()
    with pytest.raises(CancelledError):
        future.result(timeout=0)
    assert ran == []


# ------------------------------------------------------------------------ run_exclusively


def test_run_exclusively_is_reentrant_and_returns_the_result():
    mb = TaskMailbox()

    def inner() -> str:
        mb.put(Mail(lambda: None, 0, "a"))  # a put inside the exclusive section works
        return mb.run_exclusively(lambda: "nested")

    # On a helper thread, so that a deadlock fails the test instead of hanging it.
    assert run_in_thread(lambda: mb.run_exclusively(inner)) == "nested"
    assert mb.size() == 1


def test_run_exclusively_holds_off_puts_from_other_threads():
    mb = TaskMailbox()
    seen: list[int] = []
    put_done = threading.Event()

    def other() -> None:
        mb.put(Mail(lambda: None, 0, "b"))
        put_done.set()

    def section() -> None:
        t = threading.Thread(target=other, daemon=True)
        t.start()
        # The other thread cannot put while this section runs: the size is stable.
        assert not put_done.wait(0.05)
        seen.append(mb.size())

    mb.run_exclusively(section)
    assert put_done.wait(WAIT_S)
    assert seen == [0] and mb.size() == 1


# ------------------------------------------------------------------------ end of the loop


def test_drain_runs_the_mails_that_are_left_in_order():
    log: list[str] = []
    processor = MailboxProcessor(lambda ctl: ctl.all_actions_completed())
    processor.run_mailbox_loop()
    ex = processor.executor(0)
    ex.execute(lambda: log.append("a"), "a")
    processor.mailbox.create_batch()
    ex.execute(lambda: log.append("b"), "b")
    drained = processor.drain()
    assert log == ["a", "b"] and [str(m) for m in drained] == ["a", "b"]
    assert processor.mailbox.size() == 0


@pytest.mark.parametrize("end", ["quiesce", "close"])
@pytest.mark.parametrize("poison", ["suspend", "all_actions_completed"])
def test_a_poison_mail_sent_after_the_mailbox_stopped_taking_mails_is_skipped_quietly(end, poison):
    processor = MailboxProcessor(lambda ctl: None)
    getattr(processor, end)()
    assert run_in_thread(getattr(processor, poison)) is None  # no MailboxClosedError
    if end == "quiesce":
        assert processor.mailbox.size() == 0


def test_resuming_a_suspension_after_close_is_ignored():
    suspensions = []

    def default_action(ctl):
        suspensions.append(ctl.suspend_default_action())
        ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.run_mailbox_loop()
    processor.close()
    assert run_in_thread(suspensions[0].resume) is None
    assert processor.mailbox.state is MailboxState.CLOSED


def test_close_from_another_thread_changes_nothing_before_it_raises():
    log: list[str] = []
    errors: list[Any] = []
    processor = MailboxProcessor(lambda ctl: ctl.all_actions_completed())
    ex = processor.executor(0)
    ex.execute(lambda: errors.append(run_in_thread(processor.close)), "close from another thread")
    ex.execute(lambda: log.append("still running"), "next")
    processor.run_mailbox_loop()
    assert isinstance(errors[0], MailboxThreadError)
    # The failed close did not stop the loop: the rest of the batch ran.
    assert log == ["still running"]
    assert processor.mailbox.state is MailboxState.OPEN


# --------------------------------------------------------------------------- deferrable mails


@pytest.mark.parametrize(
    "priority, taken",
    [
        (0, "normal"),  # the deferrable mail ranks below priority 0, whatever its own priority
        (5, None),  # even at its own priority
        (MIN_PRIORITY, "deferred"),  # only the main loop's take gets it (FIFO among the eligible)
    ],
)
def test_take_treats_a_deferrable_mail_as_the_lowest_priority(priority, taken):
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 5, "deferred", deferrable=True))
    mb.put(Mail(lambda: None, 0, "normal"))
    mail = mb.try_take(priority)
    assert (None if mail is None else str(mail)) == taken
    mb.put(Mail(lambda: None, 5, "deferred-2", deferrable=True))
    mail = mb.take(1, timeout_s=0.01)
    assert mail is None


# ------------------------------------------------------------------ completions that share a mail


def _run_all(mailbox: TaskMailbox) -> int:
    n = 0
    while (mail := mailbox.try_take(0)) is not None:
        mail.run()
        n += 1
    return n


def test_an_inbox_runs_every_call_once_in_arrival_order_a_burst_in_one_mail() -> None:
    mailbox = TaskMailbox()
    inbox = CoalescingInbox(MailboxExecutor(mailbox), "results", per_mail=100)
    seen: list[int] = []
    for i in range(10):
        inbox.put(seen.append, i)
    assert mailbox.size() == 1
    assert _run_all(mailbox) == 1 and seen == list(range(10))
    inbox.put(seen.append, 10)  # a new burst gets a new mail
    assert _run_all(mailbox) == 1 and seen == list(range(11))


def test_an_inbox_runs_at_most_per_mail_calls_and_lets_other_mails_run_in_between() -> None:
    mailbox = TaskMailbox()
    executor = MailboxExecutor(mailbox)
    inbox = CoalescingInbox(executor, "results", per_mail=2)
    seen: list[str] = []
    for x in "abcde":
        inbox.put(seen.append, x)
    executor.execute(seen.append, "timer", "T")
    mailbox.try_take(0).run()
    mailbox.try_take(0).run()  # the timer's mail was put before the inbox's second mail
    assert seen == ["a", "b", "T"]
    assert _run_all(mailbox) == 2 and seen == ["a", "b", "T", "c", "d", "e"]


def test_a_call_put_while_the_inbox_runs_waits_for_the_next_mail() -> None:
    mailbox = TaskMailbox()
    inbox = CoalescingInbox(MailboxExecutor(mailbox), "results")
    seen: list[str] = []

    def first() -> None:
        seen.append("first")
        inbox.put(seen.append, "put while running")

    inbox.put(first)
    inbox.put(seen.append, "second")
    mailbox.try_take(0).run()
    assert seen == ["first", "second"]
    assert _run_all(mailbox) == 1 and seen == ["first", "second", "put while running"]


def test_an_inbox_loses_no_call_put_from_many_threads_at_once() -> None:
    mailbox = TaskMailbox()
    inbox = CoalescingInbox(MailboxExecutor(mailbox), "results", per_mail=7)
    seen: list[tuple[int, int]] = []
    start = threading.Barrier(4)

    def producer(t: int) -> None:
        start.wait(WAIT_S)
        for i in range(2_000):
            inbox.put(seen.append, (t, i))

    threads = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or mailbox.has_mail():
        _run_all(mailbox)  # this thread is the mailbox thread, running mails while they put
    for t in threads:
        t.join(WAIT_S)
    _run_all(mailbox)
    assert sorted(seen) == [(t, i) for t in range(4) for i in range(2_000)]
    for t in range(4):  # each thread's calls ran in the order it put them
        assert [i for u, i in seen if u == t] == list(range(2_000))


def test_an_inbox_drops_its_calls_quietly_once_the_mailbox_takes_no_more() -> None:
    mailbox = TaskMailbox()
    inbox = CoalescingInbox(MailboxExecutor(mailbox), "results")
    seen: list[int] = []
    mailbox.quiesce()
    inbox.put(seen.append, 1)  # no error in the thread that delivers a late completion
    assert mailbox.size() == 0 and seen == []
