"""The ordered queue: entries leave in the order they came, whenever they finish."""

from __future__ import annotations

from collections import deque
from typing import Iterator

from .stream_element_queue import QueueEntry

__all__ = ["OrderedQueue"]


class OrderedQueue:
    """Flink's ``OrderedStreamElementQueue``: only a completed head may leave.

    Threading model: mailbox thread only.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: deque[QueueEntry] = deque()

    def try_put(self, entry: QueueEntry) -> bool:
        if len(self._entries) >= self.capacity:
            return False
        self._entries.append(entry)
        return True

    def on_complete(self, entry: QueueEntry) -> None:
        entry.done = True

    def pop_completed(self) -> QueueEntry | None:
        """The head, taken out, if it has completed; else None."""
        entries = self._entries
        return entries.popleft() if entries and entries[0].done else None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[QueueEntry]:
        """The entries not yet emitted, in input order (for snapshots)."""
        return iter(list(self._entries))
