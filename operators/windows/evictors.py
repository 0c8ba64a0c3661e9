"""Evictors: remove elements from a window before or after its function runs.

With an evictor, a window keeps its raw elements (with their timestamps) instead of an
incremental result, and the function runs over what the evictor leaves. Evictions persist: an
element evicted once is gone for the window's later firings.

An evictor edits the list of ``TimestampedValue`` in place.

>>> elements = [TimestampedValue(v, v) for v in range(5)]
>>> CountEvictor(2).evict_before(elements, None, None); [e.value for e in elements]
[3, 4]
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

from ..errors import ConfigurationError

__all__ = ["CountEvictor", "DeltaEvictor", "Evictor", "EvictorContext", "TimeEvictor", "TimestampedValue"]


class TimestampedValue(NamedTuple):
    """An element of a window with its event time (None without event time)."""

    value: Any
    timestamp_ms: int | None


class EvictorContext(Protocol):
    def current_watermark_ms(self) -> int: ...

    def current_processing_time_ms(self) -> int: ...


class Evictor:
    """Removes elements from a window's list; ``do_evict_after`` chooses after the function instead of before."""

    do_evict_after: bool = False

    def evict_before(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        if not self.do_evict_after:
            self.evict(elements, window, ctx)

    def evict_after(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        if self.do_evict_after:
            self.evict(elements, window, ctx)

    def evict(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        raise NotImplementedError


class CountEvictor(Evictor):
    """Keeps the last ``max_count`` elements.

    >>> CountEvictor(3, do_evict_after=True)
    CountEvictor(max_count=3, do_evict_after=True)
    """

    def __init__(self, max_count: int, *, do_evict_after: bool = False) -> None:
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count <= 0:
            raise ConfigurationError(f"max_count must be an int > 0, got {max_count!r}")
        self.max_count = max_count
        self.do_evict_after = do_evict_after

    def evict(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        if len(elements) > self.max_count:
            del elements[: len(elements) - self.max_count]

    def __repr__(self) -> str:
        return f"CountEvictor(max_count={self.max_count}, do_evict_after={self.do_evict_after})"


class TimeEvictor(Evictor):
    """Keeps the elements less than ``window_size_ms`` older than the newest one.

    >>> elements = [TimestampedValue("a", 1), TimestampedValue("b", 5), TimestampedValue("c", 9)]
    >>> TimeEvictor(5).evict_before(elements, None, None); [e.value for e in elements]
    ['b', 'c']
    """

    def __init__(self, window_size_ms: int, *, do_evict_after: bool = False) -> None:
        if isinstance(window_size_ms, bool) or not isinstance(window_size_ms, int) or window_size_ms < 0:
            raise ConfigurationError(f"window_size_ms must be an int >= 0, got {window_size_ms!r}")
        self.window_size_ms = window_size_ms
        self.do_evict_after = do_evict_after

    def evict(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        # Elements without event time cannot be judged by it: leave the window as it is.
        if not elements or any(e.timestamp_ms is None for e in elements):
            return
        cutoff = max(e.timestamp_ms for e in elements if e.timestamp_ms is not None) - self.window_size_ms
        elements[:] = [e for e in elements if e.timestamp_ms is not None and e.timestamp_ms > cutoff]

    def __repr__(self) -> str:
        return f"TimeEvictor(window_size_ms={self.window_size_ms}, do_evict_after={self.do_evict_after})"


class DeltaEvictor(Evictor):
    """Evicts the elements whose ``delta_fn(element, newest)`` is at least ``threshold``.

    >>> elements = [TimestampedValue(v, None) for v in (1, 7, 9, 10)]
    >>> DeltaEvictor(5, lambda a, b: abs(a - b)).evict_before(elements, None, None); [e.value for e in elements]
    [7, 9, 10]
    """

    def __init__(self, threshold: float, delta_fn: Callable[[Any, Any], float], *, do_evict_after: bool = False) -> None:
        if not callable(delta_fn):
            raise ConfigurationError(f"delta_fn must be a callable, got {type(delta_fn).__name__}")
        self.threshold = threshold
        self.delta_fn = delta_fn
        self.do_evict_after = do_evict_after

    def evict(self, elements: list[TimestampedValue], window: Any, ctx: EvictorContext | None) -> None:
        if not elements:
            return
        newest = elements[-1].value
        elements[:] = [e for e in elements if self.delta_fn(e.value, newest) < self.threshold]

    def __repr__(self) -> str:
        return f"DeltaEvictor(threshold={self.threshold}, do_evict_after={self.do_evict_after})"
