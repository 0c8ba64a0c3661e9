"""The unordered queue: records leave as they finish, but never across a watermark."""

from __future__ import annotations

from collections import deque
from typing import Iterator

from .stream_element_queue import QueueEntry, WatermarkEntry

__all__ = ["UnorderedQueue"]


class _Segment:
    """The records between two watermarks, or one watermark on its own."""

    __slots__ = ("incomplete", "completed", "is_watermark")

    def __init__(self, is_watermark: bool) -> None:
        # dict keeps insertion order, so snapshots are deterministic.
        self.incomplete: dict[int, QueueEntry] = {}
        self.completed: deque[QueueEntry] = deque()
        self.is_watermark = is_watermark

    def is_empty(self) -> bool:
        return not self.incomplete and not self.completed


class UnorderedQueue:
    """Flink's ``UnorderedStreamElementQueue``.

    Entries are grouped in segments split by watermarks. Only the first segment may emit, in
    completion order; a watermark is a segment of its own. So a record never overtakes a
    watermark, and a watermark never overtakes a record. Watermarks count against capacity.

    Threading model: mailbox thread only.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._segments: deque[_Segment] = deque()
        self._size = 0

    def try_put(self, entry: QueueEntry) -> bool:
        if self._size >= self.capacity:
            return False
        if isinstance(entry, WatermarkEntry):
            segment = _Segment(is_watermark=True)
            segment.completed.append(entry)
            self._segments.append(segment)
        else:
            if not self._segments or self._segments[-1].is_watermark:
                self._segments.append(_Segment(is_watermark=False))
            segment = self._segments[-1]
            segment.incomplete[id(entry)] = entry
        entry.segment = segment
        self._size += 1
        return True

    def on_complete(self, entry: QueueEntry) -> None:
        entry.done = True
        segment: _Segment = entry.segment
        if segment.incomplete.pop(id(entry), None) is not None:
            segment.completed.append(entry)

    def pop_completed(self) -> QueueEntry | None:
        """A completed entry of the first segment, taken out (the earliest completed); else None."""
        if not self._segments:
            return None
        segment = self._segments[0]
        if not segment.completed:
            return None
        entry = segment.completed.popleft()
        self._size -= 1
        if segment.is_empty():
            self._segments.popleft()
        return entry

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[QueueEntry]:
        """The entries not yet emitted, segment by segment (for snapshots)."""
        out: list[QueueEntry] = []
        for segment in self._segments:
            out.extend(segment.completed)
            out.extend(segment.incomplete.values())
        return iter(out)
