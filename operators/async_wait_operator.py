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
Once a record has failed the operator, nothing more is emitted.

With ``copy_inputs`` (the default), each attempt, and the user's ``timeout()``, get their own
copy of a mutable input, so a function that changes its argument changes neither a retry's input
nor the snapshot. ``copy_inputs="shallow"`` copies a dict with ``dict()`` without looking at its
values, for rows whose values are all scalars (ints, strings, datetimes, decimals, ...): a nested
value would be shared. The operator keeps the record it was given: its caller must not change it
afterwards (an operator chain never does).

At the end of input the operator drains; retries keep their timers and backoff.

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

from typing import Any, Callable, Literal, Sequence

from .async_attempt import DEAD_LETTER, AttemptHandler, CopyInputs, CoroutineCall, DeadLetter
from .async_function import AsyncFunction, ResultFuture, as_async_function
from .async_queue_operator import AsyncQueueOperator, Pending
from .elements import Record
from .errors import ConfigurationError, RecordError
from .request_keys import RequestKey, call_in_request, key_text
from .retry import RetryStrategy
from .stream_element_queue import RecordEntry, WatermarkEntry

__all__ = ["AsyncWaitOperator", "DEAD_LETTER", "DeadLetter", "async_wait"]


class _ElementHandler(AttemptHandler):
    """One record: its attempts call ``async_invoke``, its deadline calls ``timeout``."""

    __slots__ = ("entry",)

    op: "AsyncWaitOperator"

    def __init__(self, op: "AsyncWaitOperator", entry: RecordEntry, attempt: int, deadline_ms: int | None) -> None:
        super().__init__(op, attempt, deadline_ms)
        self.entry = entry

    def prepare_inputs(self) -> Any:
        record = self.entry.record
        copy = self.op.copy_input
        return record.value if copy is None else copy(record.value, record.timestamp_ms)

    def new_future(self, deliver: Callable[[Sequence[Any] | None, BaseException | None], None]) -> ResultFuture:
        return ResultFuture(deliver, self.entry.key)

    def call_function(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.async_invoke(inputs, future)

    def call_timeout(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.timeout(inputs, future)

    def on_outcome(self, kind: str, payload: Any) -> None:
        self.op._on_outcome(self.entry, kind, payload, self.attempt)


class _CoroutineElementHandler(_ElementHandler):
    """A record whose function is an ``async def`` (``AsyncFunction.direct_coroutine``): each
    attempt runs it on the coroutine runner, which reports straight to the handler.

    The outcomes, the key the coroutine sees, and what a timeout cancels are those of the
    ``ResultFuture`` path; it saves the future, its callbacks and their calls, per request.
    """

    __slots__ = ("inputs",)

    def invoke(self) -> None:
        op, record = self.op, self.entry.record
        copy = op.copy_input
        try:
            # prepare_inputs(), inlined: this runs once per request
            inputs = record.value if copy is None else copy(record.value, record.timestamp_ms)
        except RecordError as error:
            self.future = None  # final, as on the ResultFuture path
            op.completions.put(self.on_input_error, self.attempt, error)
            return
        call = self.future = CoroutineCall()
        on_done = self.coroutine_ended
        if op._finish is not None:
            self.inputs, on_done = inputs, self.coroutine_returned
        try:
            # Making the coroutine runs none of its body; the task that runs it copies the
            # context, and so the request's key, when it is submitted.
            call.cancel = call_in_request(self.entry.key, None, op._runner_submit, op._coroutine(inputs), on_done)
        except Exception as error:  # the function raised instead of returning a coroutine
            self.coroutine_ended(None, error)

    def coroutine_returned(self, result: Any, error: BaseException | None) -> None:
        """``coroutine_ended`` with the function's ``direct_finish`` applied to what it returned,
        in the coroutine's task: an error it raises is the attempt's."""
        call, finish = self.future, self.op._finish
        if error is None and finish is not None and isinstance(call, CoroutineCall) and not call.done:
            try:
                result = finish(self.inputs, result)
            except Exception as exc:
                result, error = None, exc
        self.inputs = None
        self.coroutine_ended(result, error)


class AsyncWaitOperator(AsyncQueueOperator):
    """Async requests with bounded concurrency, timeouts, retries and watermark order.

    Use ``async_wait(...)`` to build one; see the module docstring.
    """

    # Set at open() when the function is an ``async def`` that the operator runs itself.
    _coroutine: Callable[[Any], Any]
    _runner_submit: Callable[[Any, Callable[[Any, BaseException | None], None]], Callable[[], Any]]

    def __init__(
        self,
        function: AsyncFunction | Any,
        *,
        mode: Literal["ordered", "unordered"] = "ordered",
        capacity: int = 100,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        copy_inputs: CopyInputs = True,
        name: str = "async_wait",
        queue_capacity: int | None = None,
    ) -> None:
        super().__init__(mode=mode, timeout_ms=timeout_ms, retry=retry, on_error=on_error, copy_inputs=copy_inputs, name=name)
        if not isinstance(capacity, int) or capacity <= 0:
            raise ConfigurationError(f"capacity must be > 0, got {capacity!r}")
        if queue_capacity is not None and (not isinstance(queue_capacity, int) or queue_capacity < capacity):
            raise ConfigurationError(f"queue_capacity must be an int >= capacity ({capacity}), got {queue_capacity!r}")
        self.function = as_async_function(function)
        self.capacity = capacity
        self.queue_capacity = capacity if queue_capacity is None else queue_capacity

    # ------------------------------------------------------------------ lifecycle

    def initialize_state(self, state: Any | None) -> None:
        self._restore_items(state)

    def open(self) -> None:
        self._open_queue(self.queue_capacity)
        self._requests = 0  # records whose outcome is not decided yet
        self.function.open(self.context)
        coroutine, runner = self.function.direct_coroutine(), self.context.coroutine_runner
        self._handler_type: type[_ElementHandler] = _ElementHandler
        self._finish: Callable[[Any, Any], Any] | None = None
        if coroutine is not None and runner is not None:
            self._coroutine, self._runner_submit = coroutine, runner.submit
            self._finish = self.function.direct_finish()
            self._handler_type = _CoroutineElementHandler
        self._replay_restored()

    def close(self) -> None:
        self.function.close()

    # ------------------------------------------------------------------- elements

    def end_input(self) -> None:
        """Nothing to do: the operator drains, and retries keep their timers and backoff.

        Flink cuts retries short at the end of input because its timers stop then; here they
        keep running, and the last records of a bounded input get the attempts the others got.
        """

    @property
    def requests_in_flight(self) -> int:
        """Records whose outcome is not decided yet (never more than ``capacity``)."""
        return self._requests

    def snapshot_state(self) -> dict[str, Any]:
        """Every element not yet emitted, in order: queued ones, then those waiting for room.

        ``{"items": [...], "sequence": n}``: items are ``("record", value, timestamp_ms, attempt,
        remaining_ms, retry_in_ms, origin, key)`` and ``("watermark", timestamp_ms)``; ``n``
        counts the records taken in (the fallback idempotency keys). A restore also reads the
        bare list of items of older snapshots, whose items end before the origin or the key.
        """
        now = self.context.processing_time.now_ms()
        items: list[tuple[Any, ...]] = []
        for entry in self.queue:
            if isinstance(entry, WatermarkEntry):
                items.append(("watermark", entry.watermark.timestamp_ms))
            else:
                assert isinstance(entry, RecordEntry)
                handler: _ElementHandler = entry.handler
                items.append((
                    "record", entry.record.value, entry.record.timestamp_ms, handler.snapshot_attempt(),
                    handler.remaining_ms(now), handler.retry_in_ms(now), entry.record.origin, key_text(entry.key),
                ))
        items.extend(self._snapshot_waiting())
        return {"items": items, "sequence": self._sequence}

    # ------------------------------------------------------------------ internals

    def _try_start_record(self, pending: Pending) -> bool:
        record, key = pending.element, pending.key
        assert isinstance(record, Record) and key is not None  # a record always has its key
        return self._start(record, key, pending.attempt, pending.remaining_ms, pending.retry_in_ms)

    def _start(
        self, record: Record, key: RequestKey, attempt: int = 1, remaining_ms: int | None = None, retry_in_ms: int | None = None,
    ) -> bool:
        if self._requests >= self.capacity:
            return False
        now = self.context.processing_time.now_ms()
        entry = RecordEntry(record, key, now)
        if not self.queue.try_put(entry):
            return False
        self._requests += 1
        entry.handler = handler = self._handler_type(self, entry, attempt, self._deadline(remaining_ms, now))
        handler.start(retry_in_ms, now)
        return True

    _try_start_new = _start  # a record just taken in: first attempt, full deadline

    def _on_outcome(self, entry: RecordEntry, kind: str, payload: Any, attempts: int) -> None:
        self._requests -= 1
        self._complete_entry(entry, kind, payload, attempts)
        # A request slot is free now, even if the result waits for its turn in the queue.
        self._emit_completed(freed=self.queue_capacity > self.capacity)


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
    copy_inputs: CopyInputs = True,
) -> AsyncWaitOperator:
    """Build an async I/O operator.

    ``function`` is an ``AsyncFunction`` or an ``async def f(value) -> list``. ``capacity``
    bounds the requests in flight; ``queue_capacity`` (default ``capacity``) the elements queued.
    ``copy_inputs`` (see the module docstring) says how each attempt's input is copied.

    >>> async def lookup(user_id):
    ...     return [{"user_id": user_id, "segment": "gold"}]
    >>> op = async_wait(lookup, mode="unordered", capacity=50, timeout_ms=1_000)
    >>> op.capacity
    50
    """
    return AsyncWaitOperator(
        function, mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error, name=name,
        queue_capacity=queue_capacity, copy_inputs=copy_inputs,
    )
