"""The task mailbox: a thread-safe queue of mails, drained by one thread.

A *mail* is an action with a priority and a description. Every change of operator state
happens in a mail, on the mailbox thread, one mail at a time; other threads (and coroutines)
only put mails.

Threading model
    * ``put``, ``put_first``, ``run_exclusively``, ``has_mail``, ``size`` and ``state`` may be
      called from any thread.
    * ``take``, ``try_take``, ``create_batch``, ``try_take_from_batch``, ``quiesce``, ``close`` and
      ``drain`` are for the mailbox thread only, and raise ``MailboxThreadError`` elsewhere.
    * The mailbox thread is the thread that built the mailbox, until ``bind_to_current_thread``
      moves it (a Ray actor binds it to its event-loop thread).

Lifecycle
    OPEN → QUIESCED → CLOSED. A QUIESCED mailbox takes no new mails but still hands out the ones
    it holds; a CLOSED mailbox hands out nothing, and ``close`` returns the mails it dropped.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from .clock import Clock, SystemClock
from .errors import MailboxClosedError, MailboxStateError, MailboxThreadError

__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "Mail", "MailboxState", "TaskMailbox"]

#: ``take(MIN_PRIORITY)`` accepts every mail; the processor's main loop uses it.
MIN_PRIORITY = -1
#: Control mails (suspend, all-actions-completed) use the top priority.
MAX_PRIORITY = 2**31 - 1

_T = TypeVar("_T")


@dataclass(eq=False, slots=True)
class Mail:
    """An action to run on the mailbox thread.

    A *deferrable* mail may wait until the main loop takes it: whatever its priority, ``take``
    and ``try_take`` treat it as ``MIN_PRIORITY``, so ``yield_()`` skips it and an operator that
    yields while its queue is full is not held up by, say, a periodic flush.

    ``future`` is set for a mail from ``MailboxExecutor.submit``; a mail dropped by ``close()``
    cancels it.
    """

    action: Callable[..., Any]
    priority: int = 0
    description: str = ""
    args: tuple[Any, ...] = ()
    deferrable: bool = False
    future: Future[Any] | None = None
    #: When it was put (the mailbox's clock, ms), for the age of the oldest mail.
    put_at: int = 0

    @property
    def effective_priority(self) -> int:
        """The priority ``take`` compares: a deferrable mail ranks below every other."""
        return MIN_PRIORITY if self.deferrable else self.priority

    def run(self) -> None:
        self.action(*self.args)

    def try_cancel(self) -> bool:
        """Cancel the future of a mail that will never run; True if there was one to cancel."""
        return self.future is not None and self.future.cancel()

    def __str__(self) -> str:
        return self.description or getattr(self.action, "__qualname__", repr(self.action))


class MailboxState(enum.Enum):
    OPEN = "OPEN"
    QUIESCED = "QUIESCED"
    CLOSED = "CLOSED"


class TaskMailbox:
    """Flink's ``TaskMailboxImpl``: a FIFO of mails with priorities, batches and a lifecycle.

    >>> mb = TaskMailbox()
    >>> mb.put(Mail(lambda: None, priority=0, description="low"))
    >>> mb.put(Mail(lambda: None, priority=5, description="high"))
    >>> str(mb.try_take(5))
    'high'
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()  # the mails' ages
        # Re-entrant, so that a put inside run_exclusively() does not deadlock.
        self._lock = threading.RLock()
        self._not_empty = threading.Condition(self._lock)
        self._queue: deque[Mail] = deque()
        # The batch is touched by the mailbox thread only, so it needs no lock.
        self._batch: deque[Mail] = deque()
        self._state = MailboxState.OPEN
        self._sleepers = 0  # threads waiting in take(): only they need a notify
        self._thread_id = threading.get_ident()
        self._listeners: list[Callable[[], None]] = []

    # ----------------------------------------------------------------- any thread

    @property
    def state(self) -> MailboxState:
        return self._state

    def put(self, mail: Mail) -> None:
        """Append a mail. Raises ``MailboxClosedError`` unless the mailbox is OPEN."""
        mail.put_at = self._clock.now_ms()
        with self._lock:
            self._check_put_state()
            self._queue.append(mail)
            if self._sleepers:
                self._not_empty.notify_all()
        self._notify_listeners()

    def put_if_open(self, mail: Mail) -> bool:
        """``put`` if the mailbox is OPEN, else drop the mail; True if it was put.

        For completions and timers that other threads deliver: once the mailbox is quiesced or
        closed (a failed or stopping task), their element is in the last checkpoint and will be
        replayed, so the mail is dropped instead of raising into the thread that delivered it.
        """
        mail.put_at = self._clock.now_ms()
        with self._lock:
            if self._state is not MailboxState.OPEN:
                return False
            self._queue.append(mail)
            if self._sleepers:
                self._not_empty.notify_all()
        self._notify_listeners()
        return True

    def put_first(self, mail: Mail) -> None:
        """Put an urgent mail in front of every other, the current batch included."""
        mail.put_at = self._clock.now_ms()
        if self.is_mailbox_thread():
            # The batch is ahead of the queue, so the front of the batch is the very front.
            self._check_put_state()
            self._batch.appendleft(mail)
        else:
            with self._lock:
                self._check_put_state()
                self._queue.appendleft(mail)
                self._not_empty.notify_all()
        self._notify_listeners()

    def put_first_if_open(self, mail: Mail) -> bool:
        """``put_first`` if the mailbox is OPEN, else drop the mail; True if it was put.

        The state check and the put are one atomic step, so a mail sent while another thread
        quiesces or closes the mailbox is either in it or dropped, never an error.
        """
        with self._lock:
            if self._state is not MailboxState.OPEN:
                return False
            self.put_first(mail)
            return True

    def run_exclusively(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn()`` while no other thread can put, take or change the state.

        Re-entrant: ``fn`` may put mails, or call ``run_exclusively`` again.
        """
        with self._lock:
            return fn()

    def has_mail(self) -> bool:
        return bool(self._batch) or bool(self._queue)

    def size(self) -> int:
        with self._lock:
            return len(self._batch) + len(self._queue)

    def depth_by_priority(self) -> dict[int, int]:
        """Mails waiting, by the priority ``take`` compares (a deferrable mail's is ``MIN_PRIORITY``).

        >>> mb = TaskMailbox()
        >>> mb.put(Mail(lambda: None, priority=1)); mb.put(Mail(lambda: None, priority=1)); mb.put(Mail(lambda: None))
        >>> mb.depth_by_priority()
        {0: 1, 1: 2}
        """
        with self._lock:
            depths: dict[int, int] = {}
            for mail in (*self._batch, *self._queue):
                depths[mail.effective_priority] = depths.get(mail.effective_priority, 0) + 1
        return dict(sorted(depths.items()))

    def oldest_mail_age_ms(self) -> int | None:
        """How long the mail that has waited longest has waited, in ms; None if none waits."""
        with self._lock:
            oldest = min((mail.put_at for mail in (*self._batch, *self._queue)), default=None)
        return None if oldest is None else self._clock.now_ms() - oldest

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every put, from the putting thread.

        An asyncio driver registers ``loop.call_soon_threadsafe(event.set)`` here to wake up
        without polling.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def is_mailbox_thread(self) -> bool:
        return threading.get_ident() == self._thread_id

    def wake(self) -> None:
        """Wake a loop that waits for mails, without adding one (a resumed default action)."""
        with self._lock:
            self._not_empty.notify_all()
        self._notify_listeners()

    # --------------------------------------------------------- mailbox thread only

    def bind_to_current_thread(self) -> None:
        """Make the calling thread the mailbox thread (before the loop starts)."""
        self._thread_id = threading.get_ident()

    def try_take(self, priority: int = MIN_PRIORITY, *, include_deferrable: bool = True) -> Mail | None:
        """The first mail of at least ``priority``, or ``None`` at once.

        A deferrable mail counts as ``MIN_PRIORITY``; ``include_deferrable=False`` skips it even
        then.
        """
        self._check_mailbox_thread("try_take")
        self._check_take_state()
        mail = self._take_or_none(self._batch, priority, include_deferrable)
        if mail is not None:
            return mail
        with self._lock:
            return self._take_or_none(self._queue, priority, include_deferrable)

    def take(
        self, priority: int = MIN_PRIORITY, *, include_deferrable: bool = True, timeout_s: float | None = None
    ) -> Mail | None:
        """The first mail of at least ``priority``, waiting for one.

        Returns ``None`` only when ``timeout_s`` passes, or when the mailbox is closed while
        waiting.
        """
        self._check_mailbox_thread("take")
        self._check_take_state()
        mail = self._take_or_none(self._batch, priority, include_deferrable)
        if mail is not None:
            return mail
        with self._lock:
            while True:
                mail = self._take_or_none(self._queue, priority, include_deferrable)
                if mail is not None or self._state is MailboxState.CLOSED:
                    return mail
                self._sleepers += 1
                try:
                    woken = self._not_empty.wait(timeout_s)
                finally:
                    self._sleepers -= 1
                if not woken and timeout_s is not None:
                    return self._take_or_none(self._queue, priority, include_deferrable)

    def create_batch(self) -> bool:
        """Move every queued mail into the batch; True if the batch holds mails afterwards.

        The main loop takes a batch at the start of each round, so a mail that puts itself again
        lands behind the batch and cannot starve the default action.
        """
        self._check_mailbox_thread("create_batch")
        if self._state is MailboxState.CLOSED:
            return False
        with self._lock:
            self._batch.extend(self._queue)
            self._queue.clear()
        return bool(self._batch)

    def try_take_from_batch(self) -> Mail | None:
        self._check_mailbox_thread("try_take_from_batch")
        self._check_take_state()
        return self._batch.popleft() if self._batch else None

    def quiesce(self) -> None:
        """Stop accepting mails; those already here can still be taken."""
        self._check_mailbox_thread("quiesce")
        with self._lock:
            if self._state is MailboxState.OPEN:
                self._state = MailboxState.QUIESCED

    def drain(self) -> list[Mail]:
        """Remove and return every mail, without running any."""
        self._check_mailbox_thread("drain")
        with self._lock:
            mails = [*self._batch, *self._queue]
            self._batch.clear()
            self._queue.clear()
        return mails

    def close(self) -> list[Mail]:
        """Close the mailbox and return the mails that will never run; their futures are cancelled."""
        self._check_mailbox_thread("close")
        with self._lock:
            mails = [*self._batch, *self._queue]
            self._batch.clear()
            self._queue.clear()
            self._state = MailboxState.CLOSED
            self._not_empty.notify_all()
        for mail in mails:
            mail.try_cancel()
        self._notify_listeners()
        return mails

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _take_or_none(queue: deque[Mail], priority: int, include_deferrable: bool) -> Mail | None:
        for i, mail in enumerate(queue):
            if mail.effective_priority >= priority and (include_deferrable or not mail.deferrable):
                del queue[i]
                return mail
        return None

    def _check_put_state(self) -> None:
        if self._state is not MailboxState.OPEN:
            raise MailboxClosedError(f"mailbox is {self._state.value}; put() needs OPEN")

    def _check_take_state(self) -> None:
        if self._state is MailboxState.CLOSED:
            raise MailboxStateError("mailbox is CLOSED; take() needs OPEN or QUIESCED")

    def _check_mailbox_thread(self, what: str) -> None:
        if threading.get_ident() != self._thread_id:
            raise MailboxThreadError(
                f"{what}() is for the mailbox thread only; called from thread "
                f"{threading.current_thread().name!r}"
            )

    def _notify_listeners(self) -> None:
        for listener in self._listeners:
            listener()
