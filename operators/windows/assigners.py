"""Window assigners: which windows an element belongs to.

An assigner maps an element to zero or more windows and names the trigger that fires them by
default. Time windows are ``TimeWindow(start_ms, end_ms)``, half-open: ``[start_ms, end_ms)``.
Session assigners are *merging*: each element gets its own window, and windows that touch or
overlap are merged into one (see ``merging.py``).

Event-time assigners place an element by its ``timestamp_ms``; processing-time assigners by the
operator's processing time when the element arrives.

>>> TumblingEventTimeWindows(10).assign_windows("x", 17, 0)
[TimeWindow(start_ms=10, end_ms=20)]
>>> SlidingEventTimeWindows(10, 5).assign_windows("x", 17, 0)
[TimeWindow(start_ms=15, end_ms=25), TimeWindow(start_ms=10, end_ms=20)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from ..elements import MAX_WATERMARK, MIN_TIMESTAMP
from ..errors import ConfigurationError

__all__ = [
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "GlobalWindow",
    "GlobalWindows",
    "MergingWindowAssigner",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "merge_time_windows",
    "window_start_with_offset",
]

W = TypeVar("W")


@dataclass(frozen=True, slots=True, order=True)
class TimeWindow:
    """The half-open interval ``[start_ms, end_ms)`` of event or processing time.

    >>> w = TimeWindow(0, 10)
    >>> w.max_timestamp(), w.intersects(TimeWindow(10, 20)), w.cover(TimeWindow(5, 30))
    (9, True, TimeWindow(start_ms=0, end_ms=30))
    """

    start_ms: int
    end_ms: int

    def max_timestamp(self) -> int:
        """The last millisecond that belongs to the window."""
        return self.end_ms - 1

    def intersects(self, other: "TimeWindow") -> bool:
        """True if the windows overlap or touch (touching session windows merge)."""
        return self.start_ms <= other.end_ms and self.end_ms >= other.start_ms

    def cover(self, other: "TimeWindow") -> "TimeWindow":
        """The smallest window that holds both."""
        return TimeWindow(min(self.start_ms, other.start_ms), max(self.end_ms, other.end_ms))


class GlobalWindow:
    """The one window of ``GlobalWindows``; it never ends, so only a trigger fires it."""

    __slots__ = ()
    _instance: "GlobalWindow | None" = None

    def __new__(cls) -> "GlobalWindow":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def max_timestamp(self) -> int:
        return MAX_WATERMARK

    def __reduce__(self) -> tuple[Any, ...]:
        return (GlobalWindow, ())

    def __repr__(self) -> str:
        return "GlobalWindow()"


def _time_window(start_ms: int, end_ms: int) -> TimeWindow:
    """``TimeWindow(start_ms, end_ms)`` within the range of timestamps.

    A window that would end past the largest timestamp ends there instead: its timers then fall
    where the final watermark reaches them, so it fires and is cleaned up at the end of input
    rather than kept for ever, and its bounds fit an int64 column (as they do at the other end).
    """
    if end_ms > MAX_WATERMARK or start_ms < MIN_TIMESTAMP:
        return TimeWindow(max(start_ms, MIN_TIMESTAMP), min(end_ms, MAX_WATERMARK))
    return TimeWindow(start_ms, end_ms)


def window_start_with_offset(timestamp_ms: int, offset_ms: int, size_ms: int) -> int:
    """The start of the window of ``size_ms`` (shifted by ``offset_ms``) that holds ``timestamp_ms``.

    >>> window_start_with_offset(17, 0, 10), window_start_with_offset(-3, 0, 10), window_start_with_offset(17, 8, 10)
    (10, -10, 8)
    """
    # Python's % is never negative for a positive size, so negative timestamps need no special case.
    return timestamp_ms - (timestamp_ms - offset_ms) % size_ms


class WindowAssigner(Generic[W]):
    """Assigns an element to windows; ``is_event_time`` says which time it uses."""

    is_event_time: bool = True
    is_merging: bool = False

    def assign_windows(self, value: Any, timestamp_ms: int, processing_time_ms: int) -> Sequence[W]:
        """The windows of an element; ``timestamp_ms`` is its event time (event-time assigners only)."""
        raise NotImplementedError

    def default_trigger(self) -> Any:
        """The trigger used when the user names none."""
        from .triggers import EventTimeTrigger, ProcessingTimeTrigger

        return EventTimeTrigger() if self.is_event_time else ProcessingTimeTrigger()


class MergingWindowAssigner(WindowAssigner[W]):
    """An assigner whose windows merge when they overlap."""

    is_merging = True

    def merge_windows(self, windows: Sequence[W], merge: Callable[[list[W], W], None]) -> None:
        """Call ``merge(windows_to_merge, merge_result)`` for each group of two or more windows that merge."""
        raise NotImplementedError


_T = TypeVar("_T")


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int of milliseconds, got {value!r}")
    if value <= 0:
        raise ConfigurationError(f"{name} must be > 0, got {value}")
    return value


def _offset(offset_ms: int, period_ms: int, period_name: str) -> int:
    if isinstance(offset_ms, bool) or not isinstance(offset_ms, int):
        raise ConfigurationError(f"offset_ms must be an int of milliseconds, got {offset_ms!r}")
    if abs(offset_ms) >= period_ms:
        raise ConfigurationError(f"offset_ms must be smaller than {period_name} ({period_ms}) in absolute value, got {offset_ms}")
    return offset_ms


class _Tumbling(WindowAssigner[TimeWindow]):
    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = _positive("size_ms", size_ms)
        self.offset_ms = _offset(offset_ms, size_ms, "size_ms")

    @classmethod
    def of(cls: type[_T], size_ms: int, offset_ms: int = 0) -> _T:
        """Flink's ``of(size, offset)``: the same as the constructor."""
        return cls(size_ms, offset_ms)  # type: ignore[call-arg]

    def assign_windows(self, value: Any, timestamp_ms: int, processing_time_ms: int) -> list[TimeWindow]:
        t = timestamp_ms if self.is_event_time else processing_time_ms
        start = t - (t - self.offset_ms) % self.size_ms
        return [_time_window(start, start + self.size_ms)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class TumblingEventTimeWindows(_Tumbling):
    """Windows of ``size_ms`` that follow each other without gaps, by event time.

    >>> TumblingEventTimeWindows(60_000, offset_ms=15_000).assign_windows(None, 70_000, 0)
    [TimeWindow(start_ms=15000, end_ms=75000)]
    """

    is_event_time = True


class TumblingProcessingTimeWindows(_Tumbling):
    """Tumbling windows by the processing time at which an element arrives.

    >>> TumblingProcessingTimeWindows(10).assign_windows(None, 0, 34)
    [TimeWindow(start_ms=30, end_ms=40)]
    """

    is_event_time = False


class _Sliding(WindowAssigner[TimeWindow]):
    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = _positive("size_ms", size_ms)
        self.slide_ms = _positive("slide_ms", slide_ms)
        if slide_ms > size_ms:
            # Flink accepts it; here it is nearly always the arguments swapped, and it would leave
            # the rows between two windows in none, to be reported as late.
            raise ConfigurationError(
                f"slide_ms must be <= size_ms, got size_ms={size_ms} and slide_ms={slide_ms}: the rows between two "
                f"windows would fall in none. The size comes first: {type(self).__name__}({slide_ms}, {size_ms}) "
                "if the arguments were swapped"
            )
        self.offset_ms = _offset(offset_ms, slide_ms, "slide_ms")

    @classmethod
    def of(cls: type[_T], size_ms: int, slide_ms: int, offset_ms: int = 0) -> _T:
        """Flink's ``of(size, slide, offset)``: the same as the constructor."""
        return cls(size_ms, slide_ms, offset_ms)  # type: ignore[call-arg]

    def assign_windows(self, value: Any, timestamp_ms: int, processing_time_ms: int) -> list[TimeWindow]:
        t = timestamp_ms if self.is_event_time else processing_time_ms
        size, slide = self.size_ms, self.slide_ms
        start = t - (t - self.offset_ms) % slide
        windows = []
        while start > t - size:  # newest window first, as Flink
            windows.append(_time_window(start, start + size))
            start -= slide
        return windows

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size_ms={self.size_ms}, slide_ms={self.slide_ms}, offset_ms={self.offset_ms})"


class SlidingEventTimeWindows(_Sliding):
    """Windows of ``size_ms`` starting every ``slide_ms``, by event time; an element may be in several.

    A slide larger than the size is refused (Flink accepts it): it leaves gaps between the windows.

    >>> SlidingEventTimeWindows(10, 5, offset_ms=2).assign_windows(None, 8, 0)
    [TimeWindow(start_ms=7, end_ms=17), TimeWindow(start_ms=2, end_ms=12)]
    """

    is_event_time = True


class SlidingProcessingTimeWindows(_Sliding):
    """Sliding windows by processing time.

    >>> SlidingProcessingTimeWindows(10, 10).assign_windows(None, 0, 3)
    [TimeWindow(start_ms=0, end_ms=10)]
    """

    is_event_time = False


def merge_time_windows(windows: Sequence[TimeWindow], merge: Callable[[list[TimeWindow], TimeWindow], None]) -> None:
    """Merge overlapping or touching windows; report each group of two or more, with the window
    that covers it. A custom ``MergingWindowAssigner`` of time windows may call it from its
    ``merge_windows``, as the session assigners do.

    >>> merge_time_windows([TimeWindow(0, 5), TimeWindow(9, 12), TimeWindow(4, 9)], lambda group, result: print(group, result))
    [TimeWindow(start_ms=0, end_ms=5), TimeWindow(start_ms=4, end_ms=9), TimeWindow(start_ms=9, end_ms=12)] TimeWindow(start_ms=0, end_ms=12)
    """
    ordered = sorted(windows)
    group: list[TimeWindow] = []
    cover: TimeWindow | None = None
    for w in ordered:
        if cover is not None and cover.intersects(w):
            group.append(w)
            cover = cover.cover(w)
            continue
        if len(group) > 1 and cover is not None:
            merge(group, cover)
        group, cover = [w], w
    if len(group) > 1 and cover is not None:
        merge(group, cover)


class _Session(MergingWindowAssigner[TimeWindow]):
    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = _positive("gap_ms", gap_ms)

    @classmethod
    def with_gap(cls: type[_T], gap_ms: int) -> _T:
        """Flink's ``withGap(gap)``: the same as the constructor."""
        return cls(gap_ms)  # type: ignore[call-arg]

    def _gap(self, value: Any) -> int:
        return self.gap_ms

    def assign_windows(self, value: Any, timestamp_ms: int, processing_time_ms: int) -> list[TimeWindow]:
        t = timestamp_ms if self.is_event_time else processing_time_ms
        return [_time_window(t, t + self._gap(value))]

    def merge_windows(self, windows: Sequence[TimeWindow], merge: Callable[[list[TimeWindow], TimeWindow], None]) -> None:
        merge_time_windows(windows, merge)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gap_ms={self.gap_ms})"


class EventTimeSessionWindows(_Session):
    """A window per burst of activity: elements closer than ``gap_ms`` in event time share one.

    >>> EventTimeSessionWindows(5).assign_windows(None, 3, 0)
    [TimeWindow(start_ms=3, end_ms=8)]
    """

    is_event_time = True


class ProcessingTimeSessionWindows(_Session):
    """Session windows by processing time.

    >>> ProcessingTimeSessionWindows(5).assign_windows(None, 0, 3)
    [TimeWindow(start_ms=3, end_ms=8)]
    """

    is_event_time = False


class _DynamicSession(_Session):
    def __init__(self, gap_fn: Callable[[Any], int]) -> None:
        if not callable(gap_fn):
            raise ConfigurationError(f"gap_fn must be a callable returning milliseconds, got {type(gap_fn).__name__}")
        self.gap_fn = gap_fn
        self.gap_ms = 0

    def _gap(self, value: Any) -> int:
        gap = self.gap_fn(value)
        if isinstance(gap, bool) or not isinstance(gap, int) or gap <= 0:
            raise ValueError(f"gap_fn must return an int of milliseconds > 0, got {gap!r}")
        return gap

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gap_fn={getattr(self.gap_fn, '__name__', self.gap_fn)!r})"


class DynamicEventTimeSessionWindows(_DynamicSession):
    """Event-time sessions whose gap each element chooses: ``gap_fn(value) -> ms``.

    >>> DynamicEventTimeSessionWindows(lambda v: v["gap"]).assign_windows({"gap": 4}, 10, 0)
    [TimeWindow(start_ms=10, end_ms=14)]
    """

    is_event_time = True


class DynamicProcessingTimeSessionWindows(_DynamicSession):
    """Processing-time sessions with a gap per element.

    >>> DynamicProcessingTimeSessionWindows(lambda v: 4).assign_windows(None, 0, 10)
    [TimeWindow(start_ms=10, end_ms=14)]
    """

    is_event_time = False


class GlobalWindows(WindowAssigner[GlobalWindow]):
    """Every element in one window that never ends; only a trigger (count, custom) fires it.

    >>> GlobalWindows().assign_windows("x", 5, 0)
    [GlobalWindow()]
    """

    is_event_time = False
    _windows = [GlobalWindow()]

    def assign_windows(self, value: Any, timestamp_ms: int, processing_time_ms: int) -> list[GlobalWindow]:
        return self._windows

    def default_trigger(self) -> Any:
        from .triggers import NeverTrigger

        return NeverTrigger()

    def __repr__(self) -> str:
        return "GlobalWindows()"
