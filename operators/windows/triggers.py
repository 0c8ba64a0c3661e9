"""Triggers: when a window's contents are emitted, and when they are purged.

A trigger is called for each element added to a window (``on_element``), for each timer it
registered (``on_event_time``, ``on_processing_time``), when windows merge (``on_merge``) and when
its window is cleaned up (``clear``). It answers with a ``TriggerResult``. Through its
``TriggerContext`` it reads the watermark and the processing time, registers and deletes timers,
and keeps state of its own, per key and window.

A trigger object is shared by every key and window of an operator: keep state in the context,
never on ``self``.

>>> class EveryOther(Trigger):
...     def on_element(self, value, timestamp_ms, window, ctx):
...         n = ctx.get_state("n", 0) + 1
...         ctx.set_state("n", n)
...         return TriggerResult.FIRE if n % 2 == 0 else TriggerResult.CONTINUE
...     def clear(self, window, ctx):
...         ctx.clear_state("n")
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Protocol

from ..errors import ConfigurationError

__all__ = [
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CountTrigger",
    "EventTimeTrigger",
    "NeverTrigger",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
]


class TriggerResult(enum.Enum):
    """What to do with a window: nothing, emit it, drop its contents, or both."""

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    @property
    def is_fire(self) -> bool:
        return self.value[0]

    @property
    def is_purge(self) -> bool:
        return self.value[1]


class TriggerContext(Protocol):
    """What a trigger may do; its state and timers belong to the current key and window."""

    def current_watermark_ms(self) -> int: ...

    def current_processing_time_ms(self) -> int: ...

    def register_event_time_timer(self, timestamp_ms: int) -> None: ...

    def delete_event_time_timer(self, timestamp_ms: int) -> None: ...

    def register_processing_time_timer(self, timestamp_ms: int) -> None: ...

    def delete_processing_time_timer(self, timestamp_ms: int) -> None: ...

    def get_state(self, name: str, default: Any = None) -> Any: ...

    def set_state(self, name: str, value: Any) -> None: ...

    def clear_state(self, name: str) -> None: ...

    def merge_state(self, name: str, merge: Callable[[Any, Any], Any]) -> None:
        """In ``on_merge``: combine the merged windows' values of ``name`` into the new window."""
        ...


class Trigger:
    """The base of every trigger; each method's default does nothing and continues."""

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """True if the trigger works with merging (session) windows, i.e. implements ``on_merge``."""
        return False

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        """Delete the timers and state this trigger keeps for ``window``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end; at once for an element of a passed window.

    The immediate firing is what re-fires a window for a late element within the allowed lateness.
    """

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        max_ts = window.max_timestamp()
        if max_ts <= ctx.current_watermark_ms():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(max_ts)
        return TriggerResult.CONTINUE

    def on_event_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time_ms == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        # A merged window that the watermark already passed needs no timer: its elements fired it.
        max_ts = window.max_timestamp()
        if max_ts > ctx.current_watermark_ms():
            ctx.register_event_time_timer(max_ts)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class ProcessingTimeTrigger(Trigger):
    """Fires when processing time reaches the window's end."""

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        max_ts = window.max_timestamp()
        if max_ts > ctx.current_processing_time_ms():
            ctx.register_processing_time_timer(max_ts)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())


class NeverTrigger(Trigger):
    """Never fires: the default of ``GlobalWindows``, which need a trigger of their own."""

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        pass


def _add(a: int, b: int) -> int:
    return a + b


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be an int > 0, got {value!r}")
    return value


class CountTrigger(Trigger):
    """Fires each time a window has received ``max_count`` more elements.

    >>> CountTrigger(3)
    CountTrigger(max_count=3)
    """

    def __init__(self, max_count: int) -> None:
        self.max_count = _positive("max_count", max_count)

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        count = ctx.get_state("count", 0) + 1
        if count >= self.max_count:
            ctx.clear_state("count")
            return TriggerResult.FIRE
        ctx.set_state("count", count)
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        ctx.merge_state("count", _add)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        ctx.clear_state("count")

    def __repr__(self) -> str:
        return f"CountTrigger(max_count={self.max_count})"


class _ContinuousTrigger(Trigger):
    """Fires every ``interval_ms`` while the window has elements; one clock, given by the subclass.

    The next firing time is trigger state (``fire_ms``), aligned to multiples of the interval and
    never past the window's end, where the firings stop (an element that comes later fires the
    window once more); merged windows keep the earliest.
    """

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = _positive("interval_ms", interval_ms)

    def _register_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        raise NotImplementedError

    def _delete_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        raise NotImplementedError

    def _fire_if_due(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        if ctx.get_state("fire_ms") == time_ms:
            ctx.clear_state("fire_ms")
            # The window's end is the last firing. Past it, the next firing would be capped at the
            # end again, a timer at the time that fires it: for ever, on an event-time window
            # whose end processing time passes (Flink loops there).
            if time_ms < window.max_timestamp():
                self._register_next(time_ms, window, ctx)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def _register_next(self, time_ms: int, window: Any, ctx: TriggerContext) -> None:
        next_ms = min(time_ms + self.interval_ms, window.max_timestamp())
        ctx.set_state("fire_ms", next_ms)
        self._register_timer(ctx, next_ms)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        ctx.merge_state("fire_ms", min)
        next_ms = ctx.get_state("fire_ms")
        if next_ms is not None:
            self._register_timer(ctx, next_ms)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        fire_ms = ctx.get_state("fire_ms")
        if fire_ms is not None:
            self._delete_timer(ctx, fire_ms)
            ctx.clear_state("fire_ms")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(interval_ms={self.interval_ms})"


class ContinuousEventTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval_ms`` of event time while the window is open, and at its end.

    Firing times are aligned to multiples of the interval and never pass the window's end.
    """

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        max_ts = window.max_timestamp()
        if max_ts <= ctx.current_watermark_ms():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(max_ts)
        if ctx.get_state("fire_ms") is None and timestamp_ms is not None:
            self._register_next(timestamp_ms - timestamp_ms % self.interval_ms, window, ctx)
        return TriggerResult.CONTINUE

    def on_event_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        if time_ms == window.max_timestamp():
            return TriggerResult.FIRE
        return self._fire_if_due(time_ms, window, ctx)

    def _register_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        ctx.register_event_time_timer(time_ms)

    def _delete_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        ctx.delete_event_time_timer(time_ms)


class ContinuousProcessingTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval_ms`` of processing time while the window has elements."""

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        if ctx.get_state("fire_ms") is None:
            now = ctx.current_processing_time_ms()
            self._register_next(now - now % self.interval_ms, window, ctx)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._fire_if_due(time_ms, window, ctx)

    def _register_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        ctx.register_processing_time_timer(time_ms)

    def _delete_timer(self, ctx: TriggerContext, time_ms: int) -> None:
        ctx.delete_processing_time_timer(time_ms)


class PurgingTrigger(Trigger):
    """Wraps a trigger and purges the window each time it fires.

    >>> PurgingTrigger(CountTrigger(2))
    PurgingTrigger(CountTrigger(max_count=2))
    """

    def __init__(self, nested: Trigger) -> None:
        if not isinstance(nested, Trigger):
            raise ConfigurationError(f"PurgingTrigger wraps a Trigger, got {type(nested).__name__}")
        self.nested = nested

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire else result

    def on_element(self, value: Any, timestamp_ms: int | None, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_element(value, timestamp_ms, window, ctx))

    def on_event_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_event_time(time_ms, window, ctx))

    def on_processing_time(self, time_ms: int, window: Any, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_processing_time(time_ms, window, ctx))

    def can_merge(self) -> bool:
        return self.nested.can_merge()

    def on_merge(self, window: Any, ctx: TriggerContext) -> None:
        self.nested.on_merge(window, ctx)

    def clear(self, window: Any, ctx: TriggerContext) -> None:
        self.nested.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested!r})"
