"""The async I/O operator: Flink's ``AsyncWaitOperator``.

Each record starts a request through the user's ``AsyncFunction``. Up to ``capacity`` elements
(watermarks included) are in flight; the results re-enter through the mailbox and leave in
input order (``ordered``) or in completion order within watermark segments (``unordered``).

``queue_capacity`` (default: ``capacity``, which is Flink's behaviour) lets the queue hold more
elements than there are requests in flight: at most ``capacity`` requests run, and up to
``queue_capacity`` elements wait in the queue, completed or not. In ordered mode this keeps
one slow request from stalling the requests behind it: their results wait in the queue while
new requests start. Requests in flight never exceed ``capacity``.

Every record gets exactly one outcome: its results, a fallback from ``timeout()``, a failure
(which fails the job), or a dead letter (when ``on_error="dead_letter"``). The interleaving of a
completion, a retry timer and the timeout cannot produce zero outcomes or two: each attempt has
its own ``ResultFuture``, and an element that has moved on ignores completions of old attempts.

>>> from operators.harness import OperatorHarness
>>> class Echo(AsyncFunction):
...     def async_invoke(self, value, rf): rf.complete([value])
>>> h = OperatorHarness(async_wait(Echo(), capacity=2))
>>> h.process_element("a", timestamp_ms=1); h.output_values()
['a']

Threading model: every method runs on the mailbox thread; user functions may complete their
futures from any thread.
"""

from __future__ import annotations

import copy
import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from .async_function import AsyncFunction, ResultFuture, as_async_function
from .elements import Record, Watermark
from .errors import AsyncTimeoutError, ConfigurationError, RecordError, UserFunctionError, describe_value
from .operator import StreamOperator
from .ordered_queue import OrderedQueue
from .retry import NoRetry, RetryStrategy
from .stream_element_queue import RecordEntry, WatermarkEntry
from .timers import TimerHandle
from .unordered_queue import UnorderedQueue

__all__ = ["AsyncWaitOperator", "DEAD_LETTER", "DeadLetter", "async_wait"]

#: The side output that receives dead letters.
DEAD_LETTER = "dead_letter"

_IMMUTABLE = (int, float, str, bytes, bool, type(None), frozenset)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that failed for good, with why and after how many attempts."""

    value: Any
    timestamp_ms: int | None
    attempts: int
    error_type: str
    error: str
    operator: str


class _State(enum.Enum):
    RUNNING = 1  # an attempt is in flight
    WAITING_RETRY = 2  # waiting for the retry timer
    TIMING_OUT = 3  # the deadline passed; waiting for the user's timeout() to complete
    DONE = 4


class _Pending:
    """An element not yet in the queue: it waits for room, or comes from a snapshot."""

    __slots__ = ("element", "attempt", "remaining_ms")

    def __init__(self, element: Record | Watermark, attempt: int = 1, remaining_ms: int | None = None) -> None:
        self.element = element
        self.attempt = attempt
        self.remaining_ms = remaining_ms


class _ElementHandler:
    """Drives one record through attempts, retries and its deadline, to exactly one outcome."""

    __slots__ = ("op", "entry", "attempt", "deadline_ms", "state", "future", "timeout_timer", "retry_timer")

    def __init__(self, op: "AsyncWaitOperator", entry: RecordEntry, attempt: int, deadline_ms: int | None) -> None:
        self.op = op
        self.entry = entry
        self.attempt = attempt
        self.deadline_ms = deadline_ms
        self.state = _State.RUNNING
        self.future: ResultFuture | None = None
        self.timeout_timer: TimerHandle | None = None
        self.retry_timer: TimerHandle | None = None

    def start(self) -> None:
        if self.deadline_ms is not None:
            self.timeout_timer = self.op.context.processing_time.register_timer(self.deadline_ms, self.on_timeout)
        if self.state is _State.RUNNING:  # a deadline already past may have fired synchronously
            self.invoke()

    def invoke(self) -> None:
        attempt = self.attempt
        executor = self.op.context.mailbox_executor

        def deliver(results: Sequence[Any] | None, error: BaseException | None) -> None:
            executor.execute(self.on_attempt_complete, "async result", attempt, results, error)

        self.future = future = ResultFuture(deliver)
        try:
            self.op.function.async_invoke(self.entry.record.value, future)
        except Exception as error:  # the user's invoke raised before starting a request
            future.complete_exceptionally(error)

    def on_attempt_complete(self, attempt: int, results: Sequence[Any] | None, error: BaseException | None) -> None:
        # A completion of an older attempt, or one that arrives after the timeout fired or after
        # the outcome was decided, must not produce a second outcome.
        if self.state is not _State.RUNNING or attempt != self.attempt:
            return
        strategy = self.op.retry
        if (
            not self.op.retry_disabled
            and strategy.can_retry(self.attempt)
            and strategy.should_retry(results, error)
        ):
            self.state = _State.WAITING_RETRY
            self.op.metrics.retries += 1
            now = self.op.context.processing_time.now_ms()
            self.retry_timer = self.op.context.processing_time.register_timer(
                now + strategy.delay_ms(self.attempt), self.on_retry_timer
            )
            return
        if error is not None:
            self.finish("failure", error)
        else:
            self.finish("result", results)

    def on_retry_timer(self, _timestamp_ms: int = 0) -> None:
        if self.state is not _State.WAITING_RETRY:
            return
        self.retry_timer = None
        self.attempt += 1
        self.state = _State.RUNNING
        self.invoke()

    def fire_retry_now(self) -> None:
        """At end of input, a waiting retry runs at once (and its outcome is final)."""
        if self.state is _State.WAITING_RETRY:
            if self.retry_timer is not None:
                self.retry_timer.cancel()
            self.on_retry_timer()

    def on_timeout(self, _timestamp_ms: int = 0) -> None:
        if self.state in (_State.DONE, _State.TIMING_OUT):
            return  # a timeout after the outcome is a no-op
        if self.retry_timer is not None:
            self.retry_timer.cancel()
        if self.future is not None:
            self.future.abandon()
        self.state = _State.TIMING_OUT
        self.op.metrics.timeouts += 1
        executor = self.op.context.mailbox_executor

        def deliver(results: Sequence[Any] | None, error: BaseException | None) -> None:
            executor.execute(self.on_timeout_complete, "async timeout outcome", results, error)

        future = ResultFuture(deliver)
        try:
            self.op.function.timeout(self.entry.record.value, future)
        except Exception as error:
            future.complete_exceptionally(error)

    def on_timeout_complete(self, results: Sequence[Any] | None, error: BaseException | None) -> None:
        if self.state is not _State.TIMING_OUT:
            return
        if error is not None:
            self.finish("failure", error)
        else:
            self.finish("fallback", results)

    def finish(self, kind: str, payload: Any) -> None:
        self.state = _State.DONE
        self.future = None  # its delivery closure refers back to this handler
        if self.timeout_timer is not None:
            self.timeout_timer.cancel()
        if self.retry_timer is not None:
            self.retry_timer.cancel()
        self.op._on_outcome(self.entry, kind, payload)

    def snapshot_attempt(self) -> int:
        """The attempt a restore should run: the one in flight, or the next after a wait."""
        return self.attempt + 1 if self.state is _State.WAITING_RETRY else self.attempt


class AsyncWaitOperator(StreamOperator):
    """Async requests with bounded concurrency, timeouts, retries and watermark order.

    Use ``async_wait(...)`` to build one; see the module docstring.
    """

    def __init__(
        self,
        function: AsyncFunction | Any,
        *,
        mode: Literal["ordered", "unordered"] = "ordered",
        capacity: int = 100,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        copy_inputs: bool = True,
        name: str = "async_wait",
        queue_capacity: int | None = None,
    ) -> None:
        if mode not in ("ordered", "unordered"):
            raise ConfigurationError(f"mode must be 'ordered' or 'unordered', got {mode!r}")
        if not isinstance(capacity, int) or capacity <= 0:
            raise ConfigurationError(f"capacity must be > 0, got {capacity!r}")
        if queue_capacity is not None and (not isinstance(queue_capacity, int) or queue_capacity < capacity):
            raise ConfigurationError(f"queue_capacity must be an int >= capacity ({capacity}), got {queue_capacity!r}")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or timeout_ms <= 0):
            raise ConfigurationError(f"timeout_ms must be an int > 0 or None, got {timeout_ms!r}")
        if on_error not in ("fail", "dead_letter"):
            raise ConfigurationError(f"on_error must be 'fail' or 'dead_letter', got {on_error!r}")
        if retry is not None and not isinstance(retry, RetryStrategy):
            raise ConfigurationError(f"retry must be a RetryStrategy, got {type(retry).__name__}")
        self.function = as_async_function(function)
        self.mode = mode
        self.capacity = capacity
        self.queue_capacity = capacity if queue_capacity is None else queue_capacity
        self.timeout_ms = timeout_ms
        self.retry = retry if retry is not None else NoRetry()
        self.on_error = on_error
        self.copy_inputs = copy_inputs
        self.name = name
        self.retry_disabled = False
        self._restored: list[_Pending] = []

    # ------------------------------------------------------------------ lifecycle

    def initialize_state(self, state: Any | None) -> None:
        self._restored = []
        for item in state or ():
            if item[0] == "watermark":
                self._restored.append(_Pending(Watermark(item[1])))
            else:
                _, value, timestamp_ms, attempt, remaining_ms = item
                self._restored.append(_Pending(Record(value, timestamp_ms), attempt, remaining_ms))

    def open(self) -> None:
        size = self.queue_capacity
        self.queue = OrderedQueue(size) if self.mode == "ordered" else UnorderedQueue(size)
        self._waiting: deque[_Pending] = deque()
        self._requests = 0  # records whose outcome is not decided yet
        self.function.open(self.context)
        # Replay what the snapshot held, in order; what does not fit waits for room.
        for pending in self._restored:
            self._add(pending)
        self._restored = []

    def close(self) -> None:
        self.function.close()

    # ------------------------------------------------------------------- elements

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        if self.copy_inputs and not isinstance(record.value, _IMMUTABLE):
            # The snapshot holds the input; a caller that mutates it later must not change that.
            record = Record(copy.deepcopy(record.value), record.timestamp_ms)
        if self._waiting or not self._try_start_record(record, 1, None):
            self._waiting.append(_Pending(record))

    def process_watermark(self, watermark: Watermark) -> None:
        self._add(_Pending(watermark))

    def end_input(self) -> None:
        self.retry_disabled = True
        for entry in list(self.queue):
            if isinstance(entry, RecordEntry) and entry.handler is not None:
                entry.handler.fire_retry_now()

    def is_blocked(self) -> bool:
        return bool(self._waiting)

    def is_drained(self) -> bool:
        return not self._waiting and len(self.queue) == 0

    @property
    def in_flight(self) -> int:
        """Queue slots taken: requests, completed results waiting for their turn, watermarks."""
        return len(self.queue)

    @property
    def requests_in_flight(self) -> int:
        """Records whose outcome is not decided yet (never more than ``capacity``)."""
        return self._requests

    @property
    def records_pending(self) -> int:
        """Records taken in whose outcome has not been emitted yet (queued or waiting for room)."""
        queued = sum(1 for entry in self.queue if isinstance(entry, RecordEntry))
        return queued + sum(1 for p in self._waiting if isinstance(p.element, Record))

    def oldest_request_started_ms(self) -> int | None:
        """When the oldest request still without an outcome started (processing time), if any."""
        started = [e.started_ms for e in self.queue if isinstance(e, RecordEntry) and not e.done]
        return min(started) if started else None

    def snapshot_state(self) -> list[tuple[Any, ...]]:
        """Every element not yet emitted, in order: queued ones, then those waiting for room."""
        now = self.context.processing_time.now_ms()
        items: list[tuple[Any, ...]] = []
        for entry in self.queue:
            if isinstance(entry, WatermarkEntry):
                items.append(("watermark", entry.watermark.timestamp_ms))
            else:
                assert isinstance(entry, RecordEntry)
                handler: _ElementHandler = entry.handler
                remaining = None if handler.deadline_ms is None else max(0, handler.deadline_ms - now)
                items.append(("record", entry.record.value, entry.record.timestamp_ms, handler.snapshot_attempt(), remaining))
        for pending in self._waiting:
            element = pending.element
            if isinstance(element, Watermark):
                items.append(("watermark", element.timestamp_ms))
            else:
                items.append(("record", element.value, element.timestamp_ms, pending.attempt, pending.remaining_ms))
        return items

    # ------------------------------------------------------------------ internals

    def _add(self, pending: _Pending) -> None:
        # Behind an element that waits for room, everything waits: order is kept.
        if self._waiting or not self._try_start(pending):
            self._waiting.append(pending)

    def _try_start(self, pending: _Pending) -> bool:
        element = pending.element
        if isinstance(element, Watermark):
            if not self.queue.try_put(WatermarkEntry(element)):
                return False
            self._emit_completed()
            return True
        return self._try_start_record(element, pending.attempt, pending.remaining_ms)

    def _try_start_record(self, record: Record, attempt: int, remaining_ms: int | None) -> bool:
        if self._requests >= self.capacity:
            return False
        now = self.context.processing_time.now_ms()
        entry = RecordEntry(record, now)
        if not self.queue.try_put(entry):
            return False
        self._requests += 1
        if remaining_ms is not None:
            deadline: int | None = now + remaining_ms
        elif self.timeout_ms is not None:
            deadline = now + self.timeout_ms
        else:
            deadline = None
        entry.handler = _ElementHandler(self, entry, attempt, deadline)
        entry.handler.start()
        return True

    def _on_outcome(self, entry: RecordEntry, kind: str, payload: Any) -> None:
        self._requests -= 1
        if kind == "failure":
            error = self._record_error(entry, payload)
            if self.on_error == "fail":
                self.metrics.failures += 1
                raise error from payload
            kind, payload = "dead_letter", error
        entry.kind = kind
        entry.payload = payload
        self.queue.on_complete(entry)
        # A request slot is free now, even if the result waits for its turn in the queue.
        self._emit_completed(freed=self.queue_capacity > self.capacity)

    def _record_error(self, entry: RecordEntry, cause: BaseException) -> RecordError:
        record = entry.record
        attempts = entry.handler.attempt
        what = f"record {describe_value(record.value)} (timestamp_ms={record.timestamp_ms}) failed after {attempts} attempt(s)"
        if isinstance(cause, RecordError):
            error_cls: type[RecordError] = type(cause)
            message = f"{what}: {cause}"
        else:
            error_cls = UserFunctionError
            message = f"{what}: {type(cause).__name__}: {cause}"
        if isinstance(cause, AsyncTimeoutError):
            error_cls = AsyncTimeoutError
        error = error_cls(
            message, operator=self.context.name, value=record.value, timestamp_ms=record.timestamp_ms, attempts=attempts
        )
        error.__cause__ = cause
        return error

    def _emit_completed(self, freed: bool = False) -> None:
        """Emit every completed head, then let waiting elements in as room frees."""
        while True:
            while self.queue.has_completed_elements():
                entry = self.queue.pop_completed()
                self._emit(entry)
                if isinstance(entry, RecordEntry):
                    # Entry and handler refer to each other; break the cycle so that reference
                    # counting frees them now, not the cyclic garbage collector later.
                    entry.handler = None
                freed = True
            if not self._waiting:
                break
            # Take it out before starting it: starting a watermark emits, which re-enters here.
            pending = self._waiting.popleft()
            if not self._try_start(pending):
                self._waiting.appendleft(pending)
                break
        if freed and not self._waiting:
            self.context.signal_progress()

    def _emit(self, entry: Any) -> None:
        if isinstance(entry, WatermarkEntry):
            self.output.emit_watermark(entry.watermark)
            return
        record = entry.record
        if entry.kind == "dead_letter":
            error: RecordError = entry.payload
            self.metrics.dead_letters += 1
            self.output.collect_side(
                DEAD_LETTER,
                DeadLetter(
                    record.value,
                    record.timestamp_ms,
                    error.attempts or entry.handler.attempt,
                    type(error.__cause__ or error).__name__,
                    str(error),
                    self.context.name,
                ),
            )
            return
        for value in entry.payload:
            self.output.collect(Record(value, record.timestamp_ms))
        self.metrics.records_out += len(entry.payload)


def async_wait(
    function: AsyncFunction | Any,
    *,
    mode: Literal["ordered", "unordered"] = "ordered",
    capacity: int = 100,
    timeout_ms: int | None = None,
    retry: RetryStrategy | None = None,
    on_error: Literal["fail", "dead_letter"] = "fail",
    name: str = "async_wait",
    queue_capacity: int | None = None,
) -> AsyncWaitOperator:
    """Build an async I/O operator.

    ``function`` is an ``AsyncFunction`` or an ``async def f(value) -> list``. ``capacity``
    bounds the requests in flight; ``queue_capacity`` (default ``capacity``) the elements queued.

    >>> async def lookup(user_id):
    ...     return [{"user_id": user_id, "segment": "gold"}]
    >>> op = async_wait(lookup, mode="unordered", capacity=50, timeout_ms=1_000)
    >>> op.capacity
    50
    """
    return AsyncWaitOperator(
        function, mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error, name=name,
        queue_capacity=queue_capacity,
    )
