"""Watermarks: generators, idleness, and the minimum over inputs.

- ``BoundedOutOfOrdernessWatermarks``: event time runs ``out_of_orderness_ms`` behind the largest
  timestamp seen (Flink's ``BoundedOutOfOrdernessWatermarks``).
- ``WatermarksWithIdleness``: wraps a generator; an input with no records for ``idleness_ms`` of
  processing time says it is idle, so that it holds back no one's watermark. It judges by the
  time of the last record, so a steady stream never flips between idle and active.
- ``TimestampsAndWatermarksOperator``: the operator that runs a generator in a pipeline: it
  stamps records with their event time and emits the generator's watermarks every
  ``interval_ms`` of processing time (Flink's ``TimestampsAndWatermarksOperator``).
- ``StatusWatermarkValve``: an operator with N inputs forwards the minimum of their watermarks,
  leaving out idle and ended inputs; it never goes backwards, says IDLE once when every input is
  idle and ACTIVE once when one comes back (Flink's ``StatusWatermarkValve``).

Generators and the valve return the elements to forward (``Watermark`` and ``WatermarkStatus``),
in order, so that a host needs no callbacks.

Threading model: not thread-safe; the mailbox thread owns them.

>>> valve = StatusWatermarkValve(2)
>>> valve.input_watermark(0, 10), valve.input_watermark(1, 7)
([], [Watermark(timestamp_ms=7)])
>>> valve.input_watermark_status(1, idle=True)
[Watermark(timestamp_ms=10)]
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .clock import Clock
from .elements import MAX_WATERMARK, MIN_TIMESTAMP, Record, StreamElement, Watermark, WatermarkStatus
from .errors import ConfigurationError, SchemaError, StateFormatError, UserFunctionError, describe_value
from .operator import OperatorContext, Output, StreamOperator
from .timers import TimerHandle

__all__ = [
    "BoundedOutOfOrdernessWatermarks",
    "StatusWatermarkValve",
    "TimestampsAndWatermarksOperator",
    "WatermarkGenerator",
    "WatermarksWithIdleness",
]


def _non_negative_ms(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be an int of milliseconds >= 0, got {value!r}")
    return value


class WatermarkGenerator(Protocol):
    """Sees each record's timestamp; on a periodic tick says which elements to emit."""

    def on_event(self, timestamp_ms: int) -> None: ...

    def on_periodic_emit(self) -> list[StreamElement]: ...


class BoundedOutOfOrdernessWatermarks:
    """Watermark = largest timestamp seen − ``out_of_orderness_ms`` − 1; emitted only when it advances.

    A record at most ``out_of_orderness_ms`` behind the largest timestamp is never late. The
    record that brought the largest timestamp, as the caller gives it to ``on_event``, is kept as
    ``max_record``: one absurd timestamp (a row dated 9999-12-31) moves the watermark as far as it
    goes and makes every later record late, and that record is what the late accounting names.

    >>> g = BoundedOutOfOrdernessWatermarks(100)
    >>> g.on_periodic_emit()
    []
    >>> g.on_event(1000, "row 0"); g.on_event(900, "row 1"); g.on_periodic_emit()
    [Watermark(timestamp_ms=899)]
    >>> g.on_periodic_emit(), g.max_record
    ([], 'row 0')
    """

    max_record: Any = None  # also for a generator pickled before it kept one (a checkpoint's)

    def __init__(self, out_of_orderness_ms: int) -> None:
        self.out_of_orderness_ms = _non_negative_ms("out_of_orderness_ms", out_of_orderness_ms)
        self.max_timestamp_ms: int | None = None
        #: What ``on_event`` was told of the record with the largest timestamp (None if nothing).
        self.max_record = None
        self._emitted_ms = MIN_TIMESTAMP

    def on_event(self, timestamp_ms: int, record: Any = None) -> None:
        if self.max_timestamp_ms is None or timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = timestamp_ms
            self.max_record = record

    def snapshot_state(self) -> dict[str, Any]:
        """The largest timestamp and the last watermark emitted, as plain data (``max_record``
        is the caller's, who keeps it as it sees fit)."""
        return {"max_timestamp_ms": self.max_timestamp_ms, "emitted_ms": self._emitted_ms}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.max_timestamp_ms, self._emitted_ms = state["max_timestamp_ms"], state["emitted_ms"]

    def current_watermark_ms(self) -> int | None:
        """The watermark the records so far allow, or None before the first record."""
        if self.max_timestamp_ms is None:
            return None
        return self.max_timestamp_ms - self.out_of_orderness_ms - 1

    def on_periodic_emit(self) -> list[StreamElement]:
        wm = self.current_watermark_ms()
        if wm is None or wm <= self._emitted_ms:
            return []
        self._emitted_ms = wm
        return [Watermark(wm)]

    def __repr__(self) -> str:
        return f"BoundedOutOfOrdernessWatermarks(out_of_orderness_ms={self.out_of_orderness_ms})"


class WatermarksWithIdleness:
    """Marks the input idle after ``idleness_ms`` of processing time without records.

    While idle it emits no watermarks; the next record makes it active again, and the next tick
    says so (``WatermarkStatus(idle=False)``) before any watermark.

    The first tick after records never says idle, however late it comes: it emits the watermark
    those records allow, which idleness would otherwise swallow (and with it the windows it
    closes). Flink's ``IdlenessTimer`` does the same: it never reports idle on its first check
    after activity.

    >>> from actorflow.operators.clock import ManualClock
    >>> clock = ManualClock(0)
    >>> g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=clock)
    >>> g.on_event(50); g.on_periodic_emit()
    [Watermark(timestamp_ms=49)]
    >>> clock.advance_to(100); g.on_periodic_emit()
    [WatermarkStatus(idle=True)]
    >>> g.on_event(60); g.on_periodic_emit()
    [WatermarkStatus(idle=False), Watermark(timestamp_ms=59)]
    """

    _keeps_records = False  # a generator pickled before records were passed on (a checkpoint's)

    def __init__(self, watermarks: WatermarkGenerator, idleness_ms: int, clock: Clock | None = None) -> None:
        if isinstance(idleness_ms, bool) or not isinstance(idleness_ms, int) or idleness_ms <= 0:
            raise ConfigurationError(f"idleness_ms must be an int of milliseconds > 0, got {idleness_ms!r}")
        self.watermarks = watermarks
        self._keeps_records = isinstance(watermarks, (BoundedOutOfOrdernessWatermarks, WatermarksWithIdleness))
        self.idleness_ms = idleness_ms
        self._clock = clock
        self._last_activity_ms: int | None = None
        self._unseen_activity = False  # records came since the last tick
        self.is_idle = False

    def bind_clock(self, clock: Clock) -> None:
        """Use ``clock`` if none was given (``TimestampsAndWatermarksOperator`` passes its own)."""
        if self._clock is None:
            self._clock = clock

    def _now_ms(self) -> int:
        if self._clock is None:
            raise ConfigurationError("WatermarksWithIdleness has no clock; pass clock= or run it in TimestampsAndWatermarksOperator")
        return self._clock.now_ms()

    @property
    def max_record(self) -> Any:
        """The wrapped generator's ``max_record``, where it keeps one."""
        return getattr(self.watermarks, "max_record", None)

    def on_event(self, timestamp_ms: int, record: Any = None) -> None:
        if record is not None and self._keeps_records:
            self.watermarks.on_event(timestamp_ms, record)  # type: ignore[call-arg]
        else:
            self.watermarks.on_event(timestamp_ms)  # a generator of the user's takes the timestamp alone
        self._last_activity_ms = self._now_ms()
        self._unseen_activity = True

    def on_periodic_emit(self) -> list[StreamElement]:
        now = self._now_ms()
        if self._last_activity_ms is None:
            self._last_activity_ms = now  # quiet from the first look on
        fresh, self._unseen_activity = self._unseen_activity, False
        if not fresh and now - self._last_activity_ms >= self.idleness_ms:
            if self.is_idle:
                return []
            self.is_idle = True
            return [WatermarkStatus(True)]
        out: list[StreamElement] = []
        if self.is_idle:
            self.is_idle = False
            out.append(WatermarkStatus(False))
        out.extend(self.watermarks.on_periodic_emit())
        return out

    def __repr__(self) -> str:
        return f"WatermarksWithIdleness({self.watermarks!r}, idleness_ms={self.idleness_ms})"


class TimestampsAndWatermarksOperator(StreamOperator):
    """Gives records their event time and emits watermarks from a generator, periodically.

    - ``timestamp_fn(value) -> ms`` gives a record its event time; without it the record's own
      ``timestamp_ms`` is used. Either way a record without an int event time is refused.
    - Every ``interval_ms`` of processing time the generator is asked what to emit (watermarks,
      and idle/active status with ``WatermarksWithIdleness``).
    - Watermarks from upstream are dropped, as this operator makes its own; only the final one
      (``MAX_WATERMARK``, the end of event time) passes. At the end of input the generator has
      its last say.
    - The generator is not in snapshots: after a restore, watermarks start again from the
      records that follow, as in Flink.

    >>> from actorflow.operators import OperatorHarness
    >>> op = TimestampsAndWatermarksOperator(BoundedOutOfOrdernessWatermarks(10), timestamp_fn=lambda v: v["ts"], interval_ms=100)
    >>> h = OperatorHarness(op)
    >>> h.process_element({"ts": 50}); h.set_processing_time(100)
    >>> h.output
    [Record(value={'ts': 50}, timestamp_ms=50), Watermark(timestamp_ms=39)]
    """

    def __init__(
        self,
        generator: WatermarkGenerator,
        *,
        timestamp_fn: Callable[[Any], int] | None = None,
        interval_ms: int = 200,
        name: str = "watermarks",
    ) -> None:
        if not hasattr(generator, "on_event") or not hasattr(generator, "on_periodic_emit"):
            raise ConfigurationError(f"generator must have on_event and on_periodic_emit, got {type(generator).__name__}")
        if timestamp_fn is not None and not callable(timestamp_fn):
            raise ConfigurationError(f"timestamp_fn must be a callable, got {type(timestamp_fn).__name__}")
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms <= 0:
            raise ConfigurationError(f"interval_ms must be an int of milliseconds > 0, got {interval_ms!r}")
        self.generator = generator
        self.timestamp_fn = timestamp_fn
        self.interval_ms = interval_ms
        self.name = name
        self._tick: TimerHandle | None = None

    def setup(self, context: OperatorContext, output: Output) -> None:
        super().setup(context, output)
        self._tick = None
        bind_clock = getattr(self.generator, "bind_clock", None)
        if bind_clock is not None:
            bind_clock(context.clock)  # idleness is judged by the operator's processing time

    def open(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        pts = self.context.processing_time
        self._tick = pts.register_timer(pts.now_ms() + self.interval_ms, self._on_tick)

    def _on_tick(self, _: int) -> None:
        self._emit(self.generator.on_periodic_emit())
        self._schedule()

    def _emit(self, elements: list[StreamElement]) -> None:
        for e in elements:
            if isinstance(e, Watermark):
                self.output.emit_watermark(e)
            elif isinstance(e, WatermarkStatus):
                self.output.emit_watermark_status(e)

    def process_element(self, record: Record) -> None:
        self.metrics.records_in += 1
        if self.timestamp_fn is not None:
            try:
                ts: Any = self.timestamp_fn(record.value)
            except Exception as error:
                raise UserFunctionError(
                    f"timestamp_fn raised {type(error).__name__}: {error} on record {describe_value(record.value)}",
                    operator=self.context.name, value=record.value,
                ) from error
        else:
            ts = record.timestamp_ms
        if type(ts) is not int:
            raise SchemaError(
                f"{self.context.name}: record {describe_value(record.value)} has event time {ts!r}; "
                "a watermark generator needs an int timestamp on every record"
            )
        self.generator.on_event(ts)
        self.output.collect(record if ts == record.timestamp_ms else Record(record.value, ts, record.origin))
        self.metrics.records_out += 1

    def process_watermark(self, watermark: Watermark) -> None:
        if watermark.timestamp_ms == MAX_WATERMARK:
            self.output.emit_watermark(watermark)

    def process_watermark_status(self, status: WatermarkStatus) -> None:
        pass  # this operator decides idleness from its own input

    def end_input(self) -> None:
        self._emit(self.generator.on_periodic_emit())
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None


class StatusWatermarkValve:
    """The watermark and status of an operator with ``num_inputs`` inputs.

    - The output watermark is the minimum over *aligned* inputs: active, not ended, and not behind
      the last output watermark. An input back from idleness behind the output joins again once it
      catches up (its records until then are late, as in Flink), so it cannot hold the others back.
    - The output never goes backwards, and repeats nothing.
    - When the last active input goes idle, the valve first emits the largest watermark of its live
      inputs (nobody holds it back any more), then ``WatermarkStatus(idle=True)``, once.
    - A status ACTIVE, or a watermark, from an idle input makes it active; the valve says
      ``WatermarkStatus(idle=False)`` once if it was idle.
    - An input that ended holds nothing back; when every input has ended the valve emits nothing
      more (the end of input is the host's to handle).

    >>> v = StatusWatermarkValve(2)
    >>> v.input_watermark(0, 5), v.input_watermark(1, 3), v.input_ended(1)
    ([], [Watermark(timestamp_ms=3)], [Watermark(timestamp_ms=5)])
    """

    def __init__(self, num_inputs: int) -> None:
        if isinstance(num_inputs, bool) or not isinstance(num_inputs, int) or num_inputs <= 0:
            raise ConfigurationError(f"num_inputs must be an int > 0, got {num_inputs!r}")
        self.num_inputs = num_inputs
        self._watermarks = [MIN_TIMESTAMP] * num_inputs
        self._idle = [False] * num_inputs
        self._ended = [False] * num_inputs
        self._aligned = [True] * num_inputs
        self.current_watermark_ms = MIN_TIMESTAMP
        self.is_idle = False

    @property
    def has_event_time(self) -> bool:
        """Whether any input has said a watermark, passed on or not: the records carry event
        time, and the end of every input must end it (the output may never have moved, if
        another input ended without a word)."""
        return any(w > MIN_TIMESTAMP for w in self._watermarks)

    def input_watermark(self, channel: int, timestamp_ms: int) -> list[StreamElement]:
        """Input ``channel`` says its event time reached ``timestamp_ms``."""
        self._check(channel)
        if self._ended[channel]:
            return []
        out: list[StreamElement] = []
        if self._idle[channel]:
            out.extend(self.input_watermark_status(channel, idle=False))
        if timestamp_ms > self._watermarks[channel]:
            self._watermarks[channel] = timestamp_ms
            if timestamp_ms >= self.current_watermark_ms:
                self._aligned[channel] = True
            self._advance_min(out)
        return out

    def input_watermark_status(self, channel: int, idle: bool) -> list[StreamElement]:
        """Input ``channel`` became idle (``idle=True``) or active again."""
        self._check(channel)
        if self._ended[channel] or self._idle[channel] == idle:
            return []
        out: list[StreamElement] = []
        self._idle[channel] = idle
        if idle:
            self._aligned[channel] = False
            self._after_input_left(channel, out)
        else:
            self._aligned[channel] = self._watermarks[channel] >= self.current_watermark_ms
            if self.is_idle:
                self.is_idle = False
                out.append(WatermarkStatus(False))
        return out

    def input_ended(self, channel: int) -> list[StreamElement]:
        """Input ``channel`` ended: it holds nothing back any more."""
        self._check(channel)
        if self._ended[channel]:
            return []
        out: list[StreamElement] = []
        was_idle = self._idle[channel]
        self._ended[channel] = True
        self._aligned[channel] = False
        if not all(self._ended) and not was_idle:
            self._after_input_left(channel, out)
        return out

    # ------------------------------------------------------------------ snapshot

    def snapshot_state(self) -> dict[str, Any]:
        """The valve as plain data (``operators.state``, the instance's ``"valve"``).

        >>> v = StatusWatermarkValve(2)
        >>> v.input_watermark(0, 5), v.input_watermark_status(1, idle=True)
        ([], [Watermark(timestamp_ms=5)])
        >>> restored = StatusWatermarkValve(2)
        >>> restored.restore_state(v.snapshot_state()); restored.input_watermark(0, 8)
        [Watermark(timestamp_ms=8)]
        """
        return {
            "watermarks": list(self._watermarks), "idle": list(self._idle), "ended": list(self._ended),
            "aligned": list(self._aligned), "current_watermark_ms": self.current_watermark_ms, "is_idle": self.is_idle,
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take back what ``snapshot_state`` wrote, of a valve with as many inputs."""
        if len(state["watermarks"]) != self.num_inputs:
            raise StateFormatError(
                f"the valve's state has {len(state['watermarks'])} inputs, but this valve has {self.num_inputs}"
            )
        self._watermarks = list(state["watermarks"])
        self._idle, self._ended, self._aligned = list(state["idle"]), list(state["ended"]), list(state["aligned"])
        self.current_watermark_ms, self.is_idle = state["current_watermark_ms"], state["is_idle"]

    # ------------------------------------------------------------------ internals

    def _after_input_left(self, channel: int, out: list[StreamElement]) -> None:
        live = [i for i in range(self.num_inputs) if not self._ended[i]]
        if live and all(self._idle[i] for i in live):
            # No one can hold event time back now: flush the largest watermark, then say idle.
            self._emit(max(self._watermarks[i] for i in live), out)
            if not self.is_idle:
                self.is_idle = True
                out.append(WatermarkStatus(True))
        else:
            self._advance_min(out)  # it may have been the one holding the minimum back

    def _advance_min(self, out: list[StreamElement]) -> None:
        aligned = [w for w, a in zip(self._watermarks, self._aligned) if a]
        if aligned:
            self._emit(min(aligned), out)

    def _emit(self, timestamp_ms: int, out: list[StreamElement]) -> None:
        if timestamp_ms > self.current_watermark_ms:
            self.current_watermark_ms = timestamp_ms
            out.append(Watermark(timestamp_ms))

    def _check(self, channel: int) -> None:
        if not 0 <= channel < self.num_inputs:
            raise ConfigurationError(f"channel must be in [0, {self.num_inputs}), got {channel}")

    def __repr__(self) -> str:
        return (
            f"StatusWatermarkValve(watermarks={self._watermarks}, idle={self._idle}, ended={self._ended}, "
            f"current_watermark_ms={self.current_watermark_ms})"
        )
