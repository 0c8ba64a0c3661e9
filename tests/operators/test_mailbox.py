"""TaskMailbox: order, priorities, batches, yields, lifecycle and thread confinement.

Flink's ``TaskMailboxImpl`` / ``MailboxExecutorImpl`` semantics. Threads are real; every wait is
bounded (``Event.wait`` / ``join`` with a timeout), and no assertion depends on how long a wait
took.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from actorflow.operators import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    Mail,
    MailboxClosedError,
    MailboxExecutor,
    MailboxProcessor,
    MailboxState,
    MailboxStateError,
    MailboxThreadError,
    TaskMailbox,
)

WAIT_S = 5.0  # upper bound for every wait on another thread; never reached when things work


def logging_mail(log: list[str], name: str, priority: int = 0, *, deferrable: bool = False) -> Mail:
    return Mail(lambda: log.append(name), priority, name, deferrable=deferrable)


def names(mails: list[Mail]) -> list[str]:
    return [str(m) for m in mails]


def drain_by_try_take(mb: TaskMailbox, priority: int = MIN_PRIORITY) -> list[str]:
    out = []
    while (mail := mb.try_take(priority)) is not None:
        out.append(str(mail))
    return out


def run_in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a fresh thread; return what it returned or the exception it raised."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            box["error"] = error

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive(), "the helper thread did not finish"
    return box.get("error", box.get("result"))


# --------------------------------------------------------------------------- order and priority


def test_put_is_fifo():
    mb = TaskMailbox()
    for name in "abcde":
        mb.put(Mail(lambda: None, 0, name))
    assert drain_by_try_take(mb) == list("abcde")
    assert mb.try_take() is None


def test_put_first_goes_to_the_front():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "a"))
    mb.put(Mail(lambda: None, 0, "b"))
    mb.put_first(Mail(lambda: None, 0, "urgent"))
    assert drain_by_try_take(mb) == ["urgent", "a", "b"]


def test_put_first_from_the_mailbox_thread_overtakes_the_current_batch():
    mb = TaskMailbox()
    for name in ("a", "b", "c"):
        mb.put(Mail(lambda: None, 0, name))
    assert mb.create_batch()
    assert str(mb.try_take_from_batch()) == "a"
    mb.put(Mail(lambda: None, 0, "after-batch"))  # lands behind the batch
    mb.put_first(Mail(lambda: None, 0, "urgent"))  # from the mailbox thread: ahead of "b"
    assert drain_by_try_take(mb) == ["urgent", "b", "c", "after-batch"]


def test_put_first_from_another_thread_goes_ahead_of_queued_mails():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "a"))
    assert run_in_thread(lambda: mb.put_first(Mail(lambda: None, 0, "urgent"))) is None
    assert drain_by_try_take(mb) == ["urgent", "a"]


@pytest.mark.parametrize(
    "queued, priority, taken, left",
    [
        # the first mail of at least the priority, not the highest one
        ([("a", 0), ("b", 3), ("c", 5)], 3, "b", ["a", "c"]),
        # a higher mail qualifies for a lower request: FIFO among the eligible
        ([("a", 5), ("b", 1)], 1, "a", ["b"]),
        # MIN_PRIORITY takes anything, the head first
        ([("a", 0), ("b", 9)], MIN_PRIORITY, "a", ["b"]),
        # nothing high enough: None, and nothing is removed
        ([("a", 0), ("b", 1)], 2, None, ["a", "b"]),
        # an empty mailbox: None at once
        ([], MIN_PRIORITY, None, []),
        # control mails sit at the top priority
        ([("a", 0), ("ctl", MAX_PRIORITY)], MAX_PRIORITY, "ctl", ["a"]),
    ],
)
def test_try_take_returns_the_first_mail_of_at_least_the_priority(queued, priority, taken, left):
    mb = TaskMailbox()
    for name, p in queued:
        mb.put(Mail(lambda: None, p, name))
    mail = mb.try_take(priority)
    assert (None if mail is None else str(mail)) == taken
    assert drain_by_try_take(mb) == left


def test_take_with_priority_skips_lower_mails_and_leaves_them():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "low"))
    mb.put(Mail(lambda: None, 2, "high"))
    assert str(mb.take(1)) == "high"
    assert mb.size() == 1
    assert str(mb.take()) == "low"


def test_take_searches_the_batch_before_the_queue():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 1, "batched-high"))
    mb.create_batch()
    mb.put(Mail(lambda: None, 1, "queued-high"))
    assert str(mb.take(1)) == "batched-high"
    assert str(mb.take(1)) == "queued-high"


def test_take_with_a_timeout_returns_none_when_nothing_arrives():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "low"))
    assert mb.take(1, timeout_s=0.01) is None
    assert mb.size() == 1


def test_take_blocks_until_another_thread_puts():
    mb = TaskMailbox()
    about_to_take = threading.Event()

    def producer() -> None:
        assert about_to_take.wait(WAIT_S)
        threading.Event().wait(0.02)  # give take() the chance to block first
        mb.put(Mail(lambda: None, 0, "from-producer"))

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    assert mb.try_take() is None
    about_to_take.set()
    mail = mb.take(timeout_s=WAIT_S)
    t.join(WAIT_S)
    assert not t.is_alive()
    assert mail is not None and str(mail) == "from-producer"


def test_take_with_priority_is_not_woken_by_a_lower_mail():
    mb = TaskMailbox()
    about_to_take = threading.Event()

    def producer() -> None:
        assert about_to_take.wait(WAIT_S)
        mb.put(Mail(lambda: None, 0, "low"))
        threading.Event().wait(0.02)
        mb.put(Mail(lambda: None, 5, "high"))

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    about_to_take.set()
    mail = mb.take(5, timeout_s=WAIT_S)
    t.join(WAIT_S)
    assert str(mail) == "high"
    assert drain_by_try_take(mb) == ["low"]


def test_size_and_has_mail_count_the_batch_and_the_queue():
    mb = TaskMailbox()
    assert (mb.size(), mb.has_mail()) == (0, False)
    mb.put(Mail(lambda: None, 0, "a"))
    mb.create_batch()
    mb.put(Mail(lambda: None, 0, "b"))
    assert (mb.size(), mb.has_mail()) == (2, True)


def test_mail_runs_its_action_with_its_args_and_describes_itself():
    seen = []
    mail = Mail(lambda x, y: seen.append((x, y)), 0, "", args=(1, 2))
    mail.run()
    assert seen == [(1, 2)]
    assert str(Mail(lambda: None, 0, "flush")) == "flush"


# ------------------------------------------------------------------------------------ batches


def test_create_batch_moves_queued_mails_and_later_puts_stay_behind():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "a"))
    mb.put(Mail(lambda: None, 0, "b"))
    assert mb.create_batch() is True
    mb.put(Mail(lambda: None, 0, "c"))
    # The batch holds exactly a and b; c waits for the next batch.
    assert str(mb.try_take_from_batch()) == "a"
    assert str(mb.try_take_from_batch()) == "b"
    assert mb.try_take_from_batch() is None
    assert mb.size() == 1
    assert mb.create_batch() is True
    assert str(mb.try_take_from_batch()) == "c"
    assert mb.create_batch() is False


def test_a_mail_that_reenqueues_itself_lands_after_the_batch():
    mb = TaskMailbox()
    log: list[str] = []

    def again() -> None:
        log.append("again")
        mb.put(Mail(again, 0, "again"))

    mb.put(Mail(again, 0, "again"))
    mb.put(logging_mail(log, "other"))
    mb.create_batch()
    while (mail := mb.try_take_from_batch()) is not None:
        mail.run()
    # One round ran each batched mail once; the re-enqueued copy waits for the next round.
    assert log == ["again", "other"]
    assert mb.size() == 1


def test_a_self_reenqueuing_mail_does_not_starve_the_default_action():
    log: list[str] = []
    rounds = 4
    processor: MailboxProcessor

    def again() -> None:
        log.append("mail")
        if log.count("mail") > 1_000:
            raise AssertionError("the default action is starved by a self-re-enqueuing mail")
        processor.mailbox.put(Mail(again, 0, "again"))

    def default_action(ctl):
        log.append("default")
        if log.count("default") == rounds:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.mailbox.put(Mail(again, 0, "again"))
    processor.run_mailbox_loop()
    assert log == ["mail", "default"] * rounds
    assert processor.is_completed


# ------------------------------------------------------------------------- executor and yield


@pytest.mark.parametrize(
    "executor_priority, queued, ran",
    [
        # a priority-0 executor runs normal mails, in order, skipping the deferrable one
        (0, [("a", 0, False), ("flush", 0, True), ("b", 0, False)], ["a", "b"]),
        # a priority-1 executor never runs a priority-0 mail
        (1, [("low", 0, False), ("high", 1, False), ("higher", 2, False)], ["high", "higher"]),
        # a deferrable mail is skipped even when its priority is high enough
        (1, [("deferred", 5, True), ("low", 0, False)], []),
        # control mails (top priority) run in every yield
        (3, [("ctl", MAX_PRIORITY, False), ("normal", 0, False)], ["ctl"]),
    ],
)
def test_try_yield_runs_only_eligible_mails(executor_priority, queued, ran):
    mb = TaskMailbox()
    log: list[str] = []
    for name, priority, deferrable in queued:
        mb.put(logging_mail(log, name, priority, deferrable=deferrable))
    ex = MailboxExecutor(mb, priority=executor_priority)
    results = []
    while ex.try_yield():
        results.append(True)
    assert log == ran
    assert len(results) == len(ran)
    # What was skipped is still there, in order, for the main loop.
    left = [name for name, _, _ in queued if name not in ran]
    assert drain_by_try_take(mb) == left


def test_try_yield_returns_false_when_nothing_is_eligible():
    mb = TaskMailbox()
    ex = MailboxExecutor(mb, priority=0)
    assert ex.try_yield() is False
    mb.put(Mail(lambda: None, 0, "deferred", deferrable=True))
    assert ex.try_yield() is False
    assert mb.size() == 1


def test_yield_runs_the_first_eligible_mail_and_skips_deferrable_ones():
    mb = TaskMailbox()
    log: list[str] = []
    mb.put(logging_mail(log, "deferred", priority=1, deferrable=True))  # high enough, but deferrable
    mb.put(logging_mail(log, "low", priority=0))
    mb.put(logging_mail(log, "normal", priority=1))
    MailboxExecutor(mb, priority=1).yield_()
    assert log == ["normal"]
    assert drain_by_try_take(mb) == ["deferred", "low"]


def test_yield_waits_for_an_eligible_mail_and_never_runs_a_lower_one():
    mb = TaskMailbox()
    log: list[str] = []
    mb.put(logging_mail(log, "low", priority=0))
    about_to_yield = threading.Event()

    def producer() -> None:
        assert about_to_yield.wait(WAIT_S)
        threading.Event().wait(0.02)
        mb.put(logging_mail(log, "also-low", priority=0))
        mb.put(logging_mail(log, "eligible", priority=2))

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    about_to_yield.set()
    MailboxExecutor(mb, priority=2).yield_()
    t.join(WAIT_S)
    assert log == ["eligible"]
    assert drain_by_try_take(mb) == ["low", "also-low"]


def test_execute_puts_a_mail_of_the_executors_priority_with_args():
    mb = TaskMailbox()
    seen: list[Any] = []
    MailboxExecutor(mb, priority=4).execute(seen.append, "append x", "x")
    assert mb.try_take(5) is None
    mail = mb.try_take(4)
    assert (mail.priority, str(mail), mail.deferrable) == (4, "append x", False)
    mail.run()
    assert seen == ["x"]


def test_execute_from_another_thread_is_accepted():
    mb = TaskMailbox()
    ex = MailboxExecutor(mb)
    seen: list[str] = []
    assert run_in_thread(lambda: ex.execute(seen.append, "", "from-thread")) is None
    assert ex.try_yield() is True
    assert seen == ["from-thread"]


# ---------------------------------------------------------------------------------- lifecycle


def test_lifecycle_open_quiesced_closed():
    mb = TaskMailbox()
    log: list[str] = []
    assert mb.state is MailboxState.OPEN
    mb.put(logging_mail(log, "a"))
    mb.put(logging_mail(log, "b"))
    mb.put(logging_mail(log, "c"))

    mb.quiesce()
    assert mb.state is MailboxState.QUIESCED
    with pytest.raises(MailboxClosedError, match="QUIESCED"):
        mb.put(logging_mail(log, "rejected"))
    with pytest.raises(MailboxClosedError, match="QUIESCED"):
        mb.put_first(logging_mail(log, "rejected-urgent"))
    # A quiesced mailbox still hands out what it holds.
    assert str(mb.take()) == "a"
    assert str(mb.try_take()) == "b"

    dropped = mb.close()
    assert mb.state is MailboxState.CLOSED
    assert names(dropped) == ["c"]
    assert log == []  # nothing ran: take() hands mails out, it does not run them
    with pytest.raises(MailboxStateError, match="CLOSED"):
        mb.take()
    with pytest.raises(MailboxStateError, match="CLOSED"):
        mb.try_take()
    with pytest.raises(MailboxClosedError, match="CLOSED"):
        mb.put(logging_mail(log, "late"))
    assert mb.create_batch() is False
    assert mb.close() == []


def test_close_returns_batched_and_queued_mails_none_of_which_ran():
    mb = TaskMailbox()
    log: list[str] = []
    mb.put(logging_mail(log, "batched"))
    mb.create_batch()
    mb.put(logging_mail(log, "queued"))
    dropped = mb.close()
    assert names(dropped) == ["batched", "queued"]
    assert log == []
    assert mb.size() == 0


def test_quiesce_is_a_no_op_on_a_closed_mailbox():
    mb = TaskMailbox()
    mb.close()
    mb.quiesce()
    assert mb.state is MailboxState.CLOSED


def test_put_from_another_thread_after_quiesce_raises_there():
    mb = TaskMailbox()
    mb.quiesce()
    error = run_in_thread(lambda: mb.put(Mail(lambda: None, 0, "x")))
    assert isinstance(error, MailboxClosedError)
    assert "QUIESCED" in str(error)


def test_drain_removes_every_mail_without_running_it():
    mb = TaskMailbox()
    log: list[str] = []
    mb.put(logging_mail(log, "a"))
    mb.create_batch()
    mb.put(logging_mail(log, "b"))
    assert names(mb.drain()) == ["a", "b"]
    assert log == [] and mb.size() == 0
    assert mb.state is MailboxState.OPEN


# ------------------------------------------------------------------------ thread confinement


@pytest.mark.parametrize(
    "method, call",
    [
        ("take", lambda mb: mb.take(timeout_s=0.01)),
        ("try_take", lambda mb: mb.try_take()),
        ("create_batch", lambda mb: mb.create_batch()),
        ("try_take_from_batch", lambda mb: mb.try_take_from_batch()),
        ("quiesce", lambda mb: mb.quiesce()),
        ("close", lambda mb: mb.close()),
        ("drain", lambda mb: mb.drain()),
    ],
)
def test_mailbox_thread_methods_raise_on_another_thread(method, call):
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "a"))
    error = run_in_thread(lambda: call(mb))
    assert isinstance(error, MailboxThreadError)
    assert method in str(error)
    # Nothing changed: the mail is still there, the mailbox still open.
    assert (mb.size(), mb.state) == (1, MailboxState.OPEN)


def test_bind_to_current_thread_moves_the_mailbox_thread():
    mb = TaskMailbox()
    mb.put(Mail(lambda: None, 0, "a"))

    def bind_and_take() -> str:
        mb.bind_to_current_thread()
        return str(mb.try_take())

    assert run_in_thread(bind_and_take) == "a"
    assert mb.is_mailbox_thread() is False
    with pytest.raises(MailboxThreadError):
        mb.try_take()


def test_puts_from_many_threads_are_all_delivered_in_per_thread_order():
    mb = TaskMailbox()
    threads_n, puts_n = 8, 400
    start = threading.Barrier(threads_n)

    def producer(tid: int) -> None:
        start.wait(WAIT_S)
        for i in range(puts_n):
            mail = Mail(lambda: None, 0, f"{tid}:{i}", args=(tid, i))
            if i % 50 == 0:
                mb.put_first(mail)  # urgent mails from other threads are not lost either
            else:
                mb.put(mail)

    threads = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)

    taken = []
    while (mail := mb.try_take()) is not None:
        taken.append(mail.args)
    assert sorted(taken) == [(t, i) for t in range(threads_n) for i in range(puts_n)]
    # put() keeps each producer's order (urgent ones aside).
    for tid in range(threads_n):
        normal = [i for t, i in taken if t == tid and i % 50 != 0]
        assert normal == sorted(normal)


def test_listeners_hear_every_put_from_the_putting_thread():
    mb = TaskMailbox()
    heard: list[bool] = []
    mb.add_listener(lambda: heard.append(mb.is_mailbox_thread()))
    mb.put(Mail(lambda: None))
    mb.put_first(Mail(lambda: None))
    run_in_thread(lambda: mb.put(Mail(lambda: None)))
    assert heard == [True, True, False]
