"""The operator contract, the context an operator runs in, and operator chains.

An operator receives elements on the mailbox thread and writes to an ``Output``. The host (the
test harness, or a Ray actor) feeds it from its default action and runs its mails.

Threading model: every method of an operator runs on the mailbox thread.

Lifecycle of an operator::

    setup(context, output) → initialize_state(state or None) → open()
      → process_* ... → end_input() → (is_drained() becomes True) → close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, Sequence

from .clock import Clock
from .elements import Record, Watermark, WatermarkStatus
from .errors import ConfigurationError, UserFunctionError, describe_value
from .mailbox_processor import MailboxExecutor
from .request_keys import RequestKey
from .timers import ProcessingTimeService

__all__ = [
    "CoroutineRunner",
    "FilterOperator",
    "FlatMapOperator",
    "MapOperator",
    "OperatorChain",
    "OperatorContext",
    "OperatorMetrics",
    "Output",
    "StreamOperator",
    "no_fault_point",
]


class Output(Protocol):
    """Where an operator writes: the main output and named side outputs."""

    def collect(self, record: Record) -> None: ...

    def collect_value(self, value: Any, timestamp_ms: int | None, origin: tuple[Any, ...] | None) -> None:
        """``collect(Record(value, timestamp_ms, origin))``; an output that keeps no record makes none."""
        ...

    def emit_watermark(self, watermark: Watermark) -> None: ...

    def emit_watermark_status(self, status: WatermarkStatus) -> None: ...

    def collect_side(self, tag: str, value: Any) -> None: ...


class CoroutineRunner(Protocol):
    """Runs coroutines for ``async def`` user functions.

    ``submit`` starts ``coro`` and calls ``on_done(result, error)`` on the mailbox thread's event
    loop when it ends; it returns a callable that cancels it. The coroutine runs in a copy of the
    context ``submit`` was called in, as an asyncio task does: that is how it sees the idempotency
    key of its request (``current_request_key()``); with ``key``, that key is the record's
    ``key`` instead.
    """

    def submit(
        self, coro: Any, on_done: Callable[[Any, BaseException | None], None], key: RequestKey | None = None,
    ) -> Callable[[], Any]: ...


@dataclass
class OperatorMetrics:
    """Counters an operator keeps; the Ray actor exports them."""

    records_in: int = 0
    records_out: int = 0
    retries: int = 0
    timeouts: int = 0
    failures: int = 0
    dead_letters: int = 0


def no_fault_point(moment: str) -> None:
    """``OperatorContext.fault_point`` while no one watches: operators compare with it and skip
    the call, so an unarmed moment costs nothing."""


@dataclass
class OperatorContext:
    """Everything an operator may use besides its output."""

    name: str
    mailbox_executor: MailboxExecutor
    processing_time: ProcessingTimeService
    clock: Clock
    coroutine_runner: CoroutineRunner | None = None
    subtask_index: int = 0
    parallelism: int = 1
    #: What the idempotency keys of async requests start with, such as ``<job>/<operator>``; None:
    #: ``name``. No subtask index: after a restore, a record may reach another subtask.
    request_key_prefix: str | None = None
    #: Called by an operator when it can take input again, or has drained after end_input.
    signal_progress: Callable[[], None] = lambda: None
    #: Called by an operator at a chaos moment (``cluster.chaos.MOMENTS``) it alone sees, such
    #: as "retry_wait" or "completion"; the host may end the process there. Operators skip the
    #: call while it is ``no_fault_point``; a host arms it by setting another callable.
    fault_point: Callable[[str], None] = no_fault_point
    #: The quota of a service, shared by the job's instances that call it: given the service's
    #: name (None: this operator's own) and its rate limit in calls per second (None: none), a
    #: ``service_quota.ServiceQuota``, or None where each instance keeps its own share.
    service_quota: Callable[[str | None, float | None], Any] | None = None
    #: Where a service's counters go, given its name: a writable memoryview of doubles, one per
    #: ``service_gate.COUNTERS``, kept where the counts outlive the process; None: in the gate.
    service_counters: Callable[[str], Any] | None = None


class StreamOperator:
    """The base of every operator; the defaults forward elements unchanged.

    Capabilities a host asks about are declared, never guessed: ``fires_on_event_time`` (records
    leave when a watermark passes, as a window's do); ``stream_task.TakesArrowBatches`` and
    ``stream_task.MergesPartials`` for whole batches and partial aggregates.
    """

    name: str = "operator"
    fires_on_event_time: ClassVar[bool] = False

    def setup(self, context: OperatorContext, output: Output) -> None:
        self.context = context
        self.output = output
        self.metrics = OperatorMetrics()

    def initialize_state(self, state: Any | None) -> None:
        """Restore from ``state`` (from ``snapshot_state``), or start fresh when it is None."""

    def open(self) -> None:
        pass

    def process_element(self, record: Record) -> None:
        self.output.collect(record)

    def process_watermark(self, watermark: Watermark) -> None:
        self.output.emit_watermark(watermark)

    def process_watermark_status(self, status: WatermarkStatus) -> None:
        self.output.emit_watermark_status(status)

    def snapshot_state(self) -> Any | None:
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete. A notification may be skipped: a later
        one covers the earlier checkpoints too, so nothing may depend on seeing each."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted; its snapshot will never be restored."""

    def end_input(self) -> None:
        pass

    def is_blocked(self) -> bool:
        """True while the operator cannot take another element (its queue is full)."""
        return False

    def blocked_check(self) -> Callable[[], object]:
        """A callable whose result is true exactly when ``is_blocked()`` is, for a caller that asks
        once per record; valid until the operator is opened again."""
        return self.is_blocked

    def is_drained(self) -> bool:
        """True when nothing is left in flight (checked after ``end_input``)."""
        return True

    def close(self) -> None:
        pass


class _FunctionOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], Any], name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigurationError(f"expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = str(name or getattr(fn, "__name__", type(self).__name__))

    def _call(self, record: Record) -> Any:
        try:
            return self.fn(record.value)
        except Exception as error:
            raise UserFunctionError(
                f"user function raised {type(error).__name__}: {error} on record "
                f"{describe_value(record.value)} (timestamp_ms={record.timestamp_ms})",
                operator=self.context.name,
                value=record.value,
                timestamp_ms=record.timestamp_ms,
            ) from error


class MapOperator(_FunctionOperator):
    """One output per input: ``fn(value)``, at the input's timestamp, with the input's origin."""

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        self.output.collect(record.with_value(self._call(record)))
        self.metrics.records_out += 1


class FilterOperator(_FunctionOperator):
    """Keeps the records for which ``fn(value)`` is true (as they are, origin included)."""

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        if self._call(record):
            self.output.collect(record)
            self.metrics.records_out += 1


class FlatMapOperator(_FunctionOperator):
    """Zero or more outputs per input: the items of ``fn(value)``.

    The ``i``-th output of an input with an origin has the origin ``origin + (i,)``: outputs of
    one input need origins of their own, and their position is what a replay gives them again.
    """

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        origin = record.origin
        for i, value in enumerate(self._call(record)):
            self.output.collect(Record(value, record.timestamp_ms, None if origin is None else (*origin, i)))
            self.metrics.records_out += 1


class _ChainingOutput:
    """Hands one operator's output straight to the next operator of the chain."""

    def __init__(self, next_operator: StreamOperator, chain_output: Output) -> None:
        self._next = next_operator
        self._chain_output = chain_output

    def collect(self, record: Record) -> None:
        self._next.process_element(record)

    def collect_value(self, value: Any, timestamp_ms: int | None, origin: tuple[Any, ...] | None) -> None:
        self._next.process_element(Record(value, timestamp_ms, origin))

    def emit_watermark(self, watermark: Watermark) -> None:
        self._next.process_watermark(watermark)

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self._next.process_watermark_status(status)

    def collect_side(self, tag: str, value: Any) -> None:
        self._chain_output.collect_side(tag, value)


class OperatorChain:
    """Operators that run one after the other in one mailbox, without copying between them.

    End of input travels down the chain: an operator gets ``end_input`` once every operator
    before it has drained, so an async operator's last results still reach the next one.
    """

    def __init__(self, operators: Sequence[StreamOperator]) -> None:
        if not operators:
            raise ConfigurationError("an operator chain needs at least one operator, got none")
        self.operators = list(operators)
        self._ended = 0  # operators that got end_input
        self._ending = False

    @property
    def name(self) -> str:
        return " -> ".join(op.name for op in self.operators)

    @property
    def head(self) -> StreamOperator:
        return self.operators[0]

    def setup(self, context_for: Callable[[int, StreamOperator], OperatorContext], output: Output) -> None:
        """Set every operator up, ``context_for(i, op)`` giving operator ``i`` its context.

        The host gives operator ``i`` the mailbox executor ``processor.executor(i)`` (and a
        processing-time service firing through it): a yield of a downstream operator must never
        run a mail of an upstream one, which may be in the middle of its own ``process_element``.
        """
        downstream: Output = output
        for i in range(len(self.operators) - 1, -1, -1):
            op = self.operators[i]
            op.setup(context_for(i, op), downstream)
            downstream = _ChainingOutput(op, output)

    def initialize_state(self, state: list[Any] | None) -> None:
        if state is not None and len(state) != len(self.operators):
            raise ConfigurationError(
                f"snapshot holds state for {len(state)} operators, but the chain has {len(self.operators)}"
            )
        for i, op in enumerate(self.operators):
            op.initialize_state(None if state is None else state[i])

    def open(self) -> None:
        # Open from the tail, so that an operator can emit into opened successors.
        for op in reversed(self.operators):
            op.open()

    def snapshot_state(self) -> list[Any]:
        return [op.snapshot_state() for op in self.operators]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_aborted(checkpoint_id)

    def process_element(self, record: Record) -> None:
        self.head.process_element(record)

    def process_watermark(self, watermark: Watermark) -> None:
        self.head.process_watermark(watermark)

    def process_watermark_status(self, status: WatermarkStatus) -> None:
        self.head.process_watermark_status(status)

    def is_blocked(self) -> bool:
        for op in self.operators:  # asked once per record: no generator
            if op.is_blocked():
                return True
        return False

    def blocked_check(self) -> Callable[[], object]:
        """``is_blocked``, or the one operator's own check when the chain has one: the same answer
        for a caller that asks once per record."""
        return self.operators[0].blocked_check() if len(self.operators) == 1 else self.is_blocked

    def end_input(self) -> None:
        self._ending = True
        self.advance_end_of_input()

    def advance_end_of_input(self) -> bool:
        """Pass end of input on as far as drained operators allow; True once all have drained."""
        if not self._ending:
            return False
        while self._ended < len(self.operators):
            op = self.operators[self._ended]
            if self._ended == 0 or self.operators[self._ended - 1].is_drained():
                self._ended += 1
                op.end_input()
            else:
                return False
        return self.operators[-1].is_drained()

    @property
    def is_finished(self) -> bool:
        return self._ending and self._ended == len(self.operators) and all(op.is_drained() for op in self.operators)

    def close(self) -> None:
        for op in self.operators:
            op.close()
