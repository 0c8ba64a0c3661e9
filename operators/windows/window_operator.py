"""The keyed window operator: assign, accumulate, trigger, evict, emit, clean up.

Flink's ``WindowOperator`` and ``EvictingWindowOperator`` in one. For each record the operator
takes its key (``key_selector``), asks the assigner for its windows, adds the record to each
window's contents and asks the trigger what to do. Timers of ``(timestamp_ms, key, window)``
fire the trigger again, and a cleanup timer at ``max_timestamp + allowed_lateness_ms`` drops a
window's contents, trigger state and per-window state for good.

Output: each firing emits records at ``window.max_timestamp()``. Without a ``process`` function,
the value is a dict::

    {<key columns>, "window_start": start_ms, "window_end": end_ms, <result columns>}

- key columns: the ``key_selector`` field(s) by name when it is a column name or a tuple of
  them, else ``"key"``;
- ``window_start``/``window_end``: the window's bounds in ms (None for the global window), or as
  UTC datetimes with ``bounds_as_datetime``;
- result columns: the result's items when it is a dict (they win over a clash), else ``"result"``.

A ``process`` function decides the output values itself.

Late records (event time): a record whose windows are all past cleanup time goes to the side output
``late_data_tag`` if given, as a ``LateRecord`` (its value and event time, the windows it missed,
why, and the watermark), else is dropped and counted in ``metrics.late_records_dropped``. Every
late record is counted by its ``LateReason`` too (``metrics.late_behind_watermark``, ...). A record
late for only some of its windows goes to the others and is not side-output.

Closed sessions (event-time merging windows): a record whose window overlaps a session of its key
that was already cleaned up (fired, and past its allowed lateness) is late too, rather than the
start of a second session overlapping one that was emitted (Flink starts that second session).
The bounds of a closed session are kept until the watermark passes its end plus the allowed
lateness plus the widest window assigned so far; from then on any record overlapping it is late by
its own window. With dynamic gaps, a record whose gap is wider than any before may still find a
forgotten session.

Threading model: every method runs on the mailbox thread.

>>> from actorflow.operators import OperatorHarness
>>> from actorflow.operators.windows import TumblingEventTimeWindows, Count
>>> h = OperatorHarness(WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count()))
>>> h.process_element({"user": "a"}, 3); h.process_element({"user": "a"}, 7); h.process_watermark(9)
>>> h.output_values()
[{'user': 'a', 'window_start': 0, 'window_end': 10, 'result': 2}]
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime, timedelta, timezone
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..elements import MAX_WATERMARK, MIN_TIMESTAMP, Record, Watermark
from ..errors import ConfigurationError, RecordError, ResultTypeError, UserFunctionError, describe_value
from ..operator import OperatorContext, OperatorMetrics, Output, StreamOperator
from ..timers import Timer, TimerService
from .assigners import GlobalWindows, MergingWindowAssigner, TimeWindow, WindowAssigner
from .contexts import WindowContexts
from .late import LateReason, LateRecord
from .evictors import CountEvictor, Evictor, TimestampedValue
from .functions import AggregateFunction, Aggregations, ProcessWindowFunction
from ..state import check_state, plain_window, versioned, window_of
from .merging import MergingWindowSet
from .panes import Panes, fired_windows, group_rows
from .records import event_time_of, key_function, key_of, record_error
from .triggers import CountTrigger, PurgingTrigger, Trigger, TriggerResult

__all__ = ["LateReason", "LateRecord", "WindowOperator", "WindowOperatorMetrics", "WindowSpec", "count_window"]

_EMPTY: Any = object()
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class WindowOperatorMetrics(OperatorMetrics):
    """The operator's counters, plus the late records it dropped (not side-output), and every late
    record by its reason, side-output or dropped."""

    late_records_dropped: int = 0
    late_behind_watermark: int = 0
    late_past_allowed_lateness: int = 0
    late_window_closed: int = 0

    def count_late(self, reason: LateReason, records: int = 1) -> None:
        name = f"late_{reason.value}"
        setattr(self, name, getattr(self, name) + records)


@dataclass(frozen=True)
class WindowSpec:
    """An assigner with the trigger and evictor it needs, as ``count_window`` builds them."""

    assigner: WindowAssigner[Any]
    trigger: Trigger | None = None
    evictor: Evictor | None = None


def count_window(size: int, slide: int | None = None) -> WindowSpec:
    """Windows of ``size`` elements per key; with ``slide``, one every ``slide`` elements over the last ``size``.

    Built as Flink does: the global window with a purging count trigger, or with a count trigger
    of ``slide`` and a count evictor of ``size``.

    >>> count_window(3).trigger, count_window(3, 1).evictor
    (PurgingTrigger(CountTrigger(max_count=3)), CountEvictor(max_count=3, do_evict_after=False))
    """
    if slide is None:
        return WindowSpec(GlobalWindows(), PurgingTrigger(CountTrigger(size)))
    return WindowSpec(GlobalWindows(), CountTrigger(slide), CountEvictor(size))


class WindowOperator(StreamOperator):
    """A keyed window operator; see the module docstring for its output.

    Give ``reduce`` or ``aggregate`` (incremental) and/or ``process`` (full window).
    ``window`` is an assigner, or a ``WindowSpec`` from ``count_window``; ``trigger`` and
    ``evictor`` override the assigner's defaults.
    """

    fires_on_event_time = True
    metrics: WindowOperatorMetrics

    def __init__(
        self,
        key_selector: Any,
        window: WindowAssigner[Any] | WindowSpec,
        *,
        reduce: Callable[[Any, Any], Any] | None = None,
        aggregate: AggregateFunction | None = None,
        process: ProcessWindowFunction | Callable[..., Iterable[Any] | None] | None = None,
        trigger: Trigger | None = None,
        evictor: Evictor | None = None,
        allowed_lateness_ms: int = 0,
        late_data_tag: str | None = None,
        name: str = "window",
        bounds_as_datetime: bool = False,
    ) -> None:
        if isinstance(window, WindowSpec):
            trigger = trigger if trigger is not None else window.trigger
            evictor = evictor if evictor is not None else window.evictor
            window = window.assigner
        if not isinstance(window, WindowAssigner):
            raise ConfigurationError(f"window must be a WindowAssigner or a WindowSpec, got {type(window).__name__}")
        self.assigner = window
        self.trigger: Trigger = trigger if trigger is not None else window.default_trigger()
        if not isinstance(self.trigger, Trigger):
            raise ConfigurationError(f"trigger must be a Trigger, got {type(self.trigger).__name__}")
        if evictor is not None and not isinstance(evictor, Evictor):
            raise ConfigurationError(f"evictor must be an Evictor, got {type(evictor).__name__}")
        self.evictor = evictor
        if reduce is not None and aggregate is not None:
            raise ConfigurationError("give reduce or aggregate, not both")
        if reduce is None and aggregate is None and process is None:
            raise ConfigurationError("a window operator needs a function: reduce, aggregate or process; got none")
        if reduce is not None and not callable(reduce):
            raise ConfigurationError(f"reduce must be a callable (a, b) -> value, got {type(reduce).__name__}")
        if aggregate is not None and not isinstance(aggregate, AggregateFunction):
            raise ConfigurationError(f"aggregate must be an AggregateFunction, got {type(aggregate).__name__}")
        if process is not None and not (isinstance(process, ProcessWindowFunction) or callable(process)):
            raise ConfigurationError(f"process must be a callable or a ProcessWindowFunction, got {type(process).__name__}")
        if isinstance(allowed_lateness_ms, bool) or not isinstance(allowed_lateness_ms, int) or allowed_lateness_ms < 0:
            raise ConfigurationError(f"allowed_lateness_ms must be an int >= 0, got {allowed_lateness_ms!r}")
        if late_data_tag is not None and not isinstance(late_data_tag, str):
            raise ConfigurationError(f"late_data_tag must be a str, got {late_data_tag!r}")
        if window.is_merging and not self.trigger.can_merge():
            raise ConfigurationError(
                f"a merging window assigner ({window!r}) needs a trigger that can merge; {self.trigger!r} cannot"
            )
        self.reduce_fn = reduce
        self.aggregate_fn = aggregate
        # A window keeps its elements (not an incremental result) for an evictor or a lone process.
        self._keeps_elements = evictor is not None or (reduce is None and aggregate is None)
        self.process_fn = process
        self.allowed_lateness_ms = allowed_lateness_ms
        self.late_data_tag = late_data_tag
        self.name = name
        #: Output ``window_start``/``window_end`` as UTC datetimes instead of ms (for timestamp columns).
        self.bounds_as_datetime = bool(bounds_as_datetime)
        self.key_selector = key_selector
        self._key_of, self.key_fields = key_function(key_selector)
        self._is_event_time = window.is_event_time
        self._merging_assigner: MergingWindowAssigner[Any] | None = (
            window if isinstance(window, MergingWindowAssigner) else None
        )

    # ------------------------------------------------------------------ lifecycle

    def setup(self, context: OperatorContext, output: Output) -> None:
        super().setup(context, output)
        self.metrics = WindowOperatorMetrics()
        self._pts = context.processing_time
        self._timers = TimerService(self, context.processing_time)
        self._watermark = MIN_TIMESTAMP
        #: (key, state window) -> accumulator / reduced value / list of elements
        self._contents: dict[tuple[Any, Any], Any] = {}
        self._trigger_state: dict[tuple[Any, Any], dict[str, Any]] = {}
        self._window_state: dict[tuple[Any, Any], dict[str, Any]] = {}
        self._global_state: dict[Any, dict[str, Any]] = {}
        self._merging: dict[Any, MergingWindowSet] = {}
        #: key -> the sessions of that key that closed and may still be overlapped (see the docstring)
        self._closed_sessions: dict[Any, list[TimeWindow]] = {}
        #: (end + allowed lateness, sequence, key, window): when to forget a closed session, once
        #: the widest window is added too
        self._closed_heap: list[tuple[int, int, Any, TimeWindow]] = []
        self._closed_sequence = itertools.count()
        self._widest_window_ms: int = getattr(self.assigner, "gap_ms", 0)
        # The Arrow path's open windows, as tables instead of the dicts above (see panes.py).
        self._panes: Panes | None = None
        self._ctx = WindowContexts(self)

    def initialize_state(self, state: Any | None) -> None:
        if state is None:
            return
        s = check_state("window", state)  # refuses another format version before anything changes
        contents: dict[tuple[Any, Any], Any] = {}
        for key, window, kind, payload in s["contents"]:
            if kind == "timestamped":
                payload = [TimestampedValue(v, t) for v, t in payload]
            elif kind == "elements":
                payload = list(payload)
            contents[(key, window_of(window))] = payload
        self._contents = contents
        self._trigger_state = {(k, window_of(w)): dict(d) for k, w, d in s["trigger_state"]}
        self._window_state = {(k, window_of(w)): dict(d) for k, w, d in s["window_state"]}
        self._global_state = {k: dict(d) for k, d in s["global_state"]}
        if self._merging_assigner is not None:
            self._merging = {
                k: MergingWindowSet(self._merging_assigner, {window_of(w): window_of(sw) for w, sw in pairs})
                for k, pairs in s["merging"]
            }
        timers = s["timers"]
        self._timers.restore({
            "event": [(t, k, window_of(w)) for t, k, w in timers["event"]],
            "processing": [(t, k, window_of(w)) for t, k, w in timers["processing"]],
            "watermark": timers["watermark"],
        })
        self._watermark = s["watermark"]
        self._panes = None if s["panes"] is None else _panes_from_state(self, s["panes"])
        closed = s.get("closed_sessions")  # absent from snapshots that had none to keep
        if closed is not None:
            self._widest_window_ms = max(self._widest_window_ms, closed["widest_ms"])
            for key, window in closed["windows"]:
                self._remember_closed_session(key, window_of(window))

    def snapshot_state(self) -> dict[str, Any]:
        """Window contents, trigger and function state, merge sets and timers, as plain data
        (the ``window`` structure of ``state.py``), and where there are any, the closed sessions
        still remembered: ``"closed_sessions": {"widest_ms": ms, "windows": [(key, window), ...]}``
        (optional, so that snapshots without it restore as they did).

        Every container is copied, so that the operator may go on changing its state while the
        snapshot is written elsewhere; user values are shared (an operator never mutates one in place
        that a snapshot holds: accumulators and reduced values are replaced, element lists copied).
        """
        contents: list[tuple[Any, ...]] = []
        for (key, window), value in self._contents.items():
            if self._keeps_elements:
                if self.evictor is not None:
                    contents.append((key, plain_window(window), "timestamped", [(v.value, v.timestamp_ms) for v in value]))
                else:
                    contents.append((key, plain_window(window), "elements", list(value)))
            else:
                contents.append((key, plain_window(window), "value", value))
        timers = self._timers.snapshot()
        extra: dict[str, Any] = {}
        if self._closed_sessions or self._widest_window_ms > getattr(self.assigner, "gap_ms", 0):
            extra["closed_sessions"] = {
                "widest_ms": self._widest_window_ms,
                "windows": [(k, plain_window(w)) for k, ws in self._closed_sessions.items() for w in ws],
            }
        return versioned("window", {
            "watermark": self._watermark,
            "contents": contents,
            "trigger_state": [(k, plain_window(w), dict(d)) for (k, w), d in self._trigger_state.items()],
            "window_state": [(k, plain_window(w), dict(d)) for (k, w), d in self._window_state.items()],
            "global_state": [(k, dict(d)) for k, d in self._global_state.items()],
            "merging": [(k, [(plain_window(w), plain_window(sw)) for w, sw in m.mapping.items()]) for k, m in self._merging.items()],
            "timers": {
                "event": [(t, k, plain_window(w)) for t, k, w in timers["event"]],
                "processing": [(t, k, plain_window(w)) for t, k, w in timers["processing"]],
                "watermark": timers["watermark"],
            },
            "panes": _panes_state(self._panes) if self._panes else None,
            **extra,
        })

    # ----------------------------------------------------------------------- view

    def window_state(self) -> dict[Any, dict[Any, Any]]:
        """What each key's windows hold now, for tests and debugging: ``{key: {window: contents}}``.

        ``contents`` is the accumulator (``aggregate``), the reduced value (``reduce``), or the list
        of elements (a lone ``process``; ``TimestampedValue``s with an evictor). Only windows with
        contents appear (a purged window does not); merged windows appear as the merged window.
        A copy: changing it changes nothing in the operator, and reading it changes nothing either
        (windows the Arrow path keeps as tables are read where they are).

        >>> from actorflow.operators import OperatorHarness
        >>> from actorflow.operators.windows import TumblingEventTimeWindows, Count
        >>> op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count())
        >>> h = OperatorHarness(op); h.process_element({"k": "a"}, 3); h.process_element({"k": "a"}, 12)
        >>> op.window_state()
        {'a': {TimeWindow(start_ms=0, end_ms=10): 1, TimeWindow(start_ms=10, end_ms=20): 1}}
        """
        view: dict[Any, dict[Any, Any]] = {}
        contents = self._contents
        if self._merging_assigner is not None:
            for key, merging in self._merging.items():
                for window, state_window in merging.mapping.items():
                    if (key, state_window) in contents:
                        view.setdefault(key, {})[window] = _copied(contents[(key, state_window)])
        else:
            for (key, window), value in contents.items():
                view.setdefault(key, {})[window] = _copied(value)
        for key, window, accumulator in self._pane_windows():
            view.setdefault(key, {})[window] = accumulator
        return view

    def _pane_windows(self) -> list[tuple[Any, TimeWindow, Any]]:
        """``(key, window, accumulator)`` of the windows the panes hold, leaving them there."""
        panes = self._panes
        if not panes:
            return []
        several = isinstance(self.aggregate_fn, Aggregations)
        return [
            (key, TimeWindow(start, start + panes.size_ms), accs if several else accs[0])
            for _, key, start, accs in group_rows(panes._merged(panes._all()), panes.keys, panes.parts)
        ]

    def timers(self) -> dict[str, list[tuple[int, Any, Any]]]:
        """The pending timers, for tests and debugging: ``{"event": [...], "processing": [...]}``,
        each a list of ``(timestamp_ms, key, window)`` in firing order (the trigger's timers and
        the cleanup timers alike; Flink keeps them in one service too). Windows the Arrow path
        keeps as tables show the timer at their end that fires them.

        >>> from actorflow.operators import OperatorHarness
        >>> from actorflow.operators.windows import TumblingEventTimeWindows, Count
        >>> op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count())
        >>> h = OperatorHarness(op); h.process_element({"k": "a"}, 3)
        >>> op.timers()
        {'event': [(9, 'a', TimeWindow(start_ms=0, end_ms=10))], 'processing': []}
        """
        event = [(t.timestamp_ms, t.key, t.namespace) for t in self._timers.event_time_timers()]
        panes = self._pane_windows()
        if panes:
            # Per window, the timer the per-record path would have registered at its end.
            event += [(window.max_timestamp(), key, window) for key, window, _ in panes]
            event.sort(key=lambda timer: timer[0])
        return {"event": event, "processing": [(t.timestamp_ms, t.key, t.namespace) for t in self._timers.processing_time_timers()]}

    # ---------------------------------------------------------------------- input

    def process_watermark(self, watermark: Watermark) -> None:
        if watermark.timestamp_ms > self._watermark:
            self._watermark = watermark.timestamp_ms
            if self._panes is not None and self._panes.due(watermark.timestamp_ms):
                self._fire_panes(self._panes, watermark.timestamp_ms)
            self._timers.advance_watermark(watermark.timestamp_ms)
            if self._closed_heap:
                self._forget_closed_sessions(watermark.timestamp_ms)
        self.output.emit_watermark(watermark)

    def process_element(self, record: Record) -> None:
        if self._panes:
            from .vectorised import move_panes_to_dict

            move_panes_to_dict(self)  # the per-record path works on the dict state
        self.metrics.records_in += 1
        value = record.value
        key = key_of(self._key_of, record, self.context.name)
        timestamp_ms = event_time_of(record, self.context.name, self.assigner) if self._is_event_time else record.timestamp_ms
        try:
            windows = self.assigner.assign_windows(value, timestamp_ms, self._pts.now_ms())  # type: ignore[arg-type]
        except Exception as error:
            raise record_error(self.context.name, record, f"window assigner {self.assigner!r} raised {type(error).__name__}: {error}", error)
        closed = False
        if self._merging_assigner is not None:
            skipped, closed = self._add_to_merging_windows(key, windows, record)
        else:
            skipped = True
            for window in windows:
                if self._is_event_time and self._cleanup_time(window) <= self._watermark:
                    # Too late for this window (maybe not for the others). A late window that still
                    # holds state lost its cleanup timer: it goes now, or it would stay for ever.
                    state_key = (key, window)
                    if state_key in self._contents or state_key in self._trigger_state or state_key in self._window_state:
                        self._clear_late_window(key, window, None)
                    continue
                skipped = False
                self._add_and_trigger(key, window, window, record)
        # A record that no window took is late, and accounted for (for the built-in assigners that
        # is Flink's "timestamp + allowed lateness <= watermark").
        if skipped and windows and self._is_event_time:
            self._on_late(record, windows, LateReason.WINDOW_CLOSED if closed else None)

    def process_batch(self, batch: Any, timestamp_column: str) -> None:
        """Process an Arrow table or record batch, one record per row (a dict) at ``timestamp_column``.

        Vectorised when the operator allows it (see ``vectorised.py``), record by record otherwise;
        the state and output are the same either way.
        """
        from .vectorised import process_batch

        process_batch(self, batch, timestamp_column)

    def process_timestamped_batch(self, table: Any, timestamps_ms: Any) -> None:
        """Process an Arrow table whose rows' event times are ``timestamps_ms`` (int64 ms), as a
        channel batch carries them beside its columns; vectorised where ``process_batch`` is."""
        from .vectorised import process_timestamped_batch

        process_timestamped_batch(self, table, timestamps_ms)

    def pre_aggregates(self) -> bool:
        """Whether ``pre_aggregate`` may give partials at all (built-in aggregations of tumbling
        windows, no allowed lateness, no late-data side output); if not, it always gives None."""
        from .vectorised import pre_aggregates

        return pre_aggregates(self)

    def pre_aggregate(self, table: Any, timestamps_ms: Any) -> Any:
        """The partial aggregates of ``table`` per key and window, for an instance of this operator
        that splits the table by key before it; None where the rows themselves must go."""
        from .vectorised import partial_aggregates

        return partial_aggregates(self, table, timestamps_ms)

    def process_partials(self, partials: Any, batch_rows: int) -> int:
        """Merge what ``pre_aggregate`` made of a batch of ``batch_rows`` rows (or of the keys of
        it that this instance owns), as processing the rows would; returns how many records they
        stand for."""
        from .vectorised import process_partials

        return process_partials(self, partials, batch_rows)

    def _add_to_merging_windows(self, key: Any, windows: Sequence[Any], record: Record) -> tuple[bool, bool]:
        """Add ``record`` to its merged windows; whether every window skipped it (it is late), and
        whether one did because it would open a closed session again."""
        merging = self._merging.get(key)
        if merging is None:
            merging = self._merging[key] = MergingWindowSet(self._merging_assigner)  # type: ignore[arg-type]
        skipped = True
        merge = self._ctx.merge_function(key)

        def check(result: Any, merged: list[Any]) -> None:
            problem = self._merge_problem(result, merged)
            if problem is not None:
                raise ResultTypeError(
                    f"window assigner {self.assigner!r} merged {merged!r} into {result!r}, {problem}; "
                    f"on record {describe_value(record.value)} (timestamp_ms={record.timestamp_ms})",
                    operator=self.context.name, value=record.value, timestamp_ms=record.timestamp_ms,
                )

        closed = self._closed_sessions.get(key) if self._closed_sessions else None
        reopens = False
        for window in windows:
            if self._is_event_time and isinstance(window, TimeWindow):
                if window.end_ms - window.start_ms > self._widest_window_ms:
                    self._widest_window_ms = window.end_ms - window.start_ms
                if closed is not None and any(window.start_ms < c.end_ms and c.start_ms < window.end_ms for c in closed):
                    reopens = True
                    continue  # late: it would reopen a session that was emitted and cleaned up
            existed = window in merging.mapping
            actual = merging.add_window(window, merge, check)
            if self._is_event_time and self._cleanup_time(actual) <= self._watermark:
                if actual == window and not existed:
                    merging.retire_window(actual)  # a late window of its own: it never held anything
                else:
                    self._clear_late_window(key, actual, merging)
                continue
            skipped = False
            self._add_and_trigger(key, actual, merging.get_state_window(actual), record)
        if not merging.mapping:
            self._merging.pop(key, None)
        return skipped, reopens

    def _merge_problem(self, result: Any, merged: list[Any]) -> str | None:
        """Why the assigner's merge of ``merged`` into ``result`` cannot be taken, or None.

        A merge that makes an open window late (event time) or over (processing time) would lose
        it, or emit it at once, with its contents and timers (Flink refuses it too); one that
        shrinks a window drops the elements outside it.
        """
        if self._is_event_time:
            watermark = self._watermark
            if self._cleanup_time(result) <= watermark and any(self._cleanup_time(w) > watermark for w in merged):
                return (
                    f"which the watermark {watermark} has passed (its end plus the allowed lateness of "
                    f"{self.allowed_lateness_ms} ms): a merge must not make an open event-time window late"
                )
        else:
            now = self._pts.now_ms()
            if result.max_timestamp() <= now and any(w.max_timestamp() > now for w in merged):
                return f"which ends at or before the processing time {now}: a merge must not end a window that is open"
        if isinstance(result, TimeWindow) and all(isinstance(w, TimeWindow) for w in merged):
            if result.start_ms > min(w.start_ms for w in merged) or result.end_ms < max(w.end_ms for w in merged):
                return "which does not cover them: a merged window must hold every window it merges"
        return None

    def _clear_late_window(self, key: Any, window: Any, merging: MergingWindowSet | None) -> None:
        """Clear a window found late with state still in it: its contents, trigger and function
        state, merge-set entry and timers, as its cleanup timer would have."""
        state_window = window if merging is None else merging.get_state_window(window)
        self._delete_cleanup_timer(key, window)
        self._clear_all_state(key, window, (key, state_window), merging)

    def _add_and_trigger(self, key: Any, window: Any, state_window: Any, record: Record) -> None:
        state_key = (key, state_window)
        value = record.value
        contents = self._contents.get(state_key, _EMPTY)
        try:
            if self._keeps_elements:
                if contents is _EMPTY:
                    contents = self._contents[state_key] = []
                contents.append(TimestampedValue(value, record.timestamp_ms) if self.evictor is not None else value)
            elif self.reduce_fn is not None:
                self._contents[state_key] = value if contents is _EMPTY else self.reduce_fn(contents, value)
            else:
                agg = self.aggregate_fn
                assert agg is not None
                self._contents[state_key] = agg.add(value, agg.create_accumulator() if contents is _EMPTY else contents)
        except Exception as error:
            fn = "reduce" if self.reduce_fn is not None else "aggregate"
            raise record_error(self.context.name, record, f"{fn} function raised {type(error).__name__}: {error} in window {window!r}", error)
        ctx = self._ctx.trigger
        ctx.key = key
        ctx.window = window
        try:
            result = self.trigger.on_element(value, record.timestamp_ms, window, ctx)
        except Exception as error:
            raise record_error(self.context.name, record, f"trigger {self.trigger!r} raised {type(error).__name__}: {error} in window {window!r}", error)
        self._on_element_result(result, key, window, state_key)

    def _on_element_result(self, result: Any, key: Any, window: Any, state_key: Any) -> None:
        """Act on what the trigger said about an element: fire, purge, and keep the cleanup timer."""
        if type(result) is not TriggerResult:
            raise self._bad_trigger_result("on_element", window, result)
        if result.is_fire:
            self._emit_window(key, window, state_key)
        if result.is_purge:
            self._contents.pop(state_key, None)
        self._register_cleanup_timer(key, window)

    def _bad_trigger_result(self, method: str, window: Any, result: Any) -> ResultTypeError:
        return ResultTypeError(
            f"trigger {self.trigger!r}.{method} must return a TriggerResult, got {describe_value(result)} "
            f"in window {window!r}",
            operator=self.context.name,
        )

    def merge_contents(self, a: Any, b: Any, window: Any) -> Any:
        """Fold the contents ``b`` of a merged-away window into ``a`` (merging windows)."""
        try:
            if self._keeps_elements:
                a.extend(b)
                return a
            if self.reduce_fn is not None:
                return self.reduce_fn(a, b)
            assert self.aggregate_fn is not None
            return self.aggregate_fn.merge(a, b)
        except Exception as error:
            raise UserFunctionError(
                f"merging the contents of window {window!r} raised {type(error).__name__}: {error}",
                operator=self.context.name,
            ) from error

    def _on_late(self, record: Record, windows: Iterable[Any], reason: LateReason | None = None) -> None:
        """Account for a record late for all of ``windows``: side output, or dropped and counted."""
        if reason is None:
            reason = LateReason.PAST_ALLOWED_LATENESS if self.allowed_lateness_ms else LateReason.BEHIND_WATERMARK
        self.metrics.count_late(reason)
        if self.late_data_tag is not None:
            missed = tuple((w.start_ms, w.end_ms) for w in windows if isinstance(w, TimeWindow))
            late = LateRecord(record.value, record.timestamp_ms, reason, missed, self._watermark)  # type: ignore[arg-type]
            self.output.collect_side(self.late_data_tag, late)
        else:
            self.metrics.late_records_dropped += 1

    # --------------------------------------------------------------------- timers

    def on_event_time(self, timer: Timer) -> None:
        self._on_timer(timer, True)

    def on_processing_time(self, timer: Timer) -> None:
        self._on_timer(timer, False)

    def _on_timer(self, timer: Timer, event_time: bool) -> None:
        key, window, time_ms = timer.key, timer.namespace, timer.timestamp_ms
        merging = None
        if self._merging_assigner is not None:
            merging = self._merging.get(key)
            state_window = merging.get_state_window(window) if merging is not None else None
            if state_window is None:
                return  # a timer of a window that was merged away or cleaned up: it must not fire
        else:
            state_window = window
            if event_time == self._is_event_time and time_ms > self._cleanup_time(window):
                return  # a timer a trigger left behind a window that was cleaned up
        state_key = (key, state_window)
        # The trigger hears every timer of a live window, empty or not: a purged window's trigger
        # must still set its next firing, or the next contents wait for the window's end.
        ctx = self._ctx.trigger
        ctx.key = key
        ctx.window = window
        method = "on_event_time" if event_time else "on_processing_time"
        try:
            if event_time:
                result = self.trigger.on_event_time(time_ms, window, ctx)
            else:
                result = self.trigger.on_processing_time(time_ms, window, ctx)
        except Exception as error:
            raise UserFunctionError(
                f"trigger {self.trigger!r} raised {type(error).__name__} in {method}({time_ms}): {error} "
                f"for key {describe_value(key)} in window {window!r}",
                operator=self.context.name, value=key, timestamp_ms=time_ms,
            ) from error
        if type(result) is not TriggerResult:
            raise self._bad_trigger_result(method, window, result)
        if state_key in self._contents:  # an empty window fires nothing
            if result.is_fire:
                self._emit_window(key, window, state_key)
            if result.is_purge:
                self._contents.pop(state_key, None)
        if event_time == self._is_event_time and time_ms == self._cleanup_time(window):
            self._clear_all_state(key, window, state_key, merging)

    def _cleanup_time(self, window: Any) -> int:
        max_ts: int = window.max_timestamp()
        if not self._is_event_time:
            return max_ts
        # Saturate rather than pass the int64 range, which would put the timer out of reach.
        return min(max_ts + self.allowed_lateness_ms, MAX_WATERMARK)

    def _register_cleanup_timer(self, key: Any, window: Any) -> None:
        cleanup_ms = self._cleanup_time(window)
        if cleanup_ms == MAX_WATERMARK:
            return  # the global window, or one that ends at the end of time: nothing to clean up
        if self._is_event_time:
            self._timers.register_event_time_timer(cleanup_ms, key, window)
        else:
            self._timers.register_processing_time_timer(cleanup_ms, key, window)

    def _delete_cleanup_timer(self, key: Any, window: Any) -> None:
        cleanup_ms = self._cleanup_time(window)
        if cleanup_ms == MAX_WATERMARK:
            return
        if self._is_event_time:
            self._timers.delete_event_time_timer(cleanup_ms, key, window)
        else:
            self._timers.delete_processing_time_timer(cleanup_ms, key, window)

    def _clear_all_state(self, key: Any, window: Any, state_key: tuple[Any, Any], merging: MergingWindowSet | None) -> None:
        self._contents.pop(state_key, None)
        ctx = self._ctx.trigger
        ctx.key = key
        ctx.window = window
        self.trigger.clear(window, ctx)
        if self._trigger_state:  # most triggers keep none
            self._trigger_state.pop((key, window), None)
        if isinstance(self.process_fn, ProcessWindowFunction):
            pctx = self._ctx.process
            pctx.key = key
            pctx.window = window
            self.process_fn.clear(pctx)
        if self._window_state:
            self._window_state.pop((key, window), None)
        if merging is not None:
            merging.retire_window(window)
            if not merging.mapping:
                del self._merging[key]
            if self._is_event_time and isinstance(window, TimeWindow):
                self._remember_closed_session(key, window)

    def _remember_closed_session(self, key: Any, window: TimeWindow) -> None:
        self._closed_sessions.setdefault(key, []).append(window)
        heapq.heappush(self._closed_heap, (window.end_ms + self.allowed_lateness_ms, next(self._closed_sequence), key, window))

    def _forget_closed_sessions(self, watermark_ms: int) -> None:
        """Forget the closed sessions that no record can overlap without being late by itself:
        one that does has a window of at most the widest width starting before the session's end."""
        heap = self._closed_heap
        while heap and heap[0][0] + self._widest_window_ms <= watermark_ms:
            _, _, key, window = heapq.heappop(heap)
            windows = self._closed_sessions[key]
            windows.remove(window)
            if not windows:
                del self._closed_sessions[key]

    # ----------------------------------------------------------------------- emit

    def _fire_panes(self, panes: Panes, watermark_ms: int) -> None:
        """Fire the panes' windows that ``watermark_ms`` passes: as one table where the output
        takes tables, else one record per window, as the timers of the per-record path would."""
        table = panes.take_due(watermark_ms)
        if not table.num_rows:
            return
        collect_table = getattr(self.output, "collect_table", None)
        if collect_table is not None:
            rows, timestamps = fired_windows(self, panes, table)
            collect_table(rows, timestamps)
            self.metrics.records_out += rows.num_rows
            return
        agg = self.aggregate_fn
        assert agg is not None
        several = isinstance(agg, Aggregations)
        collect = self.output.collect
        for _, key, start, accs in group_rows(table, panes.keys, panes.parts):
            window = TimeWindow(start, start + panes.size_ms)
            result = agg.get_result(accs if several else accs[0])
            collect(Record(self.output_row(key, window, result), window.max_timestamp()))
            self.metrics.records_out += 1

    def _emit_window(self, key: Any, window: Any, state_key: tuple[Any, Any]) -> None:
        contents = self._contents[state_key]
        try:
            if self.evictor is not None:
                results = self._evicting_results(key, window, contents)
            elif self.reduce_fn is not None:
                results = self._results(key, window, contents)
            elif self.aggregate_fn is not None:
                results = self._results(key, window, self.aggregate_fn.get_result(contents))
            else:
                results = self._process(key, window, contents)
        except RecordError:
            raise
        except Exception as error:
            raise UserFunctionError(
                f"window function raised {type(error).__name__}: {error} for key {describe_value(key)} in window {window!r}",
                operator=self.context.name,
                value=key,
                timestamp_ms=window.max_timestamp(),
            ) from error
        timestamp_ms = window.max_timestamp()
        collect = self.output.collect
        for value in results:
            collect(Record(value, timestamp_ms))
            self.metrics.records_out += 1

    def _results(self, key: Any, window: Any, result: Any) -> Iterable[Any]:
        if self.process_fn is not None:
            return self._process(key, window, [result])
        return (self.output_row(key, window, result),)

    def _process(self, key: Any, window: Any, elements: list[Any]) -> Iterable[Any]:
        pctx = self._ctx.process
        pctx.key = key
        pctx.window = window
        fn = self.process_fn
        out = fn.process(key, pctx, elements) if isinstance(fn, ProcessWindowFunction) else fn(key, pctx, elements)  # type: ignore[misc]
        return () if out is None else list(out)

    def _evicting_results(self, key: Any, window: Any, contents: list[TimestampedValue]) -> Iterable[Any]:
        evictor = self.evictor
        assert evictor is not None
        ectx = self._ctx.trigger
        evictor.evict_before(contents, window, ectx)
        values = [e.value for e in contents]
        if self.reduce_fn is not None:
            results: Iterable[Any] = ()
            if values:
                acc = values[0]
                for v in values[1:]:
                    acc = self.reduce_fn(acc, v)
                results = self._results(key, window, acc)
        elif self.aggregate_fn is not None:
            acc = self.aggregate_fn.create_accumulator()
            for v in values:
                acc = self.aggregate_fn.add(v, acc)
            results = self._results(key, window, self.aggregate_fn.get_result(acc))
        else:
            results = self._process(key, window, values)
        evictor.evict_after(contents, window, ectx)
        return results

    def output_row(self, key: Any, window: Any, result: Any) -> dict[str, Any]:
        """The default output value of a window's result (see the module docstring)."""
        fields = self.key_fields
        if fields is None:
            row: dict[str, Any] = {"key": key}
        elif len(fields) == 1:
            row = {fields[0]: key}
        else:
            row = dict(zip(fields, key))
        if isinstance(window, TimeWindow):
            if self.bounds_as_datetime:
                row["window_start"] = _EPOCH + timedelta(milliseconds=window.start_ms)
                row["window_end"] = _EPOCH + timedelta(milliseconds=window.end_ms)
            else:
                row["window_start"] = window.start_ms
                row["window_end"] = window.end_ms
        else:
            row["window_start"] = row["window_end"] = None
        if isinstance(result, dict):
            row.update(result)
        else:
            row["result"] = result
        return row

    # --------------------------------------------------------------------- checks

    def __repr__(self) -> str:
        return f"WindowOperator({self.name!r}, {self.assigner!r}, trigger={self.trigger!r})"


def _copied(contents: Any) -> Any:
    """Window contents for a view: a list of elements copied, an accumulator as it is (the
    operator replaces accumulators and reduced values, never changes one in place)."""
    return list(contents) if type(contents) is list else contents


def _panes_state(panes: Panes) -> dict[str, Any]:
    """The Arrow path's open windows as plain data: their tables as Arrow IPC streams."""
    import pyarrow as pa

    tables = []
    for table in panes.tables:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        tables.append(sink.getvalue().to_pybytes())
    return {"size_ms": panes.size_ms, "earliest_start": panes.earliest_start, "rows_seen": panes.rows_seen, "tables": tables}


def _panes_from_state(op: WindowOperator, state: dict[str, Any]) -> Panes:
    """The panes ``_panes_state`` wrote; the keys and parts come from the operator, as they did."""
    import pyarrow as pa

    from .vectorised import _builtins

    panes = Panes(list(op.key_fields or ()), _builtins(op) or [], state["size_ms"])
    panes.tables = [pa.ipc.open_stream(data).read_all() for data in state["tables"]]
    panes.earliest_start, panes.rows_seen = state["earliest_start"], state["rows_seen"]
    return panes
