"""Queue entries shared by the ordered and unordered queues of the async operator.

Besides records, the queue holds markers: watermarks and watermark statuses. A marker is
complete from the start and leaves when its turn comes, so it never overtakes a record taken in
before it; in unordered mode it is also a barrier that no record crosses.
"""

from __future__ import annotations

from typing import Any

from .elements import Record, Watermark, WatermarkStatus
from .request_keys import RequestKey

__all__ = ["MarkerEntry", "QueueEntry", "RecordEntry", "StatusEntry", "WatermarkEntry"]


class QueueEntry:
    """An element in the async queue; ``done`` once its outcome is known."""

    __slots__ = ("done", "segment")

    def __init__(self) -> None:
        self.done = False
        self.segment: Any = None


class RecordEntry(QueueEntry):
    """A record whose request is in flight (or finished but not yet emitted).

    ``kind`` is one of ``result``, ``fallback`` or ``failure``; ``payload`` holds the result list
    or the exception. ``key`` is the record's idempotency key.
    """

    __slots__ = ("record", "key", "handler", "kind", "payload", "started_ms")

    def __init__(self, record: Record, key: RequestKey, started_ms: int | None = None) -> None:
        # QueueEntry's fields set here, not through its __init__: one call less per record.
        self.done = False
        self.segment = None
        self.record = record
        self.key = key
        self.started_ms = started_ms  # when its first attempt here started (processing time)
        self.handler: Any = None
        self.kind: str | None = None
        self.payload: Any = None


class MarkerEntry(QueueEntry):
    """A watermark or a watermark status: complete from the start, emitted when its turn comes."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.done = True


class WatermarkEntry(MarkerEntry):
    """A watermark."""

    __slots__ = ("watermark",)

    def __init__(self, watermark: Watermark) -> None:
        super().__init__()
        self.watermark = watermark


class StatusEntry(MarkerEntry):
    """A watermark status. It queues as a watermark does: an IDLE that overtook a record in
    flight would let the valve downstream pass another input's watermark, and the record would
    arrive late."""

    __slots__ = ("status",)

    def __init__(self, status: WatermarkStatus) -> None:
        super().__init__()
        self.status = status
