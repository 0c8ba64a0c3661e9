"""The contexts a window operator hands to triggers, evictors and ``process`` functions.

One context object of each kind per operator, re-pointed at the current key and window before
each call (as Flink does), so that no element pays for a new object.

Threading model: used on the mailbox thread only, during the call it was handed to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..errors import RecordError

if TYPE_CHECKING:
    from .window_operator import WindowOperator

__all__ = ["WindowContexts"]

_EMPTY: Any = object()


class _TriggerContext:
    """A trigger's (and an evictor's) view of the operator, for one key and window."""

    __slots__ = ("_op", "key", "window", "merged_windows")

    def __init__(self, op: "WindowOperator") -> None:
        self._op = op
        self.key: Any = None
        self.window: Any = None
        self.merged_windows: list[Any] = []

    def current_watermark_ms(self) -> int:
        return self._op._watermark

    def current_processing_time_ms(self) -> int:
        return self._op._pts.now_ms()

    def register_event_time_timer(self, timestamp_ms: int) -> None:
        self._op._timers.register_event_time_timer(timestamp_ms, self.key, self.window)

    def delete_event_time_timer(self, timestamp_ms: int) -> None:
        self._op._timers.delete_event_time_timer(timestamp_ms, self.key, self.window)

    def register_processing_time_timer(self, timestamp_ms: int) -> None:
        self._op._timers.register_processing_time_timer(timestamp_ms, self.key, self.window)

    def delete_processing_time_timer(self, timestamp_ms: int) -> None:
        self._op._timers.delete_processing_time_timer(timestamp_ms, self.key, self.window)

    def get_state(self, name: str, default: Any = None) -> Any:
        state = self._op._trigger_state.get((self.key, self.window))
        return default if state is None else state.get(name, default)

    def set_state(self, name: str, value: Any) -> None:
        state = self._op._trigger_state.get((self.key, self.window))
        if state is None:
            state = self._op._trigger_state[(self.key, self.window)] = {}
        state[name] = value

    def clear_state(self, name: str) -> None:
        state = self._op._trigger_state.get((self.key, self.window))
        if state is not None:
            state.pop(name, None)
            if not state:
                del self._op._trigger_state[(self.key, self.window)]

    def merge_state(self, name: str, merge: Callable[[Any, Any], Any]) -> None:
        acc = self.get_state(name, _EMPTY)
        for window in self.merged_windows:
            state = self._op._trigger_state.get((self.key, window))
            if state is not None and name in state:
                value = state[name]
                acc = value if acc is _EMPTY else merge(acc, value)
        if acc is not _EMPTY:
            self.set_state(name, acc)


class _ProcessContext:
    """A ``process`` function's view: the window, time, its state, and side outputs."""

    __slots__ = ("_op", "key", "window")

    def __init__(self, op: "WindowOperator") -> None:
        self._op = op
        self.key: Any = None
        self.window: Any = None

    def current_watermark_ms(self) -> int:
        return self._op._watermark

    def current_processing_time_ms(self) -> int:
        return self._op._pts.now_ms()

    @property
    def window_state(self) -> dict[str, Any]:
        if self._op.assigner.is_merging:
            # The state would have to follow merges, which nothing could do correctly for any dict.
            raise RecordError(
                f"per-window state is not available with merging windows ({self._op.assigner!r}); "
                "use global_state, or a non-merging assigner",
                operator=self._op.context.name,
            )
        state = self._op._window_state.get((self.key, self.window))
        if state is None:
            state = self._op._window_state[(self.key, self.window)] = {}
        return state

    @property
    def global_state(self) -> dict[str, Any]:
        state = self._op._global_state.get(self.key)
        if state is None:
            state = self._op._global_state[self.key] = {}
        return state

    def output(self, tag: str, value: Any) -> None:
        self._op.output.collect_side(tag, value)


class WindowContexts:
    """The operator's trigger and process contexts, and the function that merges windows of a key."""

    __slots__ = ("_op", "trigger", "process")

    def __init__(self, op: "WindowOperator") -> None:
        self._op = op
        self.trigger = _TriggerContext(op)
        self.process = _ProcessContext(op)

    def merge_function(self, key: Any) -> Callable[[Any, list[Any], Any, list[Any]], None]:
        op = self._op
        ctx = self.trigger

        def merge(result: Any, merged_windows: list[Any], state_window: Any, merged_state_windows: list[Any]) -> None:
            ctx.key = key
            ctx.window = result
            ctx.merged_windows = merged_windows
            op.trigger.on_merge(result, ctx)
            ctx.merged_windows = []
            # The merged windows' timers and trigger state go: they must not fire a second time.
            for window in merged_windows:
                if window == result:
                    continue
                ctx.window = window
                op.trigger.clear(window, ctx)
                op._trigger_state.pop((key, window), None)
                op._delete_cleanup_timer(key, window)
            contents = op._contents
            target = (key, state_window)
            acc = contents.get(target, _EMPTY)
            for source in merged_state_windows:
                value = contents.pop((key, source), _EMPTY)
                if value is not _EMPTY:
                    acc = value if acc is _EMPTY else op.merge_contents(acc, value, result)
            if acc is not _EMPTY:
                contents[target] = acc

        return merge
