"""A late record, and why it was late: what the late-data side output and the metrics say of it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["LateReason", "LateRecord"]


class LateReason(StrEnum):
    """Why a record was late for every window it was assigned."""

    #: Its windows ended before the watermark, and the operator allows no lateness.
    BEHIND_WATERMARK = "behind_watermark"
    #: Its windows ended longer ago than the allowed lateness: they were fired and cleaned up.
    PAST_ALLOWED_LATENESS = "past_allowed_lateness"
    #: It would open again a session of its key that was already emitted and cleaned up.
    WINDOW_CLOSED = "window_closed"


@dataclass(frozen=True, slots=True)
class LateRecord:
    """A late record as the late-data side output holds it: what a user needs to act on it.

    ``windows`` are the ``(start_ms, end_ms)`` of the windows it missed; ``watermark_ms`` is the
    operator's watermark when it came, which says how far event time had gone.
    """

    value: Any
    timestamp_ms: int
    reason: LateReason
    windows: tuple[tuple[int, int], ...]
    watermark_ms: int

    def to_state(self) -> tuple[Any, ...]:
        """As plain data, a side output's ``("late", ...)`` in ``operators.state`` (the reason as its str)."""
        windows = [(start_ms, end_ms) for start_ms, end_ms in self.windows]
        return ("late", self.value, self.timestamp_ms, self.reason.value, windows, self.watermark_ms)

    @classmethod
    def from_state(cls, state: tuple[Any, ...]) -> LateRecord:
        """The late record that ``to_state`` wrote."""
        _, value, timestamp_ms, reason, windows, watermark_ms = state
        return cls(value, timestamp_ms, LateReason(reason), tuple((s, e) for s, e in windows), watermark_ms)
