"""Stream elements: records, watermarks, watermark status and checkpoint barriers.

Time is an ``int`` of milliseconds. A record's ``timestamp_ms`` is ``None`` when the stream has
no event time.

A record's ``origin`` says where it came from, as a tuple of ints and strings (a source gives,
for instance, ``(split, piece, row)``). It depends on the input alone, never on timing, so a
record replayed after a restore has the origin it had the first time; async operators build
their idempotency keys from it. Operators pass it on: a map's output keeps it, the ``i``-th
output of a flat map gets ``origin + (i,)``.
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


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """One value with an optional event time and an optional origin (see the module docstring).

    >>> Record("a", 5, origin=(0, 3, 17)).with_value("A")
    Record(value='A', timestamp_ms=5, origin=(0, 3, 17))
    """

    value: Any
    timestamp_ms: int | None
    origin: tuple[Any, ...] | None

    def __init__(self, value: Any, timestamp_ms: int | None = None, origin: tuple[Any, ...] | None = None) -> None:
        # Frozen: a dataclass's own __init__ goes through object.__setattr__ for each field; the
        # slots' descriptors set them in a third less time, and a record is made per record.
        _set_value(self, value)
        _set_timestamp(self, timestamp_ms)
        _set_origin(self, origin)

    def with_value(self, value: Any) -> "Record":
        """The same event time and origin with another value (outputs keep the input's)."""
        return Record(value, self.timestamp_ms, self.origin)

    def __repr__(self) -> str:
        # Most records have no origin; leaving it out keeps outputs and test failures readable.
        if self.origin is None:
            return f"Record(value={self.value!r}, timestamp_ms={self.timestamp_ms!r})"
        return f"Record(value={self.value!r}, timestamp_ms={self.timestamp_ms!r}, origin={self.origin!r})"


# The slots' member descriptors (read from the class's namespace: ``Record.value`` means the
# field to a type checker).
_set_value = Record.__dict__["value"].__set__
_set_timestamp = Record.__dict__["timestamp_ms"].__set__
_set_origin = Record.__dict__["origin"].__set__


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached ``timestamp_ms``: no record at or before it should follow."""

    timestamp_ms: int

    def __reduce__(self) -> tuple[Any, ...]:
        # Watermarks travel pickled in channel calls: see channel_items' items.
        return (Watermark, (self.timestamp_ms,))


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """An input became idle (it holds back no watermark) or active again."""

    idle: bool

    def __reduce__(self) -> tuple[Any, ...]:
        return (WatermarkStatus, (self.idle,))

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

    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckpointBarrier, (self.checkpoint_id,))


StreamElement = Union[Record, Watermark, WatermarkStatus, CheckpointBarrier]
