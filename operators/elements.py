"""Stream elements: records, watermarks, watermark status and checkpoint barriers.

Time is an ``int`` of milliseconds. A record's ``timestamp_ms`` is ``None`` when the stream has
no event time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

__all__ = [
    "CheckpointBarrier",
    "MAX_WATERMARK",
    "MIN_TIMESTAMP",
    "Record",
    "StreamElement",
    "Watermark",
    "WatermarkStatus",
]

#: The smallest and largest representable event times (Java's Long range, as in Flink).
MIN_TIMESTAMP = -(2**63)
MAX_WATERMARK = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Record:
    """One value with an optional event time."""

    value: Any
    timestamp_ms: int | None = None

    def with_value(self, value: Any) -> "Record":
        """The same event time with another value (outputs keep the input's timestamp)."""
        return Record(value, self.timestamp_ms)


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached ``timestamp_ms``: no record at or before it should follow."""

    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """An input became idle (it holds back no watermark) or active again."""

    idle: bool

    @classmethod
    def IDLE(cls) -> "WatermarkStatus":  # noqa: N802 - Flink's name
        return cls(True)

    @classmethod
    def ACTIVE(cls) -> "WatermarkStatus":  # noqa: N802 - Flink's name
        return cls(False)


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Everything before the barrier belongs to checkpoint ``checkpoint_id``."""

    checkpoint_id: int


StreamElement = Union[Record, Watermark, WatermarkStatus, CheckpointBarrier]
