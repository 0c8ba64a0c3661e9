"""The unordered queue: records leave as they finish, but never across a watermark or a status."""

from __future__ import annotations

from collections import deque
from typing import Iterator

from .stream_element_queue import MarkerEntry, QueueEntry

__all__ = ["UnorderedQueue"]


class _Segment:
    """The records between two markers, or one marker (a watermark or a status) on its own."""

    __slots__ = ("incomplete", "completed", "is_marker")

    def __init__(self, is_marker: bool) -> None:
        # dict keeps insertion order, so snapshots are deterministic.
        self.incomplete: dict[int, QueueEntry] = {}
        self.completed: deque[QueueEntry] = deque()
        self.is_marker = is_marker

    def is_empty(self) -> bool:
        return not self.incomplete and not self.completed


class UnorderedQueue:
    """Flink's ``UnorderedStreamElementQueue``.

    Entries are grouped in segments split by markers (watermarks and watermark statuses). Only
    the first segment may emit, in completion order; a marker is a segment of its own. So a
    record never overtakes a marker, and a marker never overtakes a record. Markers count
    against capacity.

    Flink's queue knows watermarks only, and a status passes the async operator at once. Here a
    status is a barrier too: records after an IDLE leave after it, those before it before it.

    Threading model: mailbox thread only.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._segments: deque[_Segment] = deque()
        self._size = 0

    def try_put(self, entry: QueueEntry) -> bool:
        if self._size >= self.capacity:
            return False
        if isinstance(entry, MarkerEntry):
            segment = _Segment(is_marker=True)
            segment.completed.append(entry)
            self._segments.append(segment)
        else:
            if not self._segments or self._segments[-1].is_marker:
                self._segments.append(_Segment(is_marker=False))
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
