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

A checkpoint holds items as plain data (``operators.state``): ``plain_item`` writes one and
``item_of`` reads it back; a ``Records`` batch is the host's, which says how to write it.

>>> item: ChannelItem = Watermark(5)
>>> match item:
...     case Watermark(timestamp_ms=ts):
...         ts
5
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, TypeAlias, Union

from .elements import CheckpointBarrier, Watermark, WatermarkStatus
from .errors import StateFormatError
from .state import table_bytes, table_of

__all__ = [
    "ChannelItem",
    "END_OF_INPUT",
    "EndOfInput",
    "PartialAggregates",
    "Partitioning",
    "Records",
    "channels_of",
    "item_of",
    "plain_channels",
    "plain_item",
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


def plain_item(item: ChannelItem, plain_batch: Callable[[Any], Any]) -> tuple[Any, ...]:
    """``item`` as plain data (``operators.state``'s ``item``); ``plain_batch`` writes the batch of
    a ``Records`` item, which is the host's (on Ray, an ``actors.arrow_rows.RowBatch``).

    >>> plain_item(Watermark(5), plain_batch=list), item_of(("status", True), batch_of=list)
    (('watermark', 5), WatermarkStatus(idle=True))
    """
    match item:
        case Records(batch=batch):
            return ("records", plain_batch(batch))
        case PartialAggregates(table=table, rows=rows):
            return ("partials", table_bytes(table), rows)
        case Watermark(timestamp_ms=timestamp_ms):
            return ("watermark", timestamp_ms)
        case WatermarkStatus(idle=idle):
            return ("status", idle)
        case CheckpointBarrier(checkpoint_id=checkpoint_id):
            return ("barrier", checkpoint_id)
        case EndOfInput():
            return ("end",)
    raise StateFormatError(f"a channel item must be one of {_KINDS}, got {type(item).__name__}")


def item_of(plain: Any, batch_of: Callable[[Any], Any]) -> ChannelItem:
    """The item that ``plain_item`` wrote; ``batch_of`` reads a ``Records`` batch."""
    match plain:
        case ("records", batch):
            return Records(batch_of(batch))
        case ("partials", data, rows):
            return PartialAggregates(table_of(data), rows)
        case ("watermark", timestamp_ms):
            return Watermark(timestamp_ms)
        case ("status", idle):
            return WatermarkStatus(idle)
        case ("barrier", checkpoint_id):
            return CheckpointBarrier(checkpoint_id)
        case ("end",):
            return END_OF_INPUT
    raise StateFormatError(
        "a channel item in a snapshot is ('records', batch), ('partials', table, rows), ('watermark', ms), "
        f"('status', idle), ('barrier', checkpoint_id) or ('end',), got {plain!r}"
    )


def plain_channels(channels: list[list[ChannelItem]], plain_batch: Callable[[Any], Any]) -> list[list[tuple[Any, ...]]]:
    """Each channel's items as plain data: a checkpoint's in-flight input, or its overtaken output."""
    return [[plain_item(item, plain_batch) for item in items] for items in channels]


def channels_of(plain: list[list[Any]], batch_of: Callable[[Any], Any]) -> list[list[ChannelItem]]:
    """The channels' items that ``plain_channels`` wrote."""
    return [[item_of(item, batch_of) for item in items] for items in plain]


_KINDS = "Records, PartialAggregates, Watermark, WatermarkStatus, CheckpointBarrier or EndOfInput"


class Partitioning(StrEnum):
    """How records reach the instances of the next stage (Flink's partitioners).

    A ``StrEnum``: ``Partitioning("hash")`` reads a name written as text.
    """

    FORWARD = "forward"  # instance i to instance i, one channel
    HASH = "hash"  # by key: a key's records always reach the same instance
    REBALANCE = "rebalance"  # round-robin, a batch at a time
