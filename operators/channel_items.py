"""What travels on a channel between operator instances, and how records are partitioned.

A channel carries *items*, one class per kind, each handled by one ``match`` at the receiver:

- ``Records``: a batch of records (on Ray, an ``actors.arrow_rows.RowBatch``: Arrow columns,
  event times and origins);
- ``PartialAggregates``: a keyed window stage's partial aggregates of a batch, and how many
  input rows they stand for;
- ``Watermark``, ``WatermarkStatus`` and ``CheckpointBarrier`` (the stream elements);
- ``EndOfInput``: the channel carries nothing more.

Items are per batch, never per record: a frozen, slotted instance costs a few hundred
nanoseconds against a batch of thousands of rows.

>>> item: ChannelItem = Watermark(5)
>>> match item:
...     case Watermark(timestamp_ms=ts):
...         ts
5
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias, Union

from .elements import CheckpointBarrier, Watermark, WatermarkStatus

__all__ = [
    "ChannelItem",
    "END_OF_INPUT",
    "EndOfInput",
    "PartialAggregates",
    "Partitioning",
    "Records",
]


@dataclass(frozen=True, slots=True)
class Records:
    """A batch of records; ``batch`` has ``num_rows``."""

    batch: Any

    def __reduce__(self) -> tuple[Any, ...]:
        # Items travel pickled in every channel call; a frozen, slotted dataclass's own pickling
        # sets each field through object.__setattr__, about ten times slower than this.
        return (type(self), (self.batch,))


@dataclass(frozen=True, slots=True)
class PartialAggregates:
    """A table of partial aggregates (a row per key and window) made of ``rows`` input rows."""

    table: Any
    rows: int

    def __reduce__(self) -> tuple[Any, ...]:
        # Items travel pickled in every channel call; a frozen, slotted dataclass's own pickling
        # sets each field through object.__setattr__, about ten times slower than this.
        return (type(self), (self.table, self.rows))


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The channel has ended: nothing follows on it."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Items travel pickled in every channel call; a frozen, slotted dataclass's own pickling
        # sets each field through object.__setattr__, about ten times slower than this.
        return (type(self), ())


#: The one instance senders use (any ``EndOfInput`` matches the same case).
END_OF_INPUT = EndOfInput()

ChannelItem: TypeAlias = Union[Records, PartialAggregates, Watermark, WatermarkStatus, CheckpointBarrier, EndOfInput]


class Partitioning(StrEnum):
    """How records reach the instances of the next stage (Flink's partitioners).

    A ``StrEnum``: ``Partitioning("hash")`` reads a name written as text.
    """

    FORWARD = "forward"  # instance i to instance i, one channel
    HASH = "hash"  # by key: a key's records always reach the same instance
    REBALANCE = "rebalance"  # round-robin, a batch at a time
