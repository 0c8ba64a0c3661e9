"""One unit of async work driven to exactly one outcome: attempts, retries, one deadline.

A *unit* is a record (``AsyncWaitOperator``) or a batch of records (``AsyncBatchWaitOperator``).
``AttemptHandler`` holds what both share: each attempt has its own ``ResultFuture``; a failed or
unwanted attempt is retried after the strategy's delay; one deadline spans every attempt, and
when it passes the user's ``timeout`` decides. Whatever the interleaving of a completion, a retry
timer and the deadline, the unit ends exactly once, in ``on_outcome``.

Every future of a unit carries the idempotency keys of its records, and every call of the user's
function for the unit (each attempt, and the timeout) runs with them as the current request's
(``request_keys``), so a retry and a replay after a restore present the same keys.

The rule at the deadline is Flink's ``timerTriggered``: an attempt whose future the user already
completed is not timed out, even though its result (which re-enters as a mail) has not been seen
yet. The result decides then, unless it asks for a retry: the deadline has passed, so the unit
times out instead.

Threading model: every method runs on the mailbox thread; only ``ResultFuture`` completions
come from other threads, and they arrive here as mails.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence, Union

from .async_function import ResultFuture, results_error
from .errors import RecordError, describe_value
from .mailbox_processor import CoalescingInbox
from .operator import OperatorContext, OperatorMetrics, no_fault_point
from .retry import NoRetry, RetryStrategy
from .service_gate import ServiceGate
from .timers import DeadlineQueue, TimerHandle

__all__ = [
    "ATTEMPT_SLOTS", "COPIERS", "DEAD_LETTER", "AttemptHandler", "CopyInputs", "CoroutineCall", "DeadLetter", "Outcome",
    "copy_input", "copy_row",
]

#: The side output that receives dead letters.
DEAD_LETTER = "dead_letter"


class Outcome(enum.StrEnum):
    """How a record's requests ended: the one outcome each record gets."""

    RESULT = "result"  # the function's results
    FALLBACK = "fallback"  # the fallback's results, after a timeout or the last failed attempt
    FAILURE = "failure"  # failed for good: the operator fails, or it becomes a dead letter
    DEAD_LETTER = "dead_letter"  # a failure kept as a dead letter (on_error="dead_letter")


# The members as module constants, for the paths that run once per record: on Python 3.11,
# reading ``Outcome.RESULT`` goes through a descriptor (about 70 ns against 10 for a global).
_RESULT, _FALLBACK, _FAILURE, _DEAD_LETTER = Outcome.RESULT, Outcome.FALLBACK, Outcome.FAILURE, Outcome.DEAD_LETTER

# Values of these exact types cannot be changed in place, so an attempt may share them.
_IMMUTABLE_TYPES = frozenset({int, float, complex, str, bytes, bool, type(None), frozenset, range})
# Scalars of a row (Spark's timestamps, dates, decimals among them) that cannot change in place:
# a dict of only these is copied by ``dict(value)``, about ten times faster than ``deepcopy``.
_IMMUTABLE_SCALARS = _IMMUTABLE_TYPES | {datetime.datetime, datetime.date, datetime.time, datetime.timedelta,
                                         decimal.Decimal}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that failed for good, with why and after how many attempts."""

    value: Any
    timestamp_ms: int | None
    attempts: int
    error_type: str
    error: str
    operator: str
    #: The idempotency key of the record's requests (``request_keys``): what
    #: ``rerun_dead_letters`` sends it again with.
    request_key: str | None = None

    def to_state(self) -> tuple[Any, ...]:
        """As plain data, a side output's ``("dead_letter", ...)`` in ``operators.state``."""
        return ("dead_letter", self.value, self.timestamp_ms, self.attempts, self.error_type, self.error, self.operator,
                self.request_key)

    @classmethod
    def from_state(cls, state: tuple[Any, ...]) -> DeadLetter:
        """The dead letter that ``to_state`` wrote."""
        return cls(*state[1:])


def copy_input(value: Any, timestamp_ms: int | None) -> Any:
    """A private copy of ``value`` for one attempt (the value itself when it is immutable).

    The operator keeps the original for retries and snapshots; a user function that changes its
    argument must change neither. Raises ``RecordError`` when the value cannot be copied.
    """
    if type(value) in _IMMUTABLE_TYPES:
        return value
    if type(value) is dict and _IMMUTABLE_SCALARS.issuperset(map(type, value.values())):
        return dict(value)  # keys are hashable, so immutable in practice; the values are
    try:
        return copy.deepcopy(value)
    except Exception as error:
        raise RecordError(
            f"input {describe_value(value)} (timestamp_ms={timestamp_ms}) cannot be copied for an attempt: "
            f"{type(error).__name__}: {error}; expected a value that copy.deepcopy() accepts, "
            "or copy_inputs=False and a function that does not change its argument",
            value=value,
            timestamp_ms=timestamp_ms,
        ) from error


def copy_row(value: Any, timestamp_ms: int | None) -> Any:
    """``dict(value)`` for a dict whose values are all immutable scalars (``copy_inputs="shallow"``),
    without looking at each value; anything else as ``copy_input`` copies it."""
    return dict(value) if type(value) is dict else copy_input(value, timestamp_ms)


#: ``copy_inputs``: True copies each attempt's input (``copy_input``), ``"shallow"`` copies a dict
#: of scalars with ``dict()`` without checking its values (``copy_row``), False shares it.
CopyInputs = Union[bool, Literal["shallow"]]

#: What each ``copy_inputs`` setting copies an attempt's input with; None shares it.
COPIERS: dict[Any, Callable[[Any, int | None], Any] | None] = {True: copy_input, "shallow": copy_row, False: None}


class CoroutineCall:
    """The attempt in flight of a unit whose function is an ``async def`` that the operator runs
    itself: what a ``ResultFuture`` would be, with nothing more than the handler needs.

    ``done`` once its coroutine has ended or the attempt was abandoned; ``cancel`` stops the
    coroutine (the coroutine runner's handle).
    """

    __slots__ = ("done", "cancel")

    def __init__(self) -> None:
        self.done = False
        self.cancel: Callable[[], Any] | None = None

    def abandon(self) -> None:
        self.done = True
        if self.cancel is not None:
            self.cancel()


class _Operator(Protocol):
    """What an ``AttemptHandler`` needs from its operator."""

    context: OperatorContext
    metrics: OperatorMetrics
    retry: RetryStrategy
    completions: CoalescingInbox
    deadlines: DeadlineQueue
    gate: ServiceGate | None
    _failed: RecordError | None  # set once a record failed the operator

    @property
    def has_failed(self) -> bool: ...


class _State(enum.Enum):
    RUNNING = 1  # an attempt is in flight
    WAITING_RETRY = 2  # waiting for the retry timer
    TIMING_OUT = 3  # the deadline passed; waiting for the user's timeout() to complete
    DONE = 4


# Module constants: an Enum member read from its class costs four times a global's, and a
# record's attempt reads its state a few times.
_RUNNING, _WAITING_RETRY, _TIMING_OUT, _DONE = _State.RUNNING, _State.WAITING_RETRY, _State.TIMING_OUT, _State.DONE


#: The fields of an ``AttemptHandler``, which each concrete subclass has among its ``__slots__``.
ATTEMPT_SLOTS = (
    "op", "attempt", "deadline_ms", "state", "future", "timeout_timer", "retry_timer", "retry_due_ms", "deadline_passed",
    "hedge",
)


class AttemptHandler:
    """Drives one unit through attempts, retries and its deadline, to exactly one outcome.

    Subclasses say how to prepare the inputs of an attempt (and of the timeout), make its
    future (with the unit's idempotency keys), start it, check its results, call the user's
    timeout, and what to do with the outcome (``kind`` is ``result``, ``fallback`` or
    ``failure``).
    """

    # No slots of its own, so that a subclass may also be a queue entry (``RecordEntry``, which
    # has slots): each concrete subclass declares ``ATTEMPT_SLOTS`` among its own. (Hidden from
    # mypy, which would take the empty slots for the class's only attributes.)
    if not TYPE_CHECKING:
        __slots__ = ()

    def __init__(self, op: _Operator, attempt: int, deadline_ms: int | None) -> None:
        self.op = op
        self.attempt = attempt
        self.deadline_ms = deadline_ms
        self.state = _RUNNING
        self.future: ResultFuture | CoroutineCall | None = None
        self.timeout_timer: TimerHandle | None = None
        self.retry_timer: TimerHandle | None = None
        self.retry_due_ms: int | None = None
        # The deadline fired while a completed attempt's result was still on its way.
        self.deadline_passed = False
        self.hedge: ResultFuture | CoroutineCall | None = None  # a second call of this attempt (Hedge)

    # ----------------------------------------------------------------- subclass hooks

    def prepare_inputs(self) -> Any:
        """The inputs of the next attempt (private copies); may raise ``RecordError``."""
        raise NotImplementedError

    def prepare_timeout_inputs(self) -> Any:
        """The inputs of the user's timeout (private copies); may raise ``RecordError``."""
        return self.prepare_inputs()

    def new_future(self, deliver: Callable[[Sequence[Any] | None, BaseException | None], None]) -> ResultFuture:
        """The future of an attempt or of the timeout, with the unit's idempotency keys."""
        return ResultFuture(deliver)

    def call_function(self, inputs: Any, future: ResultFuture) -> None:
        raise NotImplementedError

    def call_timeout(self, inputs: Any, future: ResultFuture) -> None:
        raise NotImplementedError

    #: Whether ``check_results`` is overridden, and so looks at anything: the other subclasses
    #: save its call per attempt. Set for each subclass as it is made.
    checks_results = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.checks_results = cls.check_results is not AttemptHandler.check_results

    def check_results(self, results: Sequence[Any]) -> BaseException | None:
        """An error if the results do not have the expected shape; they count as a failure."""
        return None

    def should_retry(self, results: Sequence[Any] | None, error: BaseException | None) -> bool:
        return self.op.retry.should_retry(results, error)

    def on_outcome(self, kind: Outcome, payload: Any) -> None:
        raise NotImplementedError

    # --------------------------------------------------------------------- driving

    def start(self, retry_in_ms: int | None = None, now: int | None = None) -> None:
        """Run the first attempt; a restored element resumes where its snapshot left it.

        ``retry_in_ms``: the element was waiting for a retry; it waits the rest of its backoff
        (``self.attempt`` is the attempt that runs then). A restored element whose deadline has
        already passed gets its timeout, not a fresh attempt. ``now``: the processing time, if
        the caller has just read it.
        """
        if now is None:
            now = self.op.context.processing_time.now_ms()
        if self.deadline_ms is not None:
            if self.deadline_ms <= now:
                self.time_out()
                return
            if not self.op.deadlines.add(self):
                self.timeout_timer = self.op.context.processing_time.register_timer(self.deadline_ms, self.on_timeout)
        if retry_in_ms is not None:
            self.attempt -= 1  # on_retry_timer counts the attempt it starts
            self._wait_for_retry(now + retry_in_ms)
            return
        if self.state is _RUNNING:  # a deadline already past may have fired synchronously
            self.invoke()

    def invoke(self) -> None:
        gate = self.op.gate
        if gate is not None and not gate.admit(self):
            return  # the gate calls it when the service may be called, or ends it
        self.call()

    def call(self) -> None:
        """Call the user's function for the current attempt (the gate, if any, has let it through)."""
        attempt = self.attempt
        completions = self.op.completions
        try:
            inputs = self.prepare_inputs()
        except RecordError as error:
            # Final: another attempt would fail to copy the same input again.
            self.future = None
            completions.put(self.on_input_error, attempt, error)
            return

        gate = self.op.gate
        if gate is not None and gate.hedge is not None:
            self.future = self._call_told_by_identity(inputs)
            return

        def deliver(results: Sequence[Any] | None, error: BaseException | None) -> None:
            completions.put(self.on_attempt_complete, attempt, results, error)

        self.future = future = self.new_future(deliver)
        try:
            future.call_in_request(self.call_function, inputs, future)
        except Exception as error:  # the user's invoke raised before starting a request
            future.complete_exceptionally(error)

    # ------------------------------------------------------------------ hedging

    @property
    def is_calling(self) -> bool:
        """True while a call of the current attempt is in flight, without an answer yet."""
        return self.state is _RUNNING and self.future is not None and not self.future.done

    def start_hedge(self) -> bool:
        """Start a second call of the current attempt, with the same idempotency key; False if
        its input cannot be copied (the first call goes on alone)."""
        try:
            inputs = self.prepare_inputs()
        except RecordError:
            return False
        self.hedge = self._call_told_by_identity(inputs)
        return True

    def _call_told_by_identity(self, inputs: Any) -> ResultFuture | CoroutineCall:
        """A call whose answer comes back with the call itself (``on_call_complete``): with a
        hedge, an attempt has two calls, and only the first answer counts."""
        completions = self.op.completions
        holder: list[ResultFuture] = []

        def deliver(results: Sequence[Any] | None, error: BaseException | None) -> None:
            completions.put(self.on_call_complete, holder[0], results, error)

        future = self.new_future(deliver)
        holder.append(future)
        try:
            future.call_in_request(self.call_function, inputs, future)
        except Exception as error:
            future.complete_exceptionally(error)
        return future

    def on_call_complete(
        self, call: Any, results: Sequence[Any] | None, error: BaseException | None, raw: Any = None,
    ) -> None:
        """The answer of one of the attempt's calls (with hedging): the first of the two counts,
        and the other is cancelled; an answer of a call the attempt has left is ignored. ``raw``:
        what the call's coroutine returned, before the function's ``finish`` (for the cache)."""
        if self.op._failed is not None or self.state is not _RUNNING:
            return
        gate = self.op.gate
        assert gate is not None
        if call is self.future:
            hedge, self.hedge = self.hedge, None
            if hedge is not None:
                hedge.abandon()
                gate.hedge_ended(self, won=False)
        elif call is not None and call is self.hedge:
            primary, self.hedge, self.future = self.future, None, call
            if primary is not None:
                primary.abandon()
            gate.hedge_ended(self, won=True)
        else:
            return  # a call of an earlier attempt, or one cancelled
        if raw is not None and error is None:
            gate.note_raw(self, raw)
        self.on_attempt_complete(self.attempt, results, error)

    def on_input_error(self, attempt: int, error: RecordError) -> None:
        if self.op.has_failed or self.state is not _RUNNING or attempt != self.attempt:
            return
        self.finish(_FAILURE, error)

    def on_attempt_complete(self, attempt: int, results: Sequence[Any] | None, error: BaseException | None) -> None:
        # A completion of an older attempt, or one that arrives after the timeout fired or after
        # the outcome was decided (or after the operator failed), must not produce an outcome.
        if self.op._failed is not None or self.state is not _RUNNING or attempt != self.attempt:
            return  # (_failed: has_failed without the property's call, once per request)
        gate = self.op.gate
        if gate is not None and gate.call_ended(self, error, results):
            return  # an overload answer: the gate sends the same attempt again
        if error is None and results is not None and self.checks_results:
            error = self.check_results(results)
            if error is not None:
                results = None
        strategy = self.op.retry
        # NoRetry never retries: its check is left out, once per request.
        if type(strategy) is not NoRetry and strategy.can_retry(self.attempt) and self.should_retry(results, error):
            if self.deadline_passed:
                # The deadline fired while this result was on its way; no attempt may start
                # after it, so the timeout decides.
                self.time_out()
                return
            self.op.metrics.retries += 1
            now = self.op.context.processing_time.now_ms()
            self._wait_for_retry(now + strategy.delay_ms(self.attempt))
            return
        if error is not None:
            self.finish(_FAILURE, error)
        else:
            self.finish(_RESULT, results)

    def _wait_for_retry(self, due_ms: int) -> None:
        self.state = _WAITING_RETRY
        self.retry_due_ms = due_ms
        self.retry_timer = self.op.context.processing_time.register_timer(due_ms, self.on_retry_timer)
        fault_point = self.op.context.fault_point
        if fault_point is not no_fault_point:
            fault_point("retry_wait")

    def on_retry_timer(self, _timestamp_ms: int = 0) -> None:
        if self.op.has_failed or self.state is not _WAITING_RETRY:
            return
        self.retry_timer = None
        self.retry_due_ms = None
        self.attempt += 1
        self.state = _RUNNING
        self.invoke()

    def on_timeout(self, _timestamp_ms: int = 0) -> None:
        if self.op.has_failed or self.state in (_DONE, _TIMING_OUT):
            return  # a timeout after the outcome is a no-op
        if self.state is _RUNNING and self.future is not None and self.future.done:
            # The user completed this attempt before the deadline; its result mail decides.
            self.deadline_passed = True
            return
        self.time_out()

    def time_out(self, count: bool = True) -> None:
        """End the attempts at the deadline: the user's ``timeout()`` decides (``count``: as a
        timeout in the metrics; not for a record the circuit breaker sends there)."""
        if self.retry_timer is not None:
            self.retry_timer.cancel()
            self.retry_timer = None
        if self.future is not None:
            self.future.abandon()
        if self.hedge is not None:
            self.hedge.abandon()
            self.hedge = None
        gate = self.op.gate
        if gate is not None:
            gate.forget(self, cut_off=self.future is not None)
        self.state = _TIMING_OUT
        if count:
            self.op.metrics.timeouts += 1
        completions = self.op.completions

        def deliver(results: Sequence[Any] | None, error: BaseException | None) -> None:
            completions.put(self.on_timeout_complete, results, error)

        try:
            # Before the future: a batch leaves out the records that cannot be copied, and its
            # future's keys must be those of the values its timeout gets.
            inputs = self.prepare_timeout_inputs()
        except RecordError as error:
            ResultFuture(deliver).complete_exceptionally(error)
            return
        future = self.new_future(deliver)
        try:
            future.call_in_request(self.call_timeout, inputs, future)
        except Exception as error:
            future.complete_exceptionally(error)

    def on_timeout_complete(self, results: Sequence[Any] | None, error: BaseException | None) -> None:
        if self.op.has_failed or self.state is not _TIMING_OUT:
            return
        if error is None and results is not None and self.checks_results:
            error = self.check_results(results)
        if error is not None:
            self.finish(_FAILURE, error)
        else:
            self.finish(_FALLBACK, results)

    def on_circuit_open(self, attempt: int, error: BaseException) -> None:
        """The service's circuit breaker is open: the attempt ends without a call, in the
        fallback (the user's ``timeout()``) or in ``error``, as the breaker says."""
        if self.op.has_failed or self.state is not _RUNNING or attempt != self.attempt:
            return
        gate = self.op.gate
        if gate is not None and gate.service.breaker is not None and gate.service.breaker.when_open == "fallback":
            self.time_out(count=False)
        else:
            self.finish(_FAILURE, error)

    def finish(self, kind: Outcome, payload: Any) -> None:
        self.state = _DONE
        gate = self.op.gate
        if gate is not None:
            gate.forget(self)
        self.future = None  # its delivery closure refers back to this handler
        timer = self.timeout_timer
        if timer is not None:
            self.timeout_timer = None
            timer.cancel()
        if self.retry_timer is not None:
            self.retry_timer.cancel()
        self.on_outcome(kind, payload)

    def coroutine_ended(self, result: Any, error: BaseException | None) -> None:
        """The coroutine of the attempt in flight ended (a ``CoroutineCall``'s): deliver its outcome.

        Ignored once the attempt is abandoned (its deadline passed), like a late completion of a
        ``ResultFuture``: a coroutine may swallow its cancellation and return anyway.
        """
        call = self.future
        if not isinstance(call, CoroutineCall) or call.done or self.state is not _RUNNING:
            return
        call.done = True
        if error is None and type(result) is not list:  # a list is right: no call to say so
            error = results_error(result, "the return value of an async def")
        self.op.completions.put(self.on_attempt_complete, self.attempt, None if error is not None else list(result), error)

    @property
    def is_done(self) -> bool:
        """True once the outcome is decided."""
        return self.state is _DONE

    def snapshot_attempt(self) -> int:
        """The attempt a restore should run: the one in flight, or the next after a wait."""
        return self.attempt + 1 if self.state is _WAITING_RETRY else self.attempt

    def remaining_ms(self, now_ms: int) -> int | None:
        return None if self.deadline_ms is None else max(0, self.deadline_ms - now_ms)

    def retry_in_ms(self, now_ms: int) -> int | None:
        """While waiting for a retry, the rest of the backoff; else None."""
        if self.state is not _WAITING_RETRY or self.retry_due_ms is None:
            return None
        return max(0, self.retry_due_ms - now_ms)
