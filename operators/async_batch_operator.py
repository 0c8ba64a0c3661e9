"""Batched async calls: Flink's ``AsyncBatchWaitOperator``, with every per-record guarantee.

Records are buffered until ``batch_size`` of them are there, or ``batch_timeout_ms`` after the
first one (a processing-time timer); then one call of the batch function serves them all. A
watermark and the end of input flush a partial buffer too; without ``batch_timeout_ms``, that is
all that does. At most ``capacity`` batches are in flight; a full operator blocks its input
(``is_blocked()``) like the per-record one.

Each record still has its own entry in the ordered or unordered queue, so:

* ordered output follows input order, whether a batch left because it was full, because its
  timer fired, or because a watermark or the end of input came;
* a watermark or a watermark status flushes the partial buffer before it enters the queue, so
  a batch never spans one, and in unordered mode no record crosses one;
* every output keeps its own record's timestamp and origin;
* every record has exactly one outcome: its result list, a fallback, a dead letter, or the
  failure of the operator.

Timeouts, retries and fallbacks work per batch: one deadline, from the batch's first attempt,
spans all its attempts; a retry runs the whole batch again; the deadline calls the function's
``timeout_batch``. Failures are told per record: a batch that fails gives each of its records a
``RecordError`` (or a dead letter) of its own. A result of the wrong shape (not one list per
record) is a ``ResultTypeError`` for every record of the batch.

A snapshot holds the buffered records (and how long their buffer had left), the records of
in-flight batches (with the batch's attempt count and remaining deadline, so that a restore
runs the same batches again), completed records not yet emitted, and watermarks.

>>> from actorflow.operators.harness import OperatorHarness
>>> async def double(values):
...     return [[v * 2] for v in values]
>>> h = OperatorHarness(async_wait_batch(double, batch_size=2))
>>> h.process_element(1, timestamp_ms=1); h.process_element(2, timestamp_ms=2); h.run_until_idle()
>>> h.output_values()
[2, 4]

Threading model: every method runs on the mailbox thread; batch functions may complete their
futures from any thread.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

from .async_attempt import ATTEMPT_SLOTS, AttemptHandler, CopyInputs, Outcome
from .async_batch_function import AsyncBatchFunction, FallbackOnBatchTimeout, as_async_batch_function
from .async_function import ResultFuture
from .async_queue_operator import AsyncQueueOperator, Pending
from .elements import Record, Watermark, WatermarkStatus
from .state import check_state, versioned
from .errors import ConfigurationError, RecordError, ResultTypeError
from .request_keys import key_text
from .retry import RetryStrategy
from .stream_element_queue import RecordEntry, StatusEntry, WatermarkEntry
from .timers import TimerHandle

__all__ = ["AsyncBatchWaitOperator", "async_wait_batch"]


class _BatchHandler(AttemptHandler):
    """One batch: its attempts call ``async_invoke_batch``, its deadline ``timeout_batch``."""

    __slots__ = (*ATTEMPT_SLOTS, "entries")

    op: "AsyncBatchWaitOperator"

    def __init__(self, op: "AsyncBatchWaitOperator", entries: list[RecordEntry], attempt: int, deadline_ms: int | None) -> None:
        super().__init__(op, attempt, deadline_ms)
        self.entries = entries

    def _values(self) -> list[Any]:
        copy = self.op.copy_input
        if copy is None:
            return [e.record.value for e in self.entries]
        values: list[Any] = []
        keep: list[RecordEntry] = []
        for entry in self.entries:
            try:
                values.append(copy(entry.record.value, entry.record.timestamp_ms))
                keep.append(entry)
            except RecordError as error:
                # This record alone fails (another attempt would fail the same way); the others
                # go on without it.
                self.op.context.mailbox_executor.execute(
                    self.op._on_record_failed, "async input error", entry, error, self.attempt
                )
        self.entries = keep
        return values

    def prepare_inputs(self) -> Any:
        values = self._values()
        if not self.entries:
            raise RecordError("no record of the batch could be copied for an attempt")
        return values

    def prepare_timeout_inputs(self) -> Any:
        return self._values()

    def new_future(self, deliver: Callable[[Sequence[Any] | None, BaseException | None], None]) -> ResultFuture:
        return ResultFuture(deliver, idempotency_keys=[e.key for e in self.entries])

    def call_function(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.async_invoke_batch(inputs, future)

    def call_timeout(self, inputs: Any, future: ResultFuture) -> None:
        self.op.function.timeout_batch(inputs, future)

    def check_results(self, results: Sequence[Any]) -> BaseException | None:
        n = len(self.entries)
        if len(results) != n:
            return ResultTypeError(
                f"the batch function returned {len(results)} result lists for a batch of {n} records; "
                "expected one list per record, in input order"
            )
        for i, item in enumerate(results):
            if isinstance(item, (str, bytes, dict)) or not isinstance(item, (list, tuple)):
                return ResultTypeError(
                    f"the batch function's result for record {i} of the batch is not a list; expected one list "
                    f"of results per record, got {type(item).__name__}"
                )
        return None

    def should_retry(self, results: Sequence[Any] | None, error: BaseException | None) -> bool:
        strategy = self.op.retry
        if error is not None or results is None:
            return strategy.should_retry(None, error)
        # The result predicate looks at each record's results; one match runs the batch again.
        return any(strategy.should_retry(r, None) for r in results)

    def on_outcome(self, kind: Outcome, payload: Any) -> None:
        self.op._on_batch_outcome(self, kind, payload)


class AsyncBatchWaitOperator(AsyncQueueOperator):
    """Buffers records into batches, one async call per batch; see the module docstring.

    Use ``async_wait_batch(...)`` to build one.
    """

    def __init__(
        self,
        function: AsyncBatchFunction | Any,
        *,
        batch_size: int,
        batch_timeout_ms: int | None = None,
        mode: Literal["ordered", "unordered", "key_ordered"] = "ordered",
        capacity: int = 2,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        copy_inputs: CopyInputs = True,
        name: str = "async_wait_batch",
        queue_capacity: int | None = None,
        object_reuse: bool = False,
        order_key: Any = None,
        idempotency_key: Any = None,
    ) -> None:
        super().__init__(mode=mode, timeout_ms=timeout_ms, retry=retry, on_error=on_error, copy_inputs=copy_inputs, name=name,
                         object_reuse=object_reuse, order_key=order_key, idempotency_key=idempotency_key)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigurationError(f"batch_size must be an int > 0, got {batch_size!r}")
        if batch_timeout_ms is not None and (not isinstance(batch_timeout_ms, int) or batch_timeout_ms <= 0):
            raise ConfigurationError(f"batch_timeout_ms must be an int > 0 or None, got {batch_timeout_ms!r}")
        if not isinstance(capacity, int) or capacity <= 0:
            raise ConfigurationError(f"capacity (batches in flight) must be > 0, got {capacity!r}")
        if queue_capacity is not None and (not isinstance(queue_capacity, int) or queue_capacity < batch_size):
            raise ConfigurationError(f"queue_capacity must be an int >= batch_size ({batch_size}), got {queue_capacity!r}")
        self.function = as_async_batch_function(function)
        self.batch_size = batch_size
        self.batch_timeout_ms = batch_timeout_ms
        self.capacity = capacity
        # Room for the batches in flight, a full buffer, and a few watermarks between them.
        self.queue_capacity = (capacity + 1) * batch_size + capacity if queue_capacity is None else queue_capacity
        self._restored_flush_ms: int | None = None
        self._groups: dict[int, list[Any]] = {}

    # ------------------------------------------------------------------ lifecycle

    def initialize_state(self, state: Any | None) -> None:
        self._restored = []
        self._restored_flush_ms = None
        self._groups = {}
        self._sequence = 0
        if state is None:
            return
        if "version" in state:  # the unversioned states of earlier releases are the same plain data
            check_state("async_batch", state)
        self._restored_flush_ms = state["flush_remaining_ms"]
        self._sequence = state.get("sequence", 0)
        sizes: dict[int, int] = {}
        for item in state["items"]:
            if item[0] == "watermark":
                self._restored.append(Pending(Watermark(item[1])))
            elif item[0] == "status":
                self._restored.append(Pending(WatermarkStatus(item[1])))
            else:
                # Items of older snapshots end before the origin (four fields) or the key (five).
                _, value, timestamp_ms, group = item[:4]
                record = Record(value, timestamp_ms, item[4] if len(item) > 4 else None)
                key = item[5] if len(item) > 5 else self._request_key(record)
                self._restored.append(Pending(record, group=group, key=key))
                if group is not None:
                    sizes[group] = sizes.get(group, 0) + 1
        # Per restored batch: records still to join it, its attempt, its remaining deadline.
        self._groups = {g: [sizes.get(g, 0), attempt, remaining] for g, attempt, remaining in state["batches"]}

    def open(self) -> None:
        self._open_queue(self.queue_capacity)
        self._buffer: list[RecordEntry] = []
        self._buffer_group: int | None = None
        self._flush_timer: TimerHandle | None = None
        self._flush_due = False
        self._ending = False
        self._batches = 0
        self.function.open(self.context)
        self._replay_restored()

    def close(self) -> None:
        self.function.close()

    # ------------------------------------------------------------------- elements

    def end_input(self) -> None:
        """Flush the partial buffer; the operator then drains (retries keep their backoff)."""
        self._ending = True
        self._emit_completed()

    @property
    def batches_in_flight(self) -> int:
        return self._batches

    @property
    def requests_in_flight(self) -> int:
        """Records of the batches that left and have no outcome yet (the buffer not included)."""
        return sum(1 for e in self.queue if isinstance(e, RecordEntry) and e.handler is not None and not e.done)

    @property
    def buffered(self) -> int:
        """Records waiting in the buffer for their batch to leave."""
        return len(self._buffer)

    def snapshot_state(self) -> dict[str, Any]:
        """Every record not yet emitted, in order, with the batch it belongs to (if it left): the
        ``async_batch`` structure of ``state.py``.

        ``items`` are ``("record", value, timestamp_ms, batch, origin, key)``, ``("watermark",
        timestamp_ms)`` and ``("status", idle)``; ``batches`` are ``(batch, attempt, remaining_ms)``; a restore sends each
        batch again as it was, each record with its idempotency key. ``sequence`` counts the
        records taken in (the fallback keys). A batch that completed (its records wait for their
        turn) starts afresh after a restore: its outcome was never seen downstream.
        """
        now = self.context.processing_time.now_ms()
        items: list[tuple[Any, ...]] = []
        batches: dict[Any, tuple[int, int, int | None]] = {}

        def number(key: Any, attempt: int, remaining: int | None) -> int:
            if key not in batches:
                batches[key] = (len(batches), attempt, remaining)
            return batches[key][0]

        def restored_group(group: int) -> int:
            _, attempt, remaining = self._groups.get(group, (0, 1, None))
            return number(("restored", group), attempt, remaining)

        for entry in self.queue:
            if isinstance(entry, WatermarkEntry):
                items.append(("watermark", entry.watermark.timestamp_ms))
                continue
            if isinstance(entry, StatusEntry):
                items.append(("status", entry.status.idle))
                continue
            assert isinstance(entry, RecordEntry)
            handler: _BatchHandler | None = entry.handler
            if handler is not None and handler.is_done:
                batch: int | None = number(handler, 1, None)
            elif handler is not None:
                batch = number(handler, handler.snapshot_attempt(), handler.remaining_ms(now))
            elif self._buffer_group is not None:
                batch = restored_group(self._buffer_group)
            else:
                batch = None  # in the buffer
            items.append(("record", entry.record.value, entry.record.timestamp_ms, batch, entry.record.origin, key_text(entry.key)))
        for pending in self._waiting:
            element = pending.element
            if isinstance(element, Watermark):
                items.append(("watermark", element.timestamp_ms))
            elif isinstance(element, WatermarkStatus):
                items.append(("status", element.idle))
            else:
                batch = None if pending.group is None else restored_group(pending.group)
                items.append(("record", element.value, element.timestamp_ms, batch, element.origin, None if pending.key is None else key_text(pending.key)))
        flush_remaining = None
        if self._flush_timer is not None:
            flush_remaining = max(0, self._flush_timer.timestamp_ms - now)
        return versioned("async_batch", {
            "items": items, "batches": list(batches.values()), "flush_remaining_ms": flush_remaining,
            "sequence": self._sequence,
        })

    # ------------------------------------------------------------------ internals

    def _try_start(self, pending: Pending) -> bool:
        element = pending.element
        if not isinstance(element, Record):
            return self._try_start_marker(element)
        group = pending.group
        if self._buffer and group != self._buffer_group:
            # A restored batch is re-formed as it was: the buffer leaves first.
            self._flush_due = True
            if not self._try_flush():
                return False
        if len(self._buffer) >= self.batch_size and group is None:
            return False  # a full buffer waits for a batch slot
        assert pending.key is not None  # a record always has its key
        entry = RecordEntry(element, pending.key)
        if not self.queue.try_put(entry):
            return False
        if not self._buffer:
            self._buffer_group = group
            if group is None:
                self._arm_flush_timer()
        self._buffer.append(entry)
        if group is not None:
            self._groups[group][0] -= 1
            if self._groups[group][0] <= 0:
                self._flush_due = True
        if self._flush_due or len(self._buffer) >= self.batch_size:
            self._try_flush()
        return True

    def _try_start_record(self, pending: Pending) -> bool:
        # A batch's retries are the batch's: a restored group resumes through _groups.
        return self._try_start(pending)

    def _try_start_marker(self, marker: Watermark | WatermarkStatus) -> bool:
        if self._buffer:
            # A batch never spans a watermark or a status: the marker waits for requests, not
            # for a batch to fill, and no record of the buffer can be overtaken by it.
            self._flush_due = True
            if not self._try_flush():
                return False
        return super()._try_start_marker(marker)

    def _arm_flush_timer(self) -> None:
        if self.batch_timeout_ms is None and self._restored_flush_ms is None:
            return
        now = self.context.processing_time.now_ms()
        if self._restored_flush_ms is not None:
            # The buffer restored from a snapshot keeps what was left of its time.
            delay, self._restored_flush_ms = self._restored_flush_ms, None
        else:
            assert self.batch_timeout_ms is not None
            delay = self.batch_timeout_ms
        self._flush_timer = self.context.processing_time.register_timer(now + delay, self._on_flush_timer)

    def _on_flush_timer(self, _timestamp_ms: int) -> None:
        self._flush_timer = None
        if self.has_failed or not self._buffer:
            return
        self._flush_due = True
        self._emit_completed(freed=self._try_flush())

    def _try_flush(self) -> bool:
        """Send the buffer as a batch if a batch slot is free; True if it left."""
        if not self._buffer or self._batches >= self.capacity or self.has_failed:
            return False
        entries, self._buffer = self._buffer, []
        group, self._buffer_group = self._buffer_group, None
        self._flush_due = False
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        attempt, remaining = 1, None
        if group is not None and group in self._groups:
            _, attempt, remaining = self._groups.pop(group)
        self._batches += 1
        handler = _BatchHandler(self, entries, attempt, self._deadline(remaining))
        now = self.context.processing_time.now_ms()
        for entry in entries:
            entry.handler = handler
            entry.started_ms = now
        handler.start()
        return True

    def _make_room(self) -> None:
        if self._buffer and (self._flush_due or self._ending or len(self._buffer) >= self.batch_size):
            self._try_flush()

    def _on_batch_outcome(self, handler: _BatchHandler, kind: Outcome, payload: Any) -> None:
        self._batches -= 1
        for i, entry in enumerate(handler.entries):
            if kind is Outcome.FAILURE:
                self._complete_entry(entry, Outcome.FAILURE, payload, handler.attempt)
            else:
                self._complete_entry(entry, kind, list(payload[i]), handler.attempt)
        self._emit_completed(freed=True)

    def _on_record_failed(self, entry: RecordEntry, error: RecordError, attempts: int) -> None:
        if self.has_failed or entry.done:
            return
        self._complete_entry(entry, Outcome.FAILURE, error, attempts)
        self._emit_completed(freed=True)


def async_wait_batch(
    function: AsyncBatchFunction | Any,
    *,
    batch_size: int,
    batch_timeout_ms: int | None = None,
    mode: Literal["ordered", "unordered", "key_ordered"] = "ordered",
    capacity: int = 2,
    timeout_ms: int | None = None,
    retry: RetryStrategy | None = None,
    fallback: Callable[[Any], Sequence[Any]] | None = None,
    on_error: Literal["fail", "dead_letter"] = "fail",
    name: str = "async_wait_batch",
    queue_capacity: int | None = None,
    copy_inputs: CopyInputs = True,
    object_reuse: bool = False,
    order_key: Any = None,
    idempotency_key: Any = None,
) -> AsyncBatchWaitOperator:
    """Build a batched async I/O operator.

    ``function`` is an ``AsyncBatchFunction``, an object with ``async_invoke_batch(values,
    result_future)``, or an ``async def f(values) -> list[list]``. ``capacity`` bounds the
    batches in flight; ``fallback(value) -> list`` answers for each record of a batch whose
    deadline passed. ``copy_inputs`` gives each attempt its own copy of the values, so that a
    function that changes them changes neither a retry's input nor a snapshot. A buffered record
    is the operator's own copy; ``object_reuse=True`` keeps the caller's object instead, and the
    caller must not change an object it has handed on.

    >>> async def lookup(user_ids):
    ...     return [[{"user_id": u, "segment": "gold"}] for u in user_ids]
    >>> op = async_wait_batch(lookup, batch_size=64, batch_timeout_ms=20, capacity=4, timeout_ms=1_000)
    >>> op.batch_size, op.capacity
    (64, 4)
    """
    function = as_async_batch_function(function)
    if fallback is not None:
        function = FallbackOnBatchTimeout(function, fallback)
    return AsyncBatchWaitOperator(
        function, batch_size=batch_size, batch_timeout_ms=batch_timeout_ms, mode=mode, capacity=capacity,
        timeout_ms=timeout_ms, retry=retry, on_error=on_error, copy_inputs=copy_inputs, name=name,
        queue_capacity=queue_capacity, object_reuse=object_reuse, order_key=order_key, idempotency_key=idempotency_key,
    )
