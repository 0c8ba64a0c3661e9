"""The mailbox loop: mails and the operator's default action, on one thread.

``MailboxProcessor`` alternates between the mails in the mailbox and a *default action* (for an
operator: process the next input). ``MailboxExecutor`` is the handle other code uses to put mails
and to yield.

Threading model
    * ``run_mailbox_loop``, ``run_mailbox_loop_async``, ``step``, ``run_until_idle``, ``drain``,
      ``close`` and ``quiesce`` run on the mailbox thread; they check the thread before they
      change anything.
    * ``suspend``, ``all_actions_completed``, ``report_throwable``, a suspension's ``resume``,
      ``MailboxExecutor.execute`` and ``MailboxExecutor.submit`` may be called from any thread:
      they travel as (urgent) mails.
    * ``MailboxExecutor.yield_`` and ``try_yield`` run on the mailbox thread, inside a mail or
      the default action.

Lifecycle
    The loop runs until ``all_actions_completed()`` or ``suspend()``; a suspended loop can run
    again. ``drain()`` runs the mails left at the end. ``close()`` closes the mailbox and returns
    the mails that never ran. A ``suspend()`` or ``all_actions_completed()`` sent once the
    mailbox no longer takes mails is dropped (the loop is over anyway), and so is a ``resume()``.

Executors and chains
    Each operator of a chain gets ``executor(i)``, ``i`` its position: a yield of operator ``i``
    runs only mails of operators ``i`` and after, so a downstream operator never runs an upstream
    one's mail in the middle of its own processing, while an upstream one may let the downstream
    ones make room.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from .errors import ActorflowError, MailboxThreadError
from .mailbox import MAX_PRIORITY, MIN_PRIORITY, Mail, TaskMailbox

__all__ = ["CoalescingInbox", "DefaultActionController", "MailboxExecutor", "MailboxProcessor", "Suspension"]


class MailboxExecutor:
    """Puts mails of one priority, and runs other mails while waiting (``yield_``).

    An executor of priority ``p`` never runs a mail of lower priority in its yields, and never a
    deferrable one.

    >>> mb = TaskMailbox(); ex = MailboxExecutor(mb, priority=0)
    >>> seen = []
    >>> ex.execute(seen.append, "record a", "a")
    >>> ex.try_yield(), seen
    (True, ['a'])
    """

    def __init__(self, mailbox: TaskMailbox, priority: int = 0) -> None:
        self._mailbox = mailbox
        self.priority = priority

    def execute(
        self, action: Callable[..., Any], description: str = "", *args: Any, deferrable: bool = False
    ) -> None:
        """Run ``action(*args)`` later, on the mailbox thread. Callable from any thread.

        An exception the action raises fails the mailbox loop.
        """
        self._mailbox.put(Mail(action, self.priority, description, args, deferrable))

    def execute_if_open(self, action: Callable[..., Any], description: str = "", *args: Any) -> bool:
        """Like ``execute``, but a mailbox that no longer takes mails drops it quietly (False).

        For results and timers that arrive from other threads while the task stops.
        """
        return self._mailbox.put_if_open(Mail(action, self.priority, description, args, False))

    def submit(
        self, action: Callable[..., Any], description: str = "", *args: Any, deferrable: bool = False
    ) -> "Future[Any]":
        """Like ``execute``, but the returned future carries the result or the exception.

        The exception does not fail the loop: whoever holds the future decides. The future of a
        mail that ``close()`` drops is cancelled.

        >>> mb = TaskMailbox(); ex = MailboxExecutor(mb)
        >>> f = ex.submit(lambda a, b: a + b, "add", 1, 2)
        >>> ex.try_yield(), f.result(timeout=0)
        (True, 3)
        """
        future: Future[Any] = Future()

        def run(*call_args: Any) -> None:
            if not future.set_running_or_notify_cancel():
                return  # cancelled while it waited
            try:
                result = action(*call_args)
            except BaseException as error:  # handed to the future's holder, not the loop
                future.set_exception(error)
            else:
                future.set_result(result)

        self._mailbox.put(Mail(run, self.priority, description or _describe(action), args, deferrable, future))
        return future

    def yield_(self) -> None:
        """Run the next eligible mail, waiting for one to arrive. Mailbox thread only."""
        mail = self._mailbox.take(self.priority, include_deferrable=False)
        if mail is not None:
            mail.run()

    def try_yield(self) -> bool:
        """Run the next eligible mail if there is one; True if a mail ran."""
        mail = self._mailbox.try_take(self.priority, include_deferrable=False)
        if mail is None:
            return False
        mail.run()
        return True

    def is_mailbox_thread(self) -> bool:
        return self._mailbox.is_mailbox_thread()


class CoalescingInbox:
    """Calls from any thread, run on the mailbox thread in arrival order, one mail per burst.

    Each ``put`` costs a deque append; the first of a burst also puts one mail, which runs at
    most ``per_mail`` of the calls waiting and puts the next mail if more are left. For the
    completions of many small requests, where a mail per completion costs more than the
    completion itself. Like ``execute_if_open``, a mailbox that no longer takes mails drops them.

    ``after``, if given, runs at the end of each mail, once its calls have run: what a burst of
    completions leads to (emitting the results they let out) is then done once for the burst,
    not once per call. ``running`` is True while a mail's calls run, for a call that leaves its
    consequences to ``after``. A call that raises fails the mail; ``after`` does not run then.

    >>> mb = TaskMailbox(); inbox = CoalescingInbox(MailboxExecutor(mb), "results", per_mail=2)
    >>> seen = []
    >>> for x in "abc": inbox.put(seen.append, x)
    >>> mb.size(), mb.try_take(0).run(), seen, mb.size()
    (1, None, ['a', 'b'], 1)
    """

    __slots__ = ("_executor", "_description", "_per_mail", "_calls", "_posted", "_after", "running")

    def __init__(
        self, executor: MailboxExecutor, description: str, per_mail: int = 64, after: Callable[[], None] | None = None,
    ) -> None:
        if per_mail < 1:
            raise ValueError(f"per_mail must be >= 1, got {per_mail}")
        self._executor = executor
        self._description = description
        self._per_mail = per_mail
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        # A mail is on its way. Two threads may both see it unset and put one each: the second
        # finds nothing left to run. The append comes first, so no call is ever left behind.
        self._posted = False
        self._after = after
        self.running = False

    def put(self, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` on the mailbox thread, after the calls put before it."""
        self._calls.append((action, args))
        if not self._posted:
            self._post()

    def _post(self) -> None:
        self._posted = True
        if not self._executor.execute_if_open(self._run, self._description):
            self._calls.clear()  # no loop will run them: the task is stopping or failed

    def _run(self) -> None:
        # Unset first: a call put while these run (from here or another thread) gets a mail.
        self._posted = False
        calls = self._calls
        self.running = True
        try:
            for _ in range(min(len(calls), self._per_mail)):
                action, args = calls.popleft()
                action(*args)
        finally:
            self.running = False
        if self._after is not None:
            self._after()
        if calls and not self._posted:
            self._post()


def _describe(action: Callable[..., Any]) -> str:
    return str(getattr(action, "__qualname__", repr(action)))


class Suspension:
    """A suspended default action; ``resume()`` (from any thread) makes it run again."""

    def __init__(self, processor: "MailboxProcessor") -> None:
        self._processor = processor

    def resume(self) -> None:
        """Resume; a resume after the mailbox stopped taking mails is ignored."""
        processor = self._processor
        if processor.mailbox.is_mailbox_thread():
            processor._resume(self)
        else:
            processor._send_poison_mail(lambda: processor._resume(self), "resume default action")


class DefaultActionController:
    """What the default action may do to the loop that calls it."""

    def __init__(self, processor: "MailboxProcessor") -> None:
        self._processor = processor

    def suspend_default_action(self) -> Suspension:
        """Stop calling the default action until the returned suspension is resumed."""
        return self._processor._suspend_default_action()

    def all_actions_completed(self) -> None:
        self._processor.all_actions_completed()


class MailboxProcessor:
    """Flink's ``MailboxProcessor``: runs mails and the default action on one thread.

    Each round takes a *batch* of mails first and runs it, then calls the default action once.
    While the default action is suspended, the loop waits for mails without spinning.

    >>> inputs = [1, 2]; out = []
    >>> def default_action(ctl):
    ...     if inputs: out.append(inputs.pop(0))
    ...     else: ctl.all_actions_completed()
    >>> MailboxProcessor(default_action).run_mailbox_loop(); out
    [1, 2]
    """

    def __init__(
        self,
        default_action: Callable[[DefaultActionController], None],
        mailbox: TaskMailbox | None = None,
    ) -> None:
        self.mailbox = mailbox if mailbox is not None else TaskMailbox()
        self._default_action = default_action
        self._controller = DefaultActionController(self)
        self._suspension: Suspension | None = None
        self._loop_running = True
        self._completed = False
        self._control = MailboxExecutor(self.mailbox, MAX_PRIORITY)

    # ------------------------------------------------------------------ executors

    def executor(self, priority: int = 0) -> MailboxExecutor:
        return MailboxExecutor(self.mailbox, priority)

    # ---------------------------------------------------------------- any thread

    def suspend(self) -> None:
        """Leave the loop after the current mail (the loop may run again later).

        Dropped quietly when the mailbox no longer takes mails.
        """
        self._send_poison_mail(self._stop_loop, "suspend mailbox loop")

    def all_actions_completed(self) -> None:
        """The default action has nothing more to do: end the loop for good.

        From another thread, dropped quietly when the mailbox no longer takes mails.
        """
        def complete() -> None:
            self._completed = True
            self._loop_running = False

        if self.mailbox.is_mailbox_thread():
            complete()
        else:
            self._send_poison_mail(complete, "all actions completed")

    def report_throwable(self, error: BaseException) -> None:
        """Rethrow ``error`` on the mailbox thread (for failures seen on other threads)."""
        def rethrow() -> None:
            raise error

        self._send_control_mail(rethrow, f"report {type(error).__name__}")

    # -------------------------------------------------------------- mailbox thread

    @property
    def is_default_action_available(self) -> bool:
        return self._suspension is None

    @property
    def is_completed(self) -> bool:
        return self._completed

    def run_mailbox_loop(self) -> None:
        """Run on the calling thread until all actions complete or the loop is suspended."""
        self._check_thread("run_mailbox_loop")
        self._loop_running = not self._completed
        while self._process_mail():
            self._default_action(self._controller)

    async def run_mailbox_loop_async(self, *, mails_per_round: int | None = None) -> None:
        """The same loop on an asyncio event loop, which it shares with coroutines.

        The mailbox must be bound to the loop's thread. The loop gives way to the event loop
        after every round, and awaits a put instead of blocking when there is nothing to run,
        so coroutines on the same loop keep running.

        ``mails_per_round`` caps the mails of the batch run before the default action gets its
        turn (the rest of the batch runs first in the next round). Without a cap, a burst of
        async results is all handled before the first freed slot takes a new request, which
        puts the handling time and the request latency end to end instead of side by side.
        """
        self._check_thread("run_mailbox_loop_async")
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_put() -> None:
            if self.mailbox.is_mailbox_thread():
                wake.set()
            else:
                loop.call_soon_threadsafe(wake.set)

        self.mailbox.add_listener(on_put)
        try:
            await self._run_async_rounds(wake, mails_per_round)
        finally:
            # A put after the loop is gone must not reach a closed event loop.
            self.mailbox.remove_listener(on_put)

    async def _run_async_rounds(self, wake: asyncio.Event, mails_per_round: int | None) -> None:
        self._loop_running = not self._completed
        mailbox = self.mailbox
        while self._loop_running:
            # Run (part of) the batch; while the default action is suspended, wait for mails.
            if mailbox.create_batch():
                ran = 0
                while self._loop_running and (mails_per_round is None or ran < mails_per_round):
                    mail = mailbox.try_take_from_batch()
                    if mail is None:
                        break
                    mail.run()
                    ran += 1
            if not self._loop_running:
                break
            if self._suspension is None:
                self._default_action(self._controller)
            elif not mailbox.has_mail():
                wake.clear()
                if not mailbox.has_mail() and self._suspension is not None:
                    await wake.wait()
                continue
            await asyncio.sleep(0)

    def step(self) -> bool:
        """Run one mail, or else one default action. False when there is nothing to do."""
        self._check_thread("step")
        if self._completed:
            return False
        mail = self.mailbox.try_take()
        if mail is not None:
            mail.run()
            return True
        if self._suspension is None:
            self._default_action(self._controller)
            return True
        return False

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until no mail is left and the default action is suspended; returns the steps."""
        for steps in range(max_steps):
            if not self.step():
                return steps
        raise ActorflowError(
            f"the mailbox was not idle after {max_steps} steps; a default action must suspend itself "
            "when it has no input"
        )

    def quiesce(self) -> None:
        self._check_thread("quiesce")
        self.mailbox.quiesce()

    def drain(self) -> list[Mail]:
        """Run the mails that are left, in order (at the end, after the loop); returns them."""
        self._check_thread("drain")
        mails = self.mailbox.drain()
        for mail in mails:
            mail.run()
        return mails

    def close(self) -> list[Mail]:
        """Close the mailbox; returns the mails that never ran (their futures are cancelled)."""
        self._check_thread("close")
        self._loop_running = False
        return self.mailbox.close()

    # ------------------------------------------------------------------ internals

    def _process_mail(self) -> bool:
        """Run one batch, then wait out a suspended default action. False ends the loop."""
        if self.mailbox.create_batch():
            while self._loop_running:
                mail = self.mailbox.try_take_from_batch()
                if mail is None:
                    break
                mail.run()
        while self._loop_running and self._suspension is not None:
            mail = self.mailbox.take(MIN_PRIORITY)
            if mail is None:  # closed while waiting
                return False
            mail.run()
        return self._loop_running

    def _suspend_default_action(self) -> Suspension:
        self._check_thread("suspend_default_action")
        if self._suspension is None:
            self._suspension = Suspension(self)
        return self._suspension

    def _resume(self, suspension: Suspension) -> None:
        if self._suspension is suspension:
            self._suspension = None
            # An asyncio loop may be waiting for a put; a resume from a coroutine is not one.
            self.mailbox.wake()

    def _stop_loop(self) -> None:
        self._loop_running = False

    def _send_control_mail(self, action: Callable[[], None], description: str) -> None:
        self.mailbox.put_first(Mail(action, MAX_PRIORITY, description))

    def _send_poison_mail(self, action: Callable[[], None], description: str) -> None:
        # Checked and put in one step: a quiesce or close on the mailbox thread cannot slip in
        # between and turn the put into a MailboxClosedError on the sending thread.
        self.mailbox.put_first_if_open(Mail(action, MAX_PRIORITY, description))

    def _check_thread(self, what: str) -> None:
        if not self.mailbox.is_mailbox_thread():
            raise MailboxThreadError(f"{what}() is for the mailbox thread only")
