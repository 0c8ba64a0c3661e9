"""Processing-time scheduling and the timer service of keyed operators.

``ProcessingTimeService`` schedules callbacks at a processing time; implementations deliver
them as mails, so callbacks run on the mailbox thread. ``ManualProcessingTimeService`` does so
when a test advances its ``ManualClock``; the Ray actor has one driven by its event loop.

``TimerService`` holds event-time and processing-time timers of ``(timestamp_ms, key,
namespace)``, keeps one of each, and fires them through a ``Triggerable``: event-time timers when
the watermark passes them, processing-time timers from the ``ProcessingTimeService``.

Threading model: everything here runs on the mailbox thread, except that a
``ManualProcessingTimeService`` is advanced by the test (which is the mailbox thread there).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, Callable, Hashable, NamedTuple, Protocol

from .clock import Clock, ManualClock
from .errors import ConfigurationError
from .mailbox_processor import MailboxExecutor

__all__ = [
    "DeadlineQueue",
    "ManualProcessingTimeService",
    "ProcessingTimeService",
    "Timer",
    "TimerHandle",
    "TimerQueue",
    "TimerService",
    "Triggerable",
]


class TimerHandle:
    """A scheduled callback; ``cancel()`` makes sure it will not run."""

    __slots__ = ("cancelled", "timestamp_ms")

    def __init__(self, timestamp_ms: int) -> None:
        self.timestamp_ms = timestamp_ms
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ProcessingTimeService(Protocol):
    """Runs callbacks at a processing time, on the mailbox thread."""

    def now_ms(self) -> int: ...

    def register_timer(self, timestamp_ms: int, callback: Callable[[int], None]) -> TimerHandle: ...


class _QueuedTimerHandle(TimerHandle):
    __slots__ = ("_queue", "in_heap")

    def __init__(self, timestamp_ms: int, queue: "TimerQueue") -> None:
        super().__init__(timestamp_ms)
        self._queue = queue
        self.in_heap = True

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self.in_heap:
                self._queue._on_cancel()


class TimerQueue:
    """Processing-time timers in one heap; the due ones are put in the mailbox as mails.

    Subclasses decide when ``fire_due`` runs: a test's clock, or an event loop's alarm for the
    earliest timer. One heap of plain tuples is much cheaper than one loop timer per callback
    when every in-flight request has a timeout. Cancelled timers are dropped lazily, and the heap
    is rebuilt once they make up most of it.
    """

    def __init__(self, clock: Clock, executor: MailboxExecutor) -> None:
        self._clock = clock
        self._executor = executor
        self._heap: list[tuple[int, int, _QueuedTimerHandle, Callable[[int], None], MailboxExecutor]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        # The clock's own method: processing time is read once or twice per async request.
        self.now_ms: Callable[[], int] = clock.now_ms

    def register_timer(self, timestamp_ms: int, callback: Callable[[int], None]) -> TimerHandle:
        return self._register(timestamp_ms, callback, self._executor)

    def with_executor(self, executor: MailboxExecutor) -> ProcessingTimeService:
        """A view of this queue whose timers fire as mails of ``executor`` (its priority).

        Each operator of a chain registers through its own view, so its timers carry its
        position in the chain, while one heap (and one alarm) serves the whole chain.
        """
        if executor is self._executor:
            return self
        return _ExecutorView(self, executor)

    def _register(
        self, timestamp_ms: int, callback: Callable[[int], None], executor: MailboxExecutor
    ) -> TimerHandle:
        handle = _QueuedTimerHandle(timestamp_ms, self)
        heapq.heappush(self._heap, (timestamp_ms, next(self._seq), handle, callback, executor))
        self._registered(timestamp_ms)
        return handle

    def pending(self) -> int:
        return len(self._heap) - self._cancelled

    def next_due_ms(self) -> int | None:
        """The time of the earliest live timer, or None."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)[2].in_heap = False
            self._cancelled -= 1
        return heap[0][0] if heap else None

    def fire_due(self) -> None:
        now = self._clock.now_ms()
        heap = self._heap
        while heap and heap[0][0] <= now:
            ts, _, handle, callback, executor = heapq.heappop(heap)
            handle.in_heap = False
            if handle.cancelled:
                self._cancelled -= 1
            else:
                executor.execute_if_open(_run_timer, f"processing timer @{ts}", handle, callback)

    def _registered(self, timestamp_ms: int) -> None:
        """Called after each registration; arrange for ``fire_due`` to run in time."""

    def _on_cancel(self) -> None:
        self._cancelled += 1
        if self._cancelled > 64 and 2 * self._cancelled > len(self._heap):
            live = []
            for entry in self._heap:
                if entry[2].cancelled:
                    entry[2].in_heap = False
                else:
                    live.append(entry)
            heapq.heapify(live)
            self._heap = live
            self._cancelled = 0


class _ExecutorView:
    """``TimerQueue.with_executor``: the same heap, another executor for the firing mails."""

    __slots__ = ("_queue", "_executor", "now_ms")

    def __init__(self, queue: TimerQueue, executor: MailboxExecutor) -> None:
        self._queue = queue
        self._executor = executor
        self.now_ms: Callable[[], int] = queue.now_ms

    def register_timer(self, timestamp_ms: int, callback: Callable[[int], None]) -> TimerHandle:
        return self._queue._register(timestamp_ms, callback, self._executor)


class ManualProcessingTimeService(TimerQueue):
    """Processing time under a test's control.

    Timers that fall due when the clock advances are put in the mailbox, in timestamp order, as
    mails; the test runs them (the harness does so itself).
    """

    def __init__(self, clock: ManualClock, executor: MailboxExecutor) -> None:
        super().__init__(clock, executor)
        self._manual_clock = clock

    def advance_to(self, timestamp_ms: int) -> None:
        self._manual_clock.advance_to(timestamp_ms)
        self.fire_due()

    def _registered(self, timestamp_ms: int) -> None:
        if timestamp_ms <= self._clock.now_ms():
            self.fire_due()


class HasDeadline(Protocol):
    """What a ``DeadlineQueue`` holds: a deadline, the timer it waits on, and what runs then."""

    deadline_ms: int | None
    timeout_timer: Any

    def on_timeout(self, timestamp_ms: int = 0) -> None: ...


class DeadlineQueue:
    """The deadlines of many requests that share one timeout: a FIFO, and one timer for its head.

    Requests started one after the other with the same timeout have deadlines in the order they
    started, so a FIFO keeps them sorted, and one processing-time timer (for the earliest) serves
    them all, instead of a timer each. ``add`` refuses an item whose deadline is earlier than the
    last one's (a restored request keeps what was left of its own; a wall clock may step back):
    its owner registers a timer of its own.

    An item waits while its ``timeout_timer`` is this queue; whoever decides its outcome first
    sets it to None and calls ``cancel()``. Items no longer waiting are dropped from the head at
    once, and from the rest once they make up most of the queue, so a request that hangs does not
    keep the thousands that finished behind it.

    >>> from actorflow.operators.clock import ManualClock
    >>> from actorflow.operators.mailbox import TaskMailbox
    >>> clock = ManualClock(0); mb = TaskMailbox()
    >>> pts = ManualProcessingTimeService(clock, MailboxExecutor(mb))
    >>> class Request:
    ...     def __init__(self, name, deadline_ms): self.name, self.deadline_ms, self.timeout_timer = name, deadline_ms, None
    ...     def on_timeout(self, timestamp_ms=0): timed_out.append(self.name)
    >>> deadlines, timed_out = DeadlineQueue(pts), []
    >>> a, b = Request("a", 10), Request("b", 20)
    >>> deadlines.add(a), deadlines.add(b), deadlines.add(Request("early", 5))
    (True, True, False)
    >>> a.timeout_timer = None; deadlines.cancel()  # a completed in time
    >>> pts.advance_to(25)
    >>> while mb.has_mail(): mb.try_take(0).run()
    >>> timed_out
    ['b']
    """

    __slots__ = ("_processing_time", "_items", "_waiting", "_timer")

    def __init__(self, processing_time: ProcessingTimeService) -> None:
        self._processing_time = processing_time
        self._items: deque[HasDeadline] = deque()
        self._waiting = 0
        self._timer: TimerHandle | None = None

    def __len__(self) -> int:
        """Items still waiting for their deadline."""
        return self._waiting

    @property
    def held(self) -> int:
        """Items held, waiting or not: at most about twice those waiting."""
        return len(self._items)

    def add(self, item: HasDeadline) -> bool:
        """Wait for ``item``'s deadline (and set its ``timeout_timer``); False if it is out of order."""
        deadline_ms = item.deadline_ms
        assert deadline_ms is not None
        items = self._items
        if items and items[-1].deadline_ms > deadline_ms:  # type: ignore[operator]
            return False
        items.append(item)
        item.timeout_timer = self
        self._waiting += 1
        if self._timer is None:
            self._timer = self._processing_time.register_timer(deadline_ms, self._fire)
        return True

    def cancel(self) -> None:
        """One item stopped waiting (its owner has set its ``timeout_timer`` to None)."""
        self._waiting -= 1
        self._drop_finished_head()
        if len(self._items) > 2 * self._waiting + 64:
            self._items = deque(item for item in self._items if item.timeout_timer is self)

    def _drop_finished_head(self) -> None:
        """Drop the items at the head that wait no more; with none left, no timer either."""
        items = self._items
        while items and items[0].timeout_timer is not self:
            items.popleft()
        if not items and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, timestamp_ms: int) -> None:
        # Only what was due at the timer's time: a later deadline that has passed too fires
        # from the next timer, in its turn among the other timers due by now.
        self._timer = None
        items = self._items
        while items and items[0].deadline_ms <= timestamp_ms:  # type: ignore[operator]
            item = items.popleft()
            if item.timeout_timer is self:
                item.timeout_timer = None
                self._waiting -= 1
                item.on_timeout(timestamp_ms)
        self._drop_finished_head()
        if self._items and self._timer is None:
            self._timer = self._processing_time.register_timer(self._items[0].deadline_ms, self._fire)  # type: ignore[arg-type]


def _run_timer(handle: TimerHandle, callback: Callable[[int], None]) -> None:
    # Cancelled after it was put in the mailbox but before it ran: it must not run.
    if not handle.cancelled:
        callback(handle.timestamp_ms)


class Timer(NamedTuple):
    """A timer of ``TimerService``: a time, a key and a namespace (a window, say).

    A named tuple: a window operator makes, hashes and compares one per window several times,
    and a tuple does that in C.
    """

    timestamp_ms: int
    key: Any = None
    namespace: Any = None


class Triggerable(Protocol):
    def on_event_time(self, timer: Timer) -> None: ...

    def on_processing_time(self, timer: Timer) -> None: ...


class TimerService:
    """Event-time and processing-time timers, deduplicated and deletable.

    >>> fired = []
    >>> class T:
    ...     def on_event_time(self, t): fired.append(t.timestamp_ms)
    ...     def on_processing_time(self, t): pass
    >>> ts = TimerService(T(), processing_time=None)
    >>> ts.register_event_time_timer(10, "k"); ts.register_event_time_timer(10, "k")
    >>> ts.advance_watermark(10); fired
    [10]
    """

    def __init__(self, triggerable: Triggerable, processing_time: ProcessingTimeService | None) -> None:
        self._triggerable = triggerable
        self._processing_time = processing_time
        self._event: set[Timer] = set()
        self._event_heap: list[tuple[int, int, Timer]] = []
        self._proc: set[Timer] = set()
        self._proc_heap: list[tuple[int, int, Timer]] = []
        self._seq = itertools.count()
        self._scheduled: TimerHandle | None = None
        self.current_watermark_ms: int | None = None

    # ------------------------------------------------------------------ event time

    def register_event_time_timer(self, timestamp_ms: int, key: Hashable = None, namespace: Hashable = None) -> None:
        timer = Timer(int(timestamp_ms), key, namespace)
        if timer not in self._event:
            self._event.add(timer)
            heapq.heappush(self._event_heap, (timer.timestamp_ms, next(self._seq), timer))

    def delete_event_time_timer(self, timestamp_ms: int, key: Hashable = None, namespace: Hashable = None) -> None:
        self._event.discard(Timer(int(timestamp_ms), key, namespace))

    def advance_watermark(self, timestamp_ms: int) -> None:
        """Fire, in timestamp order, every event-time timer at or before ``timestamp_ms``."""
        self.current_watermark_ms = timestamp_ms
        heap = self._event_heap
        while heap and heap[0][0] <= timestamp_ms:
            _, _, timer = heapq.heappop(heap)
            if timer in self._event:
                self._event.discard(timer)
                self._triggerable.on_event_time(timer)

    # ------------------------------------------------------------- processing time

    def register_processing_time_timer(
        self, timestamp_ms: int, key: Hashable = None, namespace: Hashable = None
    ) -> None:
        if self._processing_time is None:
            raise ConfigurationError("this timer service has no processing-time service")
        timer = Timer(int(timestamp_ms), key, namespace)
        if timer in self._proc:
            return
        self._proc.add(timer)
        heapq.heappush(self._proc_heap, (timer.timestamp_ms, next(self._seq), timer))
        # One underlying timer, always for the earliest registered timestamp.
        if self._scheduled is None or timer.timestamp_ms < self._scheduled.timestamp_ms:
            if self._scheduled is not None:
                self._scheduled.cancel()
            self._scheduled = self._processing_time.register_timer(timer.timestamp_ms, self._on_processing_time)

    def delete_processing_time_timer(
        self, timestamp_ms: int, key: Hashable = None, namespace: Hashable = None
    ) -> None:
        self._proc.discard(Timer(int(timestamp_ms), key, namespace))

    def _on_processing_time(self, now_ms: int) -> None:
        self._scheduled = None
        now = self._processing_time.now_ms() if self._processing_time is not None else now_ms
        heap = self._proc_heap
        while heap and heap[0][0] <= now:
            _, _, timer = heapq.heappop(heap)
            if timer in self._proc:
                self._proc.discard(timer)
                self._triggerable.on_processing_time(timer)
        while heap and heap[0][2] not in self._proc:
            heapq.heappop(heap)
        # A callback may have registered a timer, and with it an underlying one: keep one only.
        if heap and self._processing_time is not None:
            if self._scheduled is None or heap[0][0] < self._scheduled.timestamp_ms:
                if self._scheduled is not None:
                    self._scheduled.cancel()
                self._scheduled = self._processing_time.register_timer(heap[0][0], self._on_processing_time)

    # -------------------------------------------------------------------- state

    def event_time_timers(self) -> list[Timer]:
        # Keys need only be hashable, not comparable: order by time, ties in registration order.
        return _live(self._event_heap, self._event)

    def processing_time_timers(self) -> list[Timer]:
        return _live(self._proc_heap, self._proc)

    def snapshot(self) -> dict[str, Any]:
        return {
            "event": [(t.timestamp_ms, t.key, t.namespace) for t in self.event_time_timers()],
            "processing": [(t.timestamp_ms, t.key, t.namespace) for t in self.processing_time_timers()],
            "watermark": self.current_watermark_ms,
        }

    def restore(self, state: dict[str, Any]) -> None:
        for ts, key, ns in state["event"]:
            self.register_event_time_timer(ts, key, ns)
        for ts, key, ns in state["processing"]:
            self.register_processing_time_timer(ts, key, ns)
        self.current_watermark_ms = state["watermark"]


def _live(heap: list[tuple[int, int, Timer]], registered: set[Timer]) -> list[Timer]:
    """Registered timers in firing order; a deleted and re-registered timer appears once."""
    out: list[Timer] = []
    seen: set[Timer] = set()
    for _, _, timer in sorted(heap, key=lambda e: e[:2]):
        if timer in registered and timer not in seen:
            seen.add(timer)
            out.append(timer)
    return out
