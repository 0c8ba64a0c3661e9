"""MailboxProcessor: the loop of mails and default action, suspension, control mails, errors.

The synchronous loop runs on the test's thread (the mailbox thread); other threads put mails,
resume and report errors. The asyncio loop shares an event loop with coroutines. Every wait is
bounded, and a loop that would spin or hang fails the test instead (counters with a cap).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from actorflow.operators import (
    ActorflowError,
    DefaultActionController,
    Mail,
    MailboxProcessor,
    MailboxState,
    MailboxThreadError,
    Suspension,
    TaskMailbox,
)

WAIT_S = 5.0
CAP = 10_000  # a default action called this often means the loop spins


class CountingMailbox(TaskMailbox):
    """A mailbox that counts the loop's calls, and tells when the loop blocks in take()."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0
        self.batches = 0
        self.blocking = threading.Event()

    def take(self, *args: Any, **kwargs: Any):
        self.takes += 1
        if self.takes > CAP:
            raise AssertionError("the loop spins on take()")
        if not self.has_mail():
            self.blocking.set()
        return super().take(*args, **kwargs)

    def create_batch(self) -> bool:
        self.batches += 1
        if self.batches > CAP:
            raise AssertionError("the loop spins on create_batch()")
        return super().create_batch()


def start_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def joined(*threads: threading.Thread) -> bool:
    for t in threads:
        t.join(WAIT_S)
    return not any(t.is_alive() for t in threads)


# ------------------------------------------------------------------------------ the sync loop


def test_loop_alternates_a_batch_of_mails_and_one_default_action():
    log: list[str] = []
    processor: MailboxProcessor
    n = {"default": 0}

    def default_action(ctl):
        n["default"] += 1
        log.append(f"default{n['default']}")
        if n["default"] == 1:
            # Two mails now: both run in the next round's batch, before the next default action.
            processor.mailbox.put(Mail(lambda: log.append("m1"), 0, "m1"))
            processor.mailbox.put(Mail(lambda: log.append("m2"), 0, "m2"))
        elif n["default"] == 3:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.mailbox.put(Mail(lambda: log.append("m0"), 0, "m0"))
    processor.run_mailbox_loop()
    assert log == ["m0", "default1", "m1", "m2", "default2", "default3"]
    assert processor.is_completed


def test_all_actions_completed_from_the_default_action_ends_the_loop_for_good():
    calls = []

    def default_action(ctl):
        calls.append(1)
        ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.run_mailbox_loop()
    processor.run_mailbox_loop()  # a completed loop does not run again
    assert calls == [1]
    assert processor.step() is False


def test_a_mail_that_ends_the_loop_stops_the_rest_of_its_batch():
    log: list[str] = []
    processor = MailboxProcessor(lambda ctl: log.append("default"))
    processor.mailbox.put(Mail(lambda: (log.append("stop"), processor.all_actions_completed()), 0, "stop"))
    processor.mailbox.put(Mail(lambda: log.append("after"), 0, "after"))
    processor.run_mailbox_loop()
    assert log == ["stop"]
    assert names(processor.close()) == ["after"]


def names(mails: list[Mail]) -> list[str]:
    return [str(m) for m in mails]


def test_suspended_default_action_waits_without_spinning_until_another_thread_resumes():
    mailbox = CountingMailbox()
    state: dict[str, Any] = {"calls": 0, "suspension": None}
    suspended = threading.Event()

    def default_action(ctl):
        state["calls"] += 1
        if state["calls"] > CAP:
            raise AssertionError("the default action spins")
        if state["calls"] == 1:
            state["suspension"] = ctl.suspend_default_action()
            suspended.set()
        else:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action, mailbox)
    seen: dict[str, int] = {}

    def resumer() -> None:
        assert suspended.wait(WAIT_S)
        assert mailbox.blocking.wait(WAIT_S)  # the loop blocks in take()
        threading.Event().wait(0.05)  # a spinning loop would count up meanwhile
        seen.update(calls=state["calls"], takes=mailbox.takes, batches=mailbox.batches)
        state["suspension"].resume()

    t = start_thread(resumer)
    processor.run_mailbox_loop()
    assert joined(t)
    # While suspended: no default action, one blocking take(), one batch (the round's start).
    assert seen == {"calls": 1, "takes": 1, "batches": 2}
    assert state["calls"] == 2  # resumed, called once more, completed


def test_mails_run_while_the_default_action_is_suspended():
    log: list[str] = []
    state: dict[str, Any] = {"suspension": None}
    threads: list[threading.Thread] = []
    processor: MailboxProcessor

    def other() -> None:
        processor.mailbox.put(Mail(lambda: log.append("mail"), 0, "mail"))
        processor.mailbox.put(Mail(lambda: (log.append("resume"), state["suspension"].resume()), 0, "resume"))

    def default_action(ctl):
        log.append("default")
        if state["suspension"] is None:
            state["suspension"] = ctl.suspend_default_action()
            threads.append(start_thread(other))  # puts mails while the loop waits
        else:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.run_mailbox_loop()
    assert joined(*threads)
    assert log == ["default", "mail", "resume", "default"]


def test_resume_from_a_mail_on_the_mailbox_thread_wakes_the_loop():
    log: list[str] = []
    processor: MailboxProcessor

    def default_action(ctl):
        log.append("default")
        if len(log) == 1:
            suspension = ctl.suspend_default_action()
            processor.mailbox.put(Mail(suspension.resume, 0, "resume"))
        else:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.run_mailbox_loop()
    assert log == ["default", "default"]


def test_a_stale_suspension_does_not_resume_a_newer_one():
    processor = MailboxProcessor(lambda ctl: None)
    ctl = DefaultActionController(processor)
    first = ctl.suspend_default_action()
    assert ctl.suspend_default_action() is first  # suspending twice keeps one suspension
    first.resume()
    assert processor.is_default_action_available
    second = ctl.suspend_default_action()
    assert second is not first
    first.resume()  # stale: no effect
    assert not processor.is_default_action_available
    second.resume()
    assert processor.is_default_action_available


def test_suspend_from_another_thread_overtakes_queued_mails_and_the_loop_can_run_again():
    log: list[str] = []
    ready = threading.Event()
    go = threading.Event()
    state: dict[str, Any] = {"suspension": None}
    processor: MailboxProcessor

    def default_action(ctl):
        log.append("default")
        if state["suspension"] is None:
            state["suspension"] = ctl.suspend_default_action()
        else:
            ctl.all_actions_completed()

    processor = MailboxProcessor(default_action)

    def blocker() -> None:  # holds the loop inside a mail while the other thread puts
        ready.set()
        assert go.wait(WAIT_S)

    def other() -> None:
        assert ready.wait(WAIT_S)
        processor.mailbox.put(Mail(lambda: log.append("queued"), 0, "queued"))
        processor.suspend()
        go.set()

    processor.mailbox.put(Mail(blocker, 0, "blocker"))
    t = start_thread(other)
    processor.run_mailbox_loop()
    assert joined(t)
    # The loop left before the normal mail queued ahead of the suspend() control mail.
    assert log == ["default"]
    assert not processor.is_completed
    # Running again picks up where it stopped.
    state["suspension"].resume()
    processor.run_mailbox_loop()
    assert log == ["default", "queued", "default"]
    assert processor.is_completed


def test_all_actions_completed_from_another_thread_overtakes_a_queued_mail_which_never_runs():
    log: list[str] = []
    ready = threading.Event()
    go = threading.Event()
    processor: MailboxProcessor

    def default_action(ctl):
        log.append("default")
        ctl.suspend_default_action()

    processor = MailboxProcessor(default_action)

    def blocker() -> None:
        log.append("blocker")
        ready.set()
        assert go.wait(WAIT_S)

    def other() -> None:
        assert ready.wait(WAIT_S)
        processor.mailbox.put(Mail(lambda: log.append("too-late"), 0, "too-late"))
        processor.all_actions_completed()
        go.set()

    processor.mailbox.put(Mail(blocker, 0, "blocker"))
    t = start_thread(other)
    processor.run_mailbox_loop()
    assert joined(t)
    assert processor.is_completed
    assert log == ["blocker", "default"]
    dropped = processor.close()
    assert names(dropped) == ["too-late"]
    assert log == ["blocker", "default"]  # close() returns it without running it
    assert processor.mailbox.state is MailboxState.CLOSED


def test_report_throwable_from_another_thread_is_rethrown_by_the_loop_on_the_mailbox_thread():
    error = ValueError("lookup service is down")
    suspended = threading.Event()
    loop_thread = threading.get_ident()
    raised_on: list[int] = []

    def default_action(ctl):
        ctl.suspend_default_action()
        suspended.set()

    processor = MailboxProcessor(default_action)
    t = start_thread(lambda: suspended.wait(WAIT_S) and processor.report_throwable(error))
    with pytest.raises(ValueError) as info:
        try:
            processor.run_mailbox_loop()
        except ValueError:
            raised_on.append(threading.get_ident())
            raise
    assert joined(t)
    assert info.value is error
    assert raised_on == [loop_thread]


def test_report_throwable_overtakes_queued_mails():
    log: list[str] = []
    processor = MailboxProcessor(lambda ctl: log.append("default"))
    processor.mailbox.put(Mail(lambda: log.append("queued"), 0, "queued"))
    assert joined(start_thread(lambda: processor.report_throwable(KeyError("k"))))
    with pytest.raises(KeyError):
        processor.run_mailbox_loop()
    assert log == []


def test_a_mail_put_from_another_thread_wakes_a_suspended_loop():
    log: list[str] = []
    suspended = threading.Event()
    processor: MailboxProcessor

    def default_action(ctl):
        log.append("default")
        ctl.suspend_default_action()
        suspended.set()

    processor = MailboxProcessor(default_action)

    def other() -> None:
        assert suspended.wait(WAIT_S)
        processor.mailbox.put(Mail(lambda: log.append("mail"), 0, "mail"))
        processor.mailbox.put(Mail(processor.all_actions_completed, 0, "finish"))

    t = start_thread(other)
    processor.run_mailbox_loop()
    assert joined(t)
    assert log == ["default", "mail"]


@pytest.mark.parametrize(
    "method, call",
    [
        ("run_mailbox_loop", lambda p: p.run_mailbox_loop()),
        ("step", lambda p: p.step()),
    ],
)
def test_loop_methods_raise_on_another_thread(method, call):
    processor = MailboxProcessor(lambda ctl: None)
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            call(processor)
        except BaseException as error:  # noqa: BLE001
            box["error"] = error

    assert joined(start_thread(target))
    assert isinstance(box.get("error"), MailboxThreadError)
    assert method in str(box["error"])


# ------------------------------------------------------------------------------ step/idle


def test_step_runs_one_mail_or_else_one_default_action():
    log: list[str] = []
    state: dict[str, Any] = {"inputs": ["x", "y"], "suspension": None}

    def default_action(ctl):
        if state["inputs"]:
            log.append("default:" + state["inputs"].pop(0))
        else:
            state["suspension"] = ctl.suspend_default_action()

    processor = MailboxProcessor(default_action)
    mb = processor.mailbox
    mb.put(Mail(lambda: log.append("m1"), 0, "m1"))
    mb.put(Mail(lambda: log.append("m2"), 0, "m2"))

    assert processor.step() is True and log == ["m1"]  # mails first, one at a time
    assert processor.step() is True and log == ["m1", "m2"]
    assert processor.step() is True and log == ["m1", "m2", "default:x"]
    assert processor.step() is True and log == ["m1", "m2", "default:x", "default:y"]
    assert processor.step() is True  # the default action suspends itself
    assert not processor.is_default_action_available
    assert processor.step() is False  # idle: no mail, default action suspended
    mb.put(Mail(lambda: log.append("m3"), 0, "m3"))
    assert processor.step() is True and log[-1] == "m3"
    assert processor.step() is False


def test_run_until_idle_counts_its_steps_and_resume_makes_work_again():
    log: list[str] = []
    state: dict[str, Any] = {"inputs": [1, 2, 3], "suspension": None}

    def default_action(ctl):
        if state["inputs"]:
            log.append(state["inputs"].pop(0))
        else:
            state["suspension"] = ctl.suspend_default_action()

    processor = MailboxProcessor(default_action)
    assert processor.run_until_idle() == 4  # three inputs and the suspending call
    assert log == [1, 2, 3]
    assert processor.run_until_idle() == 0
    state["inputs"].append(4)
    state["suspension"].resume()  # on the mailbox thread: at once
    assert processor.run_until_idle() == 2
    assert log == [1, 2, 3, 4]


def test_run_until_idle_fails_when_the_default_action_never_suspends():
    processor = MailboxProcessor(lambda ctl: None)
    with pytest.raises(ActorflowError, match="not idle after 50 steps"):
        processor.run_until_idle(max_steps=50)


def test_step_runs_control_mails_and_stops_after_all_actions_completed():
    log: list[str] = []
    processor = MailboxProcessor(lambda ctl: log.append("default"))
    processor.mailbox.put(Mail(lambda: log.append("queued"), 0, "queued"))
    assert joined(start_thread(processor.all_actions_completed))
    assert processor.step() is True  # the urgent control mail runs first
    assert processor.is_completed
    assert processor.step() is False
    assert log == []
    assert names(processor.close()) == ["queued"]


def test_executor_of_a_processor_shares_its_mailbox():
    processor = MailboxProcessor(lambda ctl: ctl.suspend_default_action())
    seen: list[int] = []
    processor.executor(3).execute(seen.append, "x", 7)
    mail = processor.mailbox.try_take(3)
    assert mail is not None and mail.priority == 3
    mail.run()
    assert seen == [7]


# ---------------------------------------------------------------------------- the async loop


def run_async(coro, timeout_s: float = WAIT_S):
    async def main():
        return await asyncio.wait_for(coro(), timeout_s)

    return asyncio.run(main())


def test_async_loop_runs_mails_from_a_coroutine_and_from_another_thread():
    log: list[str] = []
    state: dict[str, Any] = {"suspension": None}

    async def main():
        def default_action(ctl):
            log.append("default")
            state["suspension"] = ctl.suspend_default_action()

        processor = MailboxProcessor(default_action)
        processor.mailbox.bind_to_current_thread()

        def finish():
            log.append("finish")
            processor.all_actions_completed()

        async def from_coroutine():
            await asyncio.sleep(0.01)  # the loop is waiting by now
            processor.mailbox.put(Mail(lambda: log.append("from-coroutine"), 0, "c"))
            await asyncio.sleep(0.01)
            t = threading.Thread(
                target=lambda: (
                    processor.mailbox.put(Mail(lambda: log.append("from-thread"), 0, "t")),
                    processor.mailbox.put(Mail(finish, 0, "finish")),
                ),
                daemon=True,
            )
            t.start()
            await asyncio.to_thread(t.join, WAIT_S)

        await asyncio.gather(processor.run_mailbox_loop_async(), from_coroutine())
        return processor

    processor = run_async(main)
    assert log == ["default", "from-coroutine", "from-thread", "finish"]
    assert processor.is_completed


def test_async_loop_is_woken_by_a_resume_from_a_coroutine_on_the_mailbox_thread():
    log: list[str] = []
    state: dict[str, Any] = {"suspension": None, "calls": 0}

    async def main():
        def default_action(ctl):
            state["calls"] += 1
            if state["calls"] > CAP:
                raise AssertionError("the default action spins while suspended")
            log.append(f"default{state['calls']}")
            if state["calls"] < 3:
                state["suspension"] = ctl.suspend_default_action()
            else:
                ctl.all_actions_completed()

        processor = MailboxProcessor(default_action)
        processor.mailbox.bind_to_current_thread()

        async def resumer():
            for i in range(2):
                while state["suspension"] is None:
                    await asyncio.sleep(0)
                suspension: Suspension = state["suspension"]
                state["suspension"] = None
                await asyncio.sleep(0.01)  # the loop waits on the event loop by now
                calls_while_suspended = state["calls"]
                log.append(f"resume{i + 1}")
                suspension.resume()  # no mail is put: only the wake-up can restart the loop
                assert calls_while_suspended == i + 1

        await asyncio.gather(processor.run_mailbox_loop_async(), resumer())
        return processor

    processor = run_async(main)
    assert log == ["default1", "resume1", "default2", "resume2", "default3"]
    assert processor.is_completed


def test_async_loop_is_woken_by_a_resume_from_another_thread():
    state: dict[str, Any] = {"calls": 0}

    async def main():
        suspended = threading.Event()

        def default_action(ctl):
            state["calls"] += 1
            if state["calls"] == 1:
                state["suspension"] = ctl.suspend_default_action()
                suspended.set()
            else:
                ctl.all_actions_completed()

        processor = MailboxProcessor(default_action)
        processor.mailbox.bind_to_current_thread()
        t = threading.Thread(target=lambda: suspended.wait(WAIT_S) and state["suspension"].resume(), daemon=True)
        t.start()
        await processor.run_mailbox_loop_async()
        await asyncio.to_thread(t.join, WAIT_S)
        return processor

    processor = run_async(main)
    assert state["calls"] == 2
    assert processor.is_completed


def test_coroutines_keep_running_while_the_async_loop_runs_the_default_action():
    state = {"ticks": 0, "calls": 0}

    async def main():
        def default_action(ctl):
            state["calls"] += 1
            if state["calls"] > CAP:
                raise AssertionError("the loop never gives way to the event loop")
            if state["ticks"] >= 5:
                ctl.all_actions_completed()

        processor = MailboxProcessor(default_action)
        processor.mailbox.bind_to_current_thread()

        async def ticker():
            while state["ticks"] < 5:
                state["ticks"] += 1
                await asyncio.sleep(0)

        await asyncio.gather(processor.run_mailbox_loop_async(), ticker())
        return processor

    processor = run_async(main)
    assert processor.is_completed
    assert state["ticks"] == 5
    assert state["calls"] <= 10  # one default action per yield to the event loop


def test_async_loop_rethrows_a_reported_error():
    async def main():
        suspended = threading.Event()

        def default_action(ctl):
            ctl.suspend_default_action()
            suspended.set()

        processor = MailboxProcessor(default_action)
        processor.mailbox.bind_to_current_thread()
        t = threading.Thread(
            target=lambda: suspended.wait(WAIT_S) and processor.report_throwable(RuntimeError("remote failure")),
            daemon=True,
        )
        t.start()
        try:
            await processor.run_mailbox_loop_async()
        finally:
            await asyncio.to_thread(t.join, WAIT_S)

    with pytest.raises(RuntimeError, match="remote failure"):
        run_async(main)


def test_async_loop_needs_the_mailbox_thread():
    processor = MailboxProcessor(lambda ctl: None)

    async def main():
        box: dict[str, BaseException] = {}

        def target() -> None:
            try:
                asyncio.run(processor.run_mailbox_loop_async())
            except BaseException as error:  # noqa: BLE001
                box["error"] = error

        t = threading.Thread(target=target, daemon=True)
        t.start()
        await asyncio.to_thread(t.join, WAIT_S)
        return box.get("error")

    assert isinstance(run_async(main), MailboxThreadError)


def test_a_suspended_async_loop_accepts_mails_from_other_threads_after_its_event_loop_closed():
    """A loop left with suspend() may run again later (on another event loop); meanwhile other
    threads keep putting mails, and a put must not fail because of the finished event loop."""
    log: list[str] = []
    processor: MailboxProcessor

    def default_action(ctl):
        log.append("default")
        processor.suspend()

    processor = MailboxProcessor(default_action)
    asyncio.run(processor.run_mailbox_loop_async())  # asyncio.run runs on this (the mailbox) thread
    assert log == ["default"]
    box: dict[str, BaseException] = {}

    def other() -> None:
        try:
            processor.mailbox.put(Mail(lambda: log.append("late mail"), 0, "late mail"))
        except BaseException as error:  # noqa: BLE001
            box["error"] = error

    assert joined(start_thread(other))
    assert "error" not in box, f"put() from another thread raised {box.get('error')!r}"
    assert names(processor.mailbox.drain()) == ["late mail"]
