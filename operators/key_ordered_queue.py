"""The key-ordered queue: a key's records leave in the order they came; other keys overtake freely.

Between two markers (watermarks, watermark statuses) records leave as they finish, as in the
unordered queue, except that a record leaves only once every record of its key taken in before it
has left. A marker is a segment of its own, so no record crosses one, and a marker never overtakes a
record. So the cost of order is paid per key: a slow request holds back its own key only.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Hashable, Iterator

from .errors import ConfigurationError, UserFunctionError, describe_value
from .stream_element_queue import MarkerEntry, QueueEntry, RecordEntry

__all__ = ["KeyOrderedQueue", "OrderKey", "order_key_of"]


class OrderKey:
    """The order key of a row: the value of one column, or the tuple of several.

    >>> OrderKey("user_id")({"user_id": 7, "x": 1})
    7
    >>> OrderKey(("country", "user_id"))({"user_id": 7, "country": "DE"})
    ('DE', 7)
    """

    __slots__ = ("columns",)

    def __init__(self, columns: str | tuple[str, ...]) -> None:
        if isinstance(columns, list):
            columns = tuple(columns)
        if isinstance(columns, tuple):
            if not columns or not all(isinstance(c, str) for c in columns):
                raise ConfigurationError(f"order_key columns must be strs, got {columns!r}")
        elif not isinstance(columns, str):
            raise ConfigurationError(f"order_key must be a column name, a tuple of them or a function, got {columns!r}")
        self.columns = columns

    def __call__(self, row: Any) -> Hashable:
        columns = self.columns
        if isinstance(columns, str):
            return row[columns]
        return tuple(row[c] for c in columns)

    def __repr__(self) -> str:
        return f"OrderKey({self.columns!r})"


def order_key_of(order_key: Any) -> Callable[[Any], Hashable]:
    """A function of a record's value from what a user gives: a column name, a tuple of them, or a function."""
    if callable(order_key) and not isinstance(order_key, str | tuple | list):
        return order_key  # type: ignore[no-any-return]
    return OrderKey(order_key)


class _Segment:
    """The records between two markers, or one marker on its own."""

    __slots__ = ("entries", "by_key", "ready", "is_marker")

    def __init__(self, is_marker: bool) -> None:
        self.entries: dict[int, QueueEntry] = {}  # not yet emitted, in input order (for snapshots)
        self.by_key: dict[Hashable, deque[QueueEntry]] = {}  # per key, not yet emitted, in input order
        self.ready: deque[QueueEntry] = deque()  # may leave now, in the order they became free to
        self.is_marker = is_marker


class KeyOrderedQueue:
    """A queue whose records keep their order per key (``key_of(record.value)``).

    Threading model: mailbox thread only.
    """

    def __init__(self, capacity: int, key_of: Callable[[Any], Hashable], name: str = "async_wait") -> None:
        self.capacity = capacity
        self.key_of = key_of
        self.name = name
        self._segments: deque[_Segment] = deque()
        self._size = 0

    def try_put(self, entry: QueueEntry) -> bool:
        if self._size >= self.capacity:
            return False
        if isinstance(entry, MarkerEntry):
            segment = _Segment(is_marker=True)
            segment.entries[id(entry)] = entry
            segment.ready.append(entry)
            self._segments.append(segment)
            entry.segment = segment
            self._size += 1
            return True
        assert isinstance(entry, RecordEntry)
        key = self._key(entry)
        if not self._segments or self._segments[-1].is_marker:
            self._segments.append(_Segment(is_marker=False))
        segment = self._segments[-1]
        segment.entries[id(entry)] = entry
        same_key = segment.by_key.get(key)
        if same_key is None:
            segment.by_key[key] = same_key = deque()
        same_key.append(entry)
        entry.segment = (segment, key)
        self._size += 1
        return True

    def on_complete(self, entry: QueueEntry) -> None:
        entry.done = True
        segment, key = entry.segment
        same_key = segment.by_key.get(key)
        # Free to leave once it heads its key: it and the finished records right behind it.
        if same_key and same_key[0] is entry:
            while same_key and same_key[0].done:
                segment.ready.append(same_key.popleft())
            if not same_key:
                del segment.by_key[key]

    def pop_completed(self) -> QueueEntry | None:
        """A record of the first segment that may leave (the marker, for a marker's segment); else None."""
        if not self._segments:
            return None
        segment = self._segments[0]
        if not segment.ready:
            return None
        entry = segment.ready.popleft()
        del segment.entries[id(entry)]
        self._size -= 1
        if not segment.entries:
            self._segments.popleft()
        return entry

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[QueueEntry]:
        """The entries not yet emitted, in input order (for snapshots: a restore puts them back in it)."""
        out: list[QueueEntry] = []
        for segment in self._segments:
            out.extend(segment.entries.values())
        return iter(out)

    def _key(self, entry: RecordEntry) -> Hashable:
        try:
            key = self.key_of(entry.record.value)
            hash(key)
        except Exception as error:  # noqa: BLE001 - any failure of the user's key names the record
            raise UserFunctionError(
                f"the order key of record {describe_value(entry.record.value)} could not be computed with "
                f"{self.key_of!r}: {type(error).__name__}: {error}", operator=self.name, value=entry.record.value,
                timestamp_ms=entry.record.timestamp_ms) from error
        return key
