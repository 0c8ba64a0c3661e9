"""The merging window set: which state window holds the contents of each merged window.

When session windows merge, moving their contents to a fresh place would cost a copy each time.
Instead each live (merged) window maps to a *state window*: the window under which its contents
were first stored. A merge keeps one of the merged windows' state windows for the result and
asks the operator to fold the others' contents (and trigger state) into it, exactly once.

One set per key. The mapping is plain data and goes into snapshots as it is.

>>> from actorflow.operators.windows.assigners import EventTimeSessionWindows, TimeWindow
>>> s = MergingWindowSet(EventTimeSessionWindows(10))
>>> s.add_window(TimeWindow(0, 10), lambda *a: None)
TimeWindow(start_ms=0, end_ms=10)
>>> merged = []
>>> s.add_window(TimeWindow(5, 15), lambda result, windows, state, states: merged.append((result, windows, state, states)))
TimeWindow(start_ms=0, end_ms=15)
>>> merged
[(TimeWindow(start_ms=0, end_ms=15), [TimeWindow(start_ms=0, end_ms=10)], TimeWindow(start_ms=0, end_ms=10), [])]
>>> s.get_state_window(TimeWindow(0, 15))
TimeWindow(start_ms=0, end_ms=10)
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import ActorflowError
from .assigners import MergingWindowAssigner

__all__ = ["MergeCheck", "MergeFunction", "MergingWindowSet"]

#: ``merge(merge_result, merged_windows, state_window_of_result, merged_state_windows)``: fold the
#: contents of ``merged_state_windows`` into ``state_window_of_result``, and the trigger state of
#: ``merged_windows`` into ``merge_result``.
MergeFunction = Callable[[Any, list[Any], Any, list[Any]], None]

#: ``check(merge_result, windows_to_merge)``: raise if the assigner's merge cannot be taken.
MergeCheck = Callable[[Any, list[Any]], None]


class MergingWindowSet:
    """Live windows of one key, each with the state window that holds its contents."""

    __slots__ = ("_assigner", "mapping")

    def __init__(self, assigner: MergingWindowAssigner[Any], mapping: dict[Any, Any] | None = None) -> None:
        self._assigner = assigner
        self.mapping: dict[Any, Any] = dict(mapping) if mapping else {}

    def __len__(self) -> int:
        return len(self.mapping)

    def get_state_window(self, window: Any) -> Any | None:
        """The state window of a live window, or None if the window is not (or no longer) live."""
        return self.mapping.get(window)

    def retire_window(self, window: Any) -> None:
        """Forget a window that was cleaned up."""
        if self.mapping.pop(window, None) is None:
            raise ActorflowError(f"window {window!r} is not in the merging window set; expected one of {list(self.mapping)}")

    def add_window(self, new_window: Any, merge: MergeFunction, check: MergeCheck | None = None) -> Any:
        """Add a window, merging it with overlapping live windows; returns the window it ended up in.

        ``merge`` is called once per merge that involves a window with contents; merging the new,
        still empty window into an existing one that it does not extend calls nothing. ``check``
        sees every merge the assigner reports before anything changes, so a refused merge leaves
        the set as it was.
        """
        windows = list(self.mapping)
        windows.append(new_window)
        merge_results: list[tuple[Any, list[Any]]] = []
        self._assigner.merge_windows(windows, lambda to_merge, result: merge_results.append((result, list(to_merge))))
        if check is not None:
            for merge_result, merged_windows in merge_results:
                check(merge_result, merged_windows)

        result_window = new_window
        merged_new_window = False
        for merge_result, merged_windows in merge_results:
            if new_window in merged_windows:
                merged_windows.remove(new_window)
                merged_new_window = True
                result_window = merge_result
            # Keep the state window of one merged window; the others' contents move into it.
            kept_state_window = self.mapping[merged_windows[0]]
            merged_state_windows = []
            for w in merged_windows:
                state_window = self.mapping.pop(w, None)
                if state_window is not None and state_window != kept_state_window:
                    merged_state_windows.append(state_window)
            self.mapping[merge_result] = kept_state_window
            # The new window alone folded into a window that already covers it: nothing to merge.
            if not (len(merged_windows) == 1 and merged_windows[0] == merge_result):
                merge(merge_result, merged_windows, kept_state_window, merged_state_windows)

        if not merge_results or (result_window == new_window and not merged_new_window):
            self.mapping[result_window] = result_window
        return result_window

    def __repr__(self) -> str:
        return f"MergingWindowSet({self.mapping!r})"
