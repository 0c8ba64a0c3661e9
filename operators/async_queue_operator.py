"""What the async operators share: the element queue, waiting for room, outcomes and emission.

``AsyncQueueOperator`` keeps every element in an ``OrderedQueue`` or ``UnorderedQueue`` until
its turn to leave, holds back the elements that find no room (``is_blocked()``), and turns each
record's outcome into output: its results, a dead letter, or a failure of the operator. The
per-record ``AsyncWaitOperator`` and the ``AsyncBatchWaitOperator`` say how a record is started.

A record taken in is the operator's own: unless ``object_reuse=True``, ``process_element`` keeps
a copy of a mutable value (``copy_input``; ``copy_row`` with ``copy_inputs="shallow"``), as Flink
copies between chained operators. A map in front that returns one object, changed for each
input, would otherwise change what a retry sends, what is emitted and what a snapshot holds.
With ``object_reuse=True`` the operator keeps the caller's object, and the caller must not
change an object it has handed on (a chain of maps that build new objects never does). A value
that cannot be copied is kept as given.

Every record gets its idempotency key when it is taken in (see ``request_keys``); it keeps it on
every attempt and through snapshots, which hold the key and the count of records taken in.

The results of a record keep its origin: the first one has the record's origin, the ``i``-th
(``i > 0``) has ``origin + (i,)``. The first result's origin does not depend on how many results
there are, so an enrichment that answers one result per record passes origins on like a map.

Threading model: every method runs on the mailbox thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Literal

from .async_attempt import _DEAD_LETTER, _IMMUTABLE_TYPES, COPIERS, DEAD_LETTER, CopyInputs, DeadLetter, Outcome, copy_input, copy_row
from .elements import Record, Watermark, WatermarkStatus
from .state import check_state
from .errors import AsyncTimeoutError, ConfigurationError, RecordError, UserFunctionError, describe_value
from .mailbox_processor import CoalescingInbox
from .operator import StreamOperator, no_fault_point
from .key_ordered_queue import KeyOrderedQueue, order_key_of
from .ordered_queue import OrderedQueue
from .request_keys import RequestKey, key_text
from .retry import NoRetry, RetryStrategy
from .service_gate import ServiceGate
from .stream_element_queue import RecordEntry, StatusEntry, WatermarkEntry
from .timers import DeadlineQueue
from .unordered_queue import UnorderedQueue

__all__ = ["AsyncQueueOperator", "Pending"]

_COMPLETIONS_PER_MAIL = 64


class Pending:
    """An element not yet in the queue (a record, a watermark or a watermark status): it waits
    for room, or comes from a snapshot."""

    __slots__ = ("element", "attempt", "remaining_ms", "group", "retry_in_ms", "key")

    def __init__(
        self, element: Record | Watermark | WatermarkStatus, attempt: int = 1, remaining_ms: int | None = None, group: int | None = None,
        retry_in_ms: int | None = None, key: RequestKey | None = None,
    ) -> None:
        self.element = element
        self.attempt = attempt
        self.remaining_ms = remaining_ms
        self.group = group  # a restored batch that this record joins again
        self.retry_in_ms = retry_in_ms  # restored while waiting for a retry: the rest of the backoff
        self.key = key  # a record's idempotency key; None for a watermark or a status


class AsyncQueueOperator(StreamOperator):
    """The queue, the waiting elements and the outcomes of an async operator.

    Subclasses implement ``_try_start_record`` (and may refine ``_try_start_watermark``, and
    ``_try_start_new`` for a record that needs no ``Pending``), and call ``_complete_entry`` once
    per record with its outcome.
    """

    #: The gate of the service the operator calls (``service.ServiceGate``), made at open() when
    #: the operator has a ``Service``; None: every attempt calls at once.
    gate: ServiceGate | None = None

    def __init__(
        self,
        *,
        mode: Literal["ordered", "unordered", "key_ordered"],
        timeout_ms: int | None,
        retry: RetryStrategy | None,
        on_error: Literal["fail", "dead_letter"],
        copy_inputs: CopyInputs,
        name: str,
        object_reuse: bool = False,
        order_key: Any = None,
        idempotency_key: Any = None,
    ) -> None:
        if mode not in ("ordered", "unordered", "key_ordered"):
            raise ConfigurationError(f"mode must be 'ordered', 'unordered' or 'key_ordered', got {mode!r}")
        if (mode == "key_ordered") != (order_key is not None):
            raise ConfigurationError(
                "mode='key_ordered' needs an order_key (a column, a tuple of columns or a function of the record)"
                if order_key is None else f"order_key is for mode='key_ordered'; mode is {mode!r}")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or timeout_ms <= 0):
            raise ConfigurationError(f"timeout_ms must be an int > 0 or None, got {timeout_ms!r}")
        if on_error not in ("fail", "dead_letter"):
            raise ConfigurationError(f"on_error must be 'fail' or 'dead_letter', got {on_error!r}")
        if type(copy_inputs) is not bool and copy_inputs != "shallow":
            raise ConfigurationError(f"copy_inputs must be True, False or 'shallow', got {copy_inputs!r}")
        if type(object_reuse) is not bool:
            raise ConfigurationError(f"object_reuse must be True or False, got {object_reuse!r}")
        if retry is not None and not isinstance(retry, RetryStrategy):
            raise ConfigurationError(f"retry must be a RetryStrategy, got {type(retry).__name__}")
        self.mode = mode
        self.order_key = None if order_key is None else order_key_of(order_key)
        self.timeout_ms = timeout_ms
        self.retry = retry if retry is not None else NoRetry()
        self.on_error = on_error
        self.copy_input = COPIERS[copy_inputs]  # None: attempts share the record's value
        self.object_reuse = object_reuse
        # How a record taken in is copied; None: the caller's object is kept (object_reuse).
        self._copy_taken: Callable[[Any, int | None], Any] | None = (
            None if object_reuse else copy_row if copy_inputs == "shallow" else copy_input)
        self.name = name
        self.queue_capacity = 1
        self._failed: RecordError | None = None
        self._restored: list[Pending] = []
        self._sequence = 0  # records taken in: the fallback idempotency key of a record without origin
        # Where a record's idempotency key is given (a column, or a function of the record)
        # instead of made from its origin (``request_keys``).
        self._given_key = None if idempotency_key is None else order_key_of(idempotency_key)

    # ------------------------------------------------------------------ lifecycle

    def _open_queue(self, size: int) -> None:
        self.queue: OrderedQueue | UnorderedQueue | KeyOrderedQueue
        if self.mode == "ordered":
            self.queue = OrderedQueue(size)
        elif self.mode == "unordered":
            self.queue = UnorderedQueue(size)
        else:
            assert self.order_key is not None
            self.queue = KeyOrderedQueue(size, self.order_key, self.name)
        # Outcomes of requests (and of timeouts) re-enter through the mailbox, in arrival order;
        # a burst of them shares a mail, and what they let out leaves at its end.
        self.completions = CoalescingInbox(self.context.mailbox_executor, f"{self.name}: async results",
                                           per_mail=_COMPLETIONS_PER_MAIL, after=self._emit_deferred)
        self._emit_pending = False  # outcomes recorded in this mail of completions, not emitted yet
        self._outcome_frees = False  # an outcome frees a request slot even if its result must wait
        self.deadlines = DeadlineQueue(self.context.processing_time)
        self._waiting: deque[Pending] = deque()
        self._failed = None
        prefix = self.context.request_key_prefix
        self._key_prefix = self.context.name if prefix is None else prefix

    def _replay_restored(self) -> None:
        """Replay what the snapshot held, in order; what does not fit waits for room."""
        for pending in self._restored:
            self._add(pending)
        self._restored = []

    @property
    def has_failed(self) -> bool:
        """True once a record failed the operator (``on_error="fail"``); nothing is emitted after."""
        return self._failed is not None

    # ------------------------------------------------------------------- elements

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        if self._copy_taken is not None and type(record.value) not in _IMMUTABLE_TYPES:
            record = self._own_copy(record)
        # _request_key(), inlined: this runs once per record
        sequence = self._sequence
        self._sequence = sequence + 1
        key: RequestKey = (self._key_prefix, record.origin, sequence) if self._given_key is None else self._key_of(record)
        # As _add does, without a Pending for a record that starts at once.
        if self._waiting or not self._try_start_new(record, key):
            self._waiting.append(Pending(record, key=key))

    def process_watermark(self, watermark: Watermark) -> None:
        self._add(Pending(watermark))

    def process_watermark_status(self, status: WatermarkStatus) -> None:
        # Queued as a watermark is, not passed on at once (Flink's way): an IDLE that overtook a
        # record in flight would let the valve downstream pass another input's watermark, and
        # the record would arrive late.
        self._add(Pending(status))

    def is_blocked(self) -> bool:
        return bool(self._waiting)

    def blocked_check(self) -> Callable[[], object]:
        # The waiting elements' count, without a Python call: asked once per record.
        return self._waiting.__len__

    def is_drained(self) -> bool:
        return not self._waiting and len(self.queue) == 0

    @property
    def in_flight(self) -> int:
        """Queue slots taken: requests, completed results waiting for their turn, watermarks and
        statuses."""
        return len(self.queue)

    @property
    def records_pending(self) -> int:
        """Records taken in whose outcome has not been emitted yet (queued or waiting for room)."""
        queued = sum(1 for entry in self.queue if isinstance(entry, RecordEntry))
        return queued + sum(1 for p in self._waiting if isinstance(p.element, Record))

    def oldest_request_started_ms(self) -> int | None:
        """When the oldest request still without an outcome started (processing time), if any."""
        started = [e.started_ms for e in self.queue
                   if isinstance(e, RecordEntry) and not e.done and e.started_ms is not None]
        return min(started) if started else None

    # ------------------------------------------------------------------ internals

    def _own_copy(self, record: Record) -> Record:
        """``record`` with a copy of its value, which the caller can no longer change."""
        assert self._copy_taken is not None
        try:
            value = self._copy_taken(record.value, record.timestamp_ms)
        except RecordError:
            # Kept as given: with copy_inputs its attempts fail to copy it, and that is its outcome.
            return record
        return Record(value, record.timestamp_ms, record.origin)

    def _request_key(self, record: Record) -> RequestKey:
        """The idempotency key of a record taken in now, as its parts; it counts as taken in."""
        sequence = self._sequence
        self._sequence += 1
        if self._given_key is not None:
            return self._key_of(record)
        prefix = self.context.request_key_prefix
        return (self.context.name if prefix is None else prefix, record.origin, sequence)

    def _key_of(self, record: Record) -> str:
        """The idempotency key the record gives (``idempotency_key``): a string that is not empty."""
        assert self._given_key is not None
        try:
            key = self._given_key(record.value)
        except Exception as error:
            raise RecordError(f"the idempotency key of a record could not be read: {error!r}", operator=self.name,
                              value=record.value, timestamp_ms=record.timestamp_ms) from error
        if not isinstance(key, str) or not key:
            raise RecordError(f"a record's idempotency key must be a string that is not empty, got {key!r}",
                              operator=self.name, value=record.value, timestamp_ms=record.timestamp_ms)
        return key

    def _add(self, pending: Pending) -> None:
        # Behind an element that waits for room, everything waits: order is kept.
        if self._waiting or not self._try_start(pending):
            self._waiting.append(pending)

    def _try_start(self, pending: Pending) -> bool:
        element = pending.element
        if isinstance(element, Record):
            return self._try_start_record(pending)
        return self._try_start_marker(element)

    def _try_start_marker(self, marker: Watermark | WatermarkStatus) -> bool:
        """Queue a watermark or a status behind everything before it; False if no room."""
        entry = WatermarkEntry(marker) if isinstance(marker, Watermark) else StatusEntry(marker)
        if not self.queue.try_put(entry):
            return False
        self._emit_completed()
        return True

    def _try_start_record(self, pending: Pending) -> bool:
        """Start the record of ``pending`` (with its attempt, deadline and key); False if no room."""
        raise NotImplementedError

    def _try_start_new(self, record: Record, key: RequestKey) -> bool:
        """Start a record just taken in (first attempt, full deadline); False if no room."""
        return self._try_start_record(Pending(record, key=key))

    def _deadline(self, remaining_ms: int | None, now: int | None = None) -> int | None:
        """A restored element keeps what was left of its deadline; a new one gets a full one."""
        if now is None:
            now = self.context.processing_time.now_ms()
        timeout_ms = self.timeout_ms if remaining_ms is None else remaining_ms
        return None if timeout_ms is None else now + timeout_ms

    def _complete_entry(self, entry: RecordEntry, kind: Outcome, payload: Any, attempts: int) -> None:
        """Record the one outcome of ``entry``; a failure fails the operator or becomes a dead letter."""
        if kind is Outcome.FAILURE:
            kind, payload = Outcome.DEAD_LETTER, self._failure(entry, payload, attempts)
        entry.kind = kind
        entry.payload = payload
        self.queue.on_complete(entry)
        fault_point = self.context.fault_point
        if fault_point is not no_fault_point:  # unarmed: no call
            fault_point("completion")

    def _failure(self, entry: RecordEntry, cause: BaseException, attempts: int) -> RecordError:
        """The error of a record that failed for good: raised, failing the operator, with
        ``on_error="fail"``; else returned, to leave as a dead letter."""
        error = self._record_error(entry.record, cause, attempts)
        if self.on_error == "fail":
            # What the burst's earlier outcomes let out leaves first, as if each had left at once.
            self._emit_deferred()
            self.metrics.failures += 1
            self._failed = error
            raise error from cause
        return error

    def _record_error(self, record: Record, cause: BaseException, attempts: int) -> RecordError:
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

    #: Whether ``_make_room`` is overridden, and so does anything: the other subclasses save its
    #: call per completion. Set for each subclass as it is made.
    _makes_room = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._makes_room = cls._make_room is not AsyncQueueOperator._make_room

    def _make_room(self) -> None:
        """Called before waiting elements are let in; a subclass may start work that frees room."""

    def _emit_deferred(self) -> None:
        """Emit what the outcomes recorded in a mail of completions let out, once for them all."""
        if self._emit_pending:
            self._emit_pending = False
            self._emit_completed(freed=self._outcome_frees)

    def _emit_completed(self, freed: bool = False) -> None:
        """Emit every completed head, then let waiting elements in as room frees."""
        if self._failed is not None:
            return  # the operator has failed: nothing more leaves it
        pop_completed = self.queue.pop_completed
        collect = self.output.collect_value
        metrics = self.metrics
        while True:
            while (entry := pop_completed()) is not None:
                if isinstance(entry, RecordEntry):
                    payload = entry.payload
                    if entry.kind is not _DEAD_LETTER and len(payload) == 1:
                        # The usual case, here and not in _emit: one result, which keeps the
                        # record's event time and origin.
                        record = entry.record
                        collect(payload[0], record.timestamp_ms, record.origin)
                        metrics.records_out += 1
                    else:
                        self._emit(entry)
                    # Entry and handler refer to each other; break the cycle so that reference
                    # counting frees them now, not the cyclic garbage collector later.
                    entry.handler = None
                else:
                    self._emit(entry)
                freed = True
            if self._makes_room:
                self._make_room()
            if not self._waiting:
                break
            # Take it out before starting it: starting a marker emits, which re-enters here.
            pending = self._waiting.popleft()
            if not self._try_start(pending):
                self._waiting.appendleft(pending)
                break
        if freed and not self._waiting:
            self.context.signal_progress()

    def _emit(self, entry: Any) -> None:
        """Emit a watermark, a status, a dead letter, or a record's results (``_emit_completed``
        emits a single result itself)."""
        if isinstance(entry, WatermarkEntry):
            self.output.emit_watermark(entry.watermark)
            return
        if isinstance(entry, StatusEntry):
            self.output.emit_watermark_status(entry.status)
            return
        record = entry.record
        if entry.kind is Outcome.DEAD_LETTER:
            error: RecordError = entry.payload
            self.metrics.dead_letters += 1
            self.output.collect_side(
                DEAD_LETTER,
                DeadLetter(
                    record.value,
                    record.timestamp_ms,
                    error.attempts or 1,
                    type(error.__cause__ or error).__name__,
                    str(error),
                    self.context.name,
                    key_text(entry.key),
                ),
            )
            return
        origin, timestamp_ms, payload = record.origin, record.timestamp_ms, entry.payload
        collect = self.output.collect_value
        # The first result keeps the record's origin, the i-th after it gets origin + (i,).
        for i, value in enumerate(payload):
            collect(value, timestamp_ms, origin if i == 0 or origin is None else (*origin, i))
        self.metrics.records_out += len(payload)

    def _snapshot_waiting(self) -> list[tuple[Any, ...]]:
        items: list[tuple[Any, ...]] = []
        for pending in self._waiting:
            element = pending.element
            if isinstance(element, Watermark):
                items.append(("watermark", element.timestamp_ms))
            elif isinstance(element, WatermarkStatus):
                items.append(("status", element.idle))
            else:
                items.append((
                    "record", element.value, element.timestamp_ms, pending.attempt, pending.remaining_ms,
                    pending.retry_in_ms, element.origin, None if pending.key is None else key_text(pending.key),
                ))
        return items

    def _restore_items(self, kind: str, state: Any | None) -> None:
        """Restore ``{"items": [...], "sequence": n}`` (the ``kind`` structure of ``state.py``), or
        the bare list of items of older snapshots.

        A state with a format version must have this release's (``check_state``). The unversioned
        states of the releases before it are plain data of the same items and are read as they
        are: items of older snapshots lack the origin and the key (six fields) or the key (seven);
        such a record gets its key now, as if taken in again.
        """
        self._restored = []
        if isinstance(state, dict) and "version" in state:
            state = check_state(kind, state)
        if isinstance(state, dict):
            items, self._sequence = state["items"], state["sequence"]
        else:
            items, self._sequence = state or (), 0
        for item in items:
            if item[0] == "watermark":
                self._restored.append(Pending(Watermark(item[1])))
            elif item[0] == "status":
                self._restored.append(Pending(WatermarkStatus(item[1])))
            else:
                _, value, timestamp_ms, attempt, remaining_ms, retry_in_ms = item[:6]
                record = Record(value, timestamp_ms, item[6] if len(item) > 6 else None)
                key = item[7] if len(item) > 7 else self._request_key(record)
                self._restored.append(Pending(record, attempt, remaining_ms, retry_in_ms=retry_in_ms, key=key))
