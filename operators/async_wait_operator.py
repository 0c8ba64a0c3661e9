"""The async I/O operator: Flink's ``AsyncWaitOperator``.

Each record starts a request through the user's ``AsyncFunction``. Up to ``capacity`` elements
(watermarks and watermark statuses included) are in flight; the results re-enter through the mailbox and leave in
input order (``ordered``), in completion order within the segments between watermarks and
statuses (``unordered``), or in input order per ``order_key`` and completion order across keys
within those segments (``key_ordered``). A watermark status queues as a watermark does, behind the records
before it (Flink passes it on at once).

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
value would be shared. The operator keeps its own copy of each record it is given, so that a
caller that changes an object it handed on (a map in front that reuses one) changes nothing
here; ``object_reuse=True`` skips that copy, and then the caller must not change it.

At the end of input the operator drains; retries keep their timers and backoff.

>>> from actorflow.operators.harness import OperatorHarness
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

from .async_attempt import _DEAD_LETTER, _FAILURE, _RUNNING, ATTEMPT_SLOTS, DEAD_LETTER, AttemptHandler, CopyInputs, CoroutineCall, DeadLetter
from .async_function import AsyncFunction, ResultFuture, as_async_function, results_error
from .async_queue_operator import AsyncQueueOperator, Pending
from .elements import Record
from .state import versioned
from .errors import ConfigurationError, RecordError
from .operator import no_fault_point
from .request_keys import RequestKey, key_text
from .retry import RetryStrategy
from .service import AdaptiveCapacity, Service, slots_of
from .service_gate import ServiceGate
from .stream_element_queue import RecordEntry, StatusEntry, WatermarkEntry

__all__ = ["AsyncWaitOperator", "DEAD_LETTER", "DeadLetter", "async_wait"]


class _RecordRequest(RecordEntry, AttemptHandler):
    """One record: its entry in the queue, and the handler of its attempts, which call
    ``async_invoke``, and of its deadline, which calls ``timeout``.

    One object for both, as they live and die together: a record costs one allocation less.
    Its ``handler`` is itself until it is emitted.
    """

    __slots__ = ATTEMPT_SLOTS

    op: "AsyncWaitOperator"

    def __init__(
        self, op: "AsyncWaitOperator", record: Record, key: RequestKey, started_ms: int, attempt: int, deadline_ms: int | None,
    ) -> None:
        # Every field set here, not through the bases' __init__: two calls less per record.
        self.done = False
        self.segment = None
        self.record = record
        self.key = key
        self.started_ms = started_ms
        self.handler = self
        self.kind = None
        self.payload = None
        self.op = op
        self.attempt = attempt
        self.deadline_ms = deadline_ms
        self.state = _RUNNING
        self.future = None
        self.timeout_timer = None
        self.retry_timer = None
        self.retry_due_ms = None
        self.deadline_passed = False
        self.hedge = None

    def prepare_inputs(self) -> Any:
        record = self.record
        copy = self.op.copy_input
        return record.value if copy is None else copy(record.value, record.timestamp_ms)

    def new_future(self, deliver: Callable[[Sequence[Any] | None, BaseException | None], None]) -> ResultFuture:
        return ResultFuture(deliver, self.key)

    def call_function(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.async_invoke(inputs, future)

    def call_timeout(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.timeout(inputs, future)

    def on_outcome(self, kind: str, payload: Any) -> None:
        op = self.op
        op._requests -= 1
        # op._complete_entry(self, kind, payload, self.attempt), inlined: once per record
        if kind is _FAILURE:
            kind, payload = _DEAD_LETTER, op._failure(self, payload, self.attempt)
        self.kind = kind
        self.payload = payload
        op.queue.on_complete(self)
        fault_point = op.context.fault_point
        if fault_point is not no_fault_point:  # unarmed: no call
            fault_point("completion")
        if op.completions.running:
            # Inside a mail of completions: what this outcome lets out leaves at the mail's end,
            # with the others' (_emit_deferred): one pass over the queue and one wake-up a burst.
            op._emit_pending = True
            return
        # A request slot is free now, even if the result waits for its turn in the queue.
        op._emit_completed(freed=op._outcome_frees)


class _CoroutineRequest(_RecordRequest):
    """A record whose function is an ``async def`` (``AsyncFunction.direct_coroutine``): each
    attempt runs it on the coroutine runner, which reports straight to the handler.

    The outcomes, the key the coroutine sees, and what a timeout cancels are those of the
    ``ResultFuture`` path; it saves the future, its callbacks and their calls, per request.
    """

    __slots__ = ("inputs",)

    def call(self) -> None:
        op, record = self.op, self.record
        copy = op.copy_input
        try:
            # prepare_inputs(), inlined: this runs once per request
            inputs = record.value if copy is None else copy(record.value, record.timestamp_ms)
        except RecordError as error:
            self.future = None  # final, as on the ResultFuture path
            op.completions.put(self.on_input_error, self.attempt, error)
            return
        gate = op.gate
        if gate is not None and (gate.hedge is not None or gate.caches_raw):
            self.future = self._call_told_by_identity(inputs)
            return
        call = self.future = CoroutineCall()
        on_done = self.coroutine_ended
        if op._finish is not None:
            self.inputs, on_done = inputs, self.coroutine_returned
        # Making the coroutine runs none of its body; the task that runs it sets the request's
        # key in its own context.
        try:
            call.cancel = op._runner_submit(op._coroutine(inputs), on_done, self.key)
        except Exception as error:  # the function raised instead of returning a coroutine
            self.coroutine_ended(None, error)

    def _call_told_by_identity(self, inputs: Any) -> CoroutineCall:  # type: ignore[override]
        """A run of the coroutine whose end comes back with the call itself (with hedging)."""
        op = self.op
        call = CoroutineCall()
        finish = op._finish

        def ended(result: Any, error: BaseException | None) -> None:
            if call.done:
                return  # cancelled: the other call answered first, or the deadline passed
            call.done = True
            raw = result
            if error is None and finish is not None:
                try:
                    result = finish(inputs, result)
                except Exception as exc:
                    result, error = None, exc
            if error is None and type(result) is not list:
                error = results_error(result, "the return value of an async def")
            op.completions.put(self.on_call_complete, call, None if error is not None else list(result), error,
                               raw if finish is not None else None)

        try:
            call.cancel = op._runner_submit(op._coroutine(inputs), ended, self.key)
        except Exception as error:  # the function raised instead of returning a coroutine
            ended(None, error)
        return call

    def coroutine_returned(self, result: Any, error: BaseException | None) -> None:
        """``coroutine_ended`` with the function's ``direct_finish`` applied to what it returned,
        in the coroutine's task: an error it raises is the attempt's."""
        inputs, self.inputs = self.inputs, None
        call = self.future
        if not isinstance(call, CoroutineCall) or call.done or self.state is not _RUNNING:
            return  # abandoned, as in coroutine_ended
        if error is None:
            try:
                result = self.op._finish(inputs, result)  # type: ignore[misc]
            except Exception as exc:
                result, error = None, exc
        # coroutine_ended(), inlined: this runs once per request
        call.done = True
        if error is None and type(result) is not list:  # a list is right: no call to say so
            error = results_error(result, "the return value of an async def")
        self.op.completions.put(self.on_attempt_complete, self.attempt, None if error is not None else list(result), error)


class AsyncWaitOperator(AsyncQueueOperator):
    """Async requests with bounded concurrency, timeouts, retries and watermark order.

    Use ``async_wait(...)`` to build one; see the module docstring.
    """

    # Set at open() when the function is an ``async def`` that the operator runs itself.
    _coroutine: Callable[[Any], Any]
    _runner_submit: Callable[[Any, Callable[[Any, BaseException | None], None], RequestKey], Callable[[], Any]]

    def __init__(
        self,
        function: AsyncFunction | Any,
        *,
        mode: Literal["ordered", "unordered", "key_ordered"] = "ordered",
        capacity: int | Literal["auto"] | AdaptiveCapacity = 100,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        copy_inputs: CopyInputs = True,
        name: str = "async_wait",
        queue_capacity: int | None = None,
        object_reuse: bool = False,
        order_key: Any = None,
        service: Service | None = None,
        idempotency_key: Any = None,
    ) -> None:
        super().__init__(mode=mode, timeout_ms=timeout_ms, retry=retry, on_error=on_error, copy_inputs=copy_inputs, name=name,
                         object_reuse=object_reuse, order_key=order_key, idempotency_key=idempotency_key)
        # With capacity="auto", the records in flight: as many as the adaptive limit may reach.
        self.service, capacity = slots_of(capacity, service)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ConfigurationError(f"capacity must be an int > 0 or 'auto', got {capacity!r}")
        if queue_capacity is not None and (not isinstance(queue_capacity, int) or queue_capacity < capacity):
            raise ConfigurationError(f"queue_capacity must be an int >= capacity ({capacity}), got {queue_capacity!r}")
        self.function = as_async_function(function)
        self.capacity = capacity
        self.queue_capacity = capacity if queue_capacity is None else queue_capacity

    # ------------------------------------------------------------------ lifecycle

    def initialize_state(self, state: Any | None) -> None:
        self._restore_items("async_wait", state)
        self._restored_service = state.get("service") if isinstance(state, dict) else None

    def open(self) -> None:
        self._open_queue(self.queue_capacity)
        self._outcome_frees = self.queue_capacity > self.capacity
        self._requests = 0  # records whose outcome is not decided yet
        self._now_ms = self.context.processing_time.now_ms
        self.function.open(self.context)
        coroutine, runner = self.function.direct_coroutine(), self.context.coroutine_runner
        self._request_type: type[_RecordRequest] = _RecordRequest
        self._finish: Callable[[Any, Any], Any] | None = None
        if coroutine is not None and runner is not None:
            self._coroutine, self._runner_submit = coroutine, runner.submit
            self._finish = self.function.direct_finish()
            self._request_type = _CoroutineRequest
        self.gate = None
        if self.service is not None:
            share = self.context.service_quota
            quota = None if share is None else share(self.service.name, self.service.calls_per_second)
            counters = self.context.service_counters
            self.gate = ServiceGate(self.service, self.context.processing_time, self.completions.put,
                                    capacity=self.capacity, parallelism=self.context.parallelism, name=self.name,
                                    finish=self._finish, quota=quota,
                                    counters=None if counters is None else counters(self.service.name or self.name))
            restored = getattr(self, "_restored_service", None)
            if restored is not None:
                self.gate.restore(restored)
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

        The ``async_wait`` structure of ``state.py``, ``{"items": [...], "sequence": n}`` with the format version: items are ``("record", value, timestamp_ms, attempt,
        remaining_ms, retry_in_ms, origin, key)``, ``("watermark", timestamp_ms)`` and ``("status",
        idle)`` (a watermark status, in its place among the records); ``n``
        counts the records taken in (the fallback idempotency keys). A restore also reads the
        bare list of items of older snapshots, whose items end before the origin or the key.
        """
        now = self.context.processing_time.now_ms()
        items: list[tuple[Any, ...]] = []
        for entry in self.queue:
            if isinstance(entry, WatermarkEntry):
                items.append(("watermark", entry.watermark.timestamp_ms))
            elif isinstance(entry, StatusEntry):
                items.append(("status", entry.status.idle))
            else:
                assert isinstance(entry, RecordEntry)
                handler: _RecordRequest = entry.handler
                items.append((
                    "record", entry.record.value, entry.record.timestamp_ms, handler.snapshot_attempt(),
                    handler.remaining_ms(now), handler.retry_in_ms(now), entry.record.origin, key_text(entry.key),
                ))
        items.extend(self._snapshot_waiting())
        body: dict[str, Any] = {"items": items, "sequence": self._sequence}
        if self.gate is not None:
            body["service"] = self.gate.snapshot()
        return versioned("async_wait", body)

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
        now = self._now_ms()
        timeout_ms = self.timeout_ms if remaining_ms is None else remaining_ms  # _deadline(), inlined
        request = self._request_type(self, record, key, now, attempt, None if timeout_ms is None else now + timeout_ms)
        if not self.queue.try_put(request):
            return False
        self._requests += 1
        request.start(retry_in_ms, now)
        return True

    _try_start_new = _start  # a record just taken in: first attempt, full deadline


def async_wait(
    function: AsyncFunction | Any,
    *,
    mode: Literal["ordered", "unordered", "key_ordered"] = "ordered",
    capacity: int | Literal["auto"] | AdaptiveCapacity = 100,
    timeout_ms: int | None = None,
    retry: RetryStrategy | None = None,
    on_error: Literal["fail", "dead_letter"] = "fail",
    name: str = "async_wait",
    queue_capacity: int | None = None,
    copy_inputs: CopyInputs = True,
    object_reuse: bool = False,
    order_key: Any = None,
    service: Service | None = None,
    idempotency_key: Any = None,
) -> AsyncWaitOperator:
    """Build an async I/O operator.

    ``function`` is an ``AsyncFunction`` or an ``async def f(value) -> list``. ``capacity``
    bounds the requests in flight; ``queue_capacity`` (default ``capacity``) the elements queued.
    ``mode="key_ordered"`` needs ``order_key``: a column of a dict record, a tuple of columns, or
    a function of the record's value.
    ``service`` (a ``Service``) says how the service may be called: calls in flight, a rate
    limit, a circuit breaker (see ``service``); ``capacity="auto"`` is short for
    ``Service(capacity="auto")``, whose ceiling then bounds the records in flight.
    ``copy_inputs`` (see the module docstring) says how each attempt's input is copied;
    ``object_reuse=True`` keeps the caller's object instead of a copy of it: the caller must not
    change an object it has handed on. ``idempotency_key`` (a column of a dict record, or a
    function of the record) gives each record's idempotency key, a string, instead of the one
    made from its origin (``request_keys``).

    >>> async def lookup(user_id):
    ...     return [{"user_id": user_id, "segment": "gold"}]
    >>> op = async_wait(lookup, mode="unordered", capacity=50, timeout_ms=1_000)
    >>> op.capacity
    50
    """
    return AsyncWaitOperator(
        function, mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error, name=name,
        queue_capacity=queue_capacity, copy_inputs=copy_inputs, object_reuse=object_reuse, order_key=order_key,
        service=service, idempotency_key=idempotency_key,
    )
