"""The stream task: what an operator chain's host does with its input (after Flink's ``StreamTask``,
``StreamOneInputProcessor`` / ``StreamMultipleInputProcessor`` and ``CheckpointBarrierHandler``).

It decides the order of records, watermarks, statuses, barriers and the end of input over N
channels, and it takes the snapshot. The harness and the operator actor both host it, so a ring-1
test drives exactly what runs on Ray.

- Input is taken from ``InputChannels``: round-robin, a channel held by a barrier gives nothing
  until every live channel has delivered it (aligned, exactly once).
- One ``match`` dispatches the channel items. A batch of records is fed record by record,
  ``rows_per_round`` at most per default action, stopping as soon as the chain is blocked; a head
  that takes whole Arrow batches (``TakesArrowBatches``) gets them whole; partial aggregates go to
  a head that merges them (``MergesPartials``).
- A ``StatusWatermarkValve`` takes the minimum over the channels, leaving out idle and ended ones.
  When every channel has ended, event time ends (``MAX_WATERMARK``) if it had begun: some channel
  said a watermark, or the output watermark moved. Then the chain ends its input and drains.
- At an aligned barrier the host takes the checkpoint (``TaskHost.snapshot``) with the items in
  front of the barriers; ``snapshot_state`` is the task's part of it (records of a batch not yet
  fed, the valve, the channels ended, the watermark), and ``restore_state`` takes it back.
- Fault points (``queue_full``, ``window_fire``) are named moments a chaos test can end the
  process at; the host says what happens there (``TaskHost.fault_point``).

Threading model
    Everything runs on the mailbox thread: ``default_action`` is the mailbox's default action,
    and the host calls ``wake`` (from a mail, or a callback on that thread) when input, room or
    progress arrived.

Lifecycle
    RUNNING → FINISHING (every channel ended: the chain got ``end_input``) → FINISHED (the chain
    drained; the host's ``finished`` ran once).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from .channel_items import ChannelItem, EndOfInput, PartialAggregates, Records
from .elements import MAX_WATERMARK, MIN_TIMESTAMP, Record, StreamElement, Watermark, WatermarkStatus
from .input_channels import InputChannels
from .mailbox_processor import DefaultActionController, Suspension
from .operator import OperatorChain
from .watermarks import StatusWatermarkValve

__all__ = ["MergesPartials", "StreamTask", "Suspended", "TakesArrowBatches", "TaskHost"]


class Suspended(StrEnum):
    """Why the task's default action waits: what a user watching an instance needs to know."""

    #: Downstream takes no more: the output is full.
    BACKPRESSURE = "backpressure"
    #: An async operator's queue is full: it waits for requests to complete.
    ASYNC_QUEUE_FULL = "async_queue_full"
    #: A barrier came on some channels, which hold back their items until it came on all.
    BARRIER_ALIGNMENT = "barrier_alignment"
    #: No input has come.
    NO_INPUT = "no_input"
    #: The input has ended; the last requests or timers are still to complete.
    FINISHING = "finishing"

# The members as module constants: the task suspends up to once per record (a full async queue),
# and on Python 3.11 reading ``Suspended.X`` goes through a descriptor (about 70 ns).
_BACKPRESSURE, _ASYNC_QUEUE_FULL, _BARRIER_ALIGNMENT, _NO_INPUT, _FINISHING = (
    Suspended.BACKPRESSURE, Suspended.ASYNC_QUEUE_FULL, Suspended.BARRIER_ALIGNMENT, Suspended.NO_INPUT, Suspended.FINISHING)

#: A batch's rows as ``(value, timestamp_ms)`` pairs, and each row's origin (or None for all).
Rows = tuple[list[tuple[Any, int | None]], list[Any] | None]


@runtime_checkable
class TakesArrowBatches(Protocol):
    """A head operator that takes a batch whole, with its event times (the window operator)."""

    def process_timestamped_batch(self, table: Any, timestamps: Any) -> None: ...


@runtime_checkable
class MergesPartials(Protocol):
    """A head operator that merges partial aggregates its peers made of batches; returns the
    input rows they stand for."""

    def process_partials(self, table: Any, rows: int) -> int: ...


class TaskHost(Protocol):
    """What the host of a stream task provides."""

    def output_is_full(self) -> bool:
        """The output takes nothing more for now (the host wakes the task when it does)."""

    def rows_of(self, batch: Any) -> Rows:
        """The rows of a ``Records`` item's batch."""

    def whole_batch(self, batch: Any) -> tuple[Any, Any] | None:
        """A batch's columns and event times, for a head that ``TakesArrowBatches``; None where
        its records must go one by one."""

    def snapshot(self, checkpoint_id: int, in_front: list[list[ChannelItem]]) -> None:
        """Take checkpoint ``checkpoint_id`` now; ``in_front``: each channel's items before its barrier."""

    def finished(self, controller: DefaultActionController) -> None:
        """The chain drained after the end of every input."""

    def fault_point(self, moment: str) -> None:
        """The task reached ``moment`` (see ``cluster.chaos.MOMENTS``)."""

    def emitted(self) -> int:
        """Records the chain has emitted so far (a watermark that fires a window emits some)."""


class StreamTask:
    """Feeds a chain from ``channels``; see the module docstring."""

    def __init__(
        self, chain: OperatorChain, channels: InputChannels, host: TaskHost, *, rows_per_round: int = 256,
    ) -> None:
        self.chain = chain
        self.channels = channels
        self.host = host
        self.rows_per_round = rows_per_round
        self.valve = StatusWatermarkValve(channels.num_channels)
        self.ended: set[int] = set()
        self.current_watermark = MIN_TIMESTAMP
        # The end of input moves the watermark to MAX_WATERMARK; this keeps how far event time got.
        self.last_watermark: int | None = None
        self.finishing = False
        self.finished = False
        self.records_in = 0
        self.batches_in = 0
        self.watch_fault_points = False  # the host arms them; unarmed, they cost nothing
        self._rows: list[tuple[Any, int | None]] | None = None
        self._row_origins: list[Any] | None = None
        self._row_pos = 0
        self._suspension: Suspension | None = None
        #: Why the default action waits now (None: it runs, or is about to).
        self.suspended: Suspended | None = None
        head = chain.head
        self._arrow_head = head if isinstance(head, TakesArrowBatches) else None
        self._merging_head = head if isinstance(head, MergesPartials) else None

    @property
    def takes_arrow_batches(self) -> bool:
        return self._arrow_head is not None

    @property
    def rows_pending(self) -> int:
        """Records of a batch taken from a channel and not yet fed to the chain."""
        return 0 if self._rows is None else len(self._rows) - self._row_pos

    # ------------------------------------------------------------ default action

    def default_action(self, controller: DefaultActionController) -> None:
        chain = self.chain
        if self.channels.barriers:
            aligned = self.channels.take_aligned_barrier()
            if aligned is not None:
                self.host.snapshot(*aligned)
                return
        output_full, blocked = self.host.output_is_full(), chain.is_blocked()
        if output_full or blocked:
            if self.watch_fault_points and blocked:
                self.host.fault_point("queue_full")
            # Woken when the output drains or the operator has room; a full output is the cause
            # where both hold (the operator cannot emit, so its queue fills).
            self._suspend(controller, _BACKPRESSURE if output_full else _ASYNC_QUEUE_FULL)
            return
        if self._rows is not None:
            self._feed_rows()
            return
        if self.finishing:
            if not self.finished and chain.advance_end_of_input():
                self.finished = True
                self.host.finished(controller)
            else:
                self._suspend(controller, _FINISHING)  # woken when the last requests complete
            return
        polled = self.channels.poll()
        if polled is None:
            # Woken by the next item; a channel whose barrier came first holds back its items.
            self._suspend(controller, _BARRIER_ALIGNMENT if self.channels.barriers else _NO_INPUT)
            return
        self.process_item(*polled)

    def wake(self) -> None:
        """Input, room or progress arrived: run the default action again."""
        if self._suspension is not None:
            suspension, self._suspension = self._suspension, None
            self.suspended = None
            suspension.resume()

    def _suspend(self, controller: DefaultActionController, why: Suspended) -> None:
        self._suspension = controller.suspend_default_action()
        self.suspended = why

    def _feed_rows(self) -> None:
        rows, pos, origins = self._rows, self._row_pos, self._row_origins
        assert rows is not None
        process, blocked = self.chain.head.process_element, self.chain.blocked_check()  # bound once
        end = min(len(rows), pos + self.rows_per_round)
        while pos < end:
            value, ts = rows[pos]
            process(Record(value, ts, None if origins is None else origins[pos]))
            pos += 1
            if blocked():
                break
        self.records_in += pos - self._row_pos
        self._row_pos = pos
        if pos >= len(rows):
            self._rows = None

    # -------------------------------------------------------------------- items

    def process_item(self, channel: int, item: ChannelItem) -> None:
        """Handle one item of ``channel`` (a barrier only through ``default_action``)."""
        match item:
            case Records(batch=batch):
                self.batches_in += 1
                whole = None if self._arrow_head is None else self.host.whole_batch(batch)
                if whole is not None:
                    self.records_in += batch.num_rows
                    self._arrow_head.process_timestamped_batch(*whole)  # type: ignore[union-attr]
                    return
                self._rows, self._row_origins = self.host.rows_of(batch)
                self._row_pos = 0
                if not self._rows:
                    self._rows = None
            case PartialAggregates(table=table, rows=rows):
                if self._merging_head is None:
                    raise TypeError(f"partial aggregates reached {type(self.chain.head).__name__}, which merges none")
                self.batches_in += 1
                self.records_in += self._merging_head.process_partials(table, rows)
            case Watermark(timestamp_ms=timestamp_ms):
                self._forward(self.valve.input_watermark(channel, timestamp_ms))
            case WatermarkStatus(idle=idle):
                self._forward(self.valve.input_watermark_status(channel, idle))
            case EndOfInput():
                self.end_channel(channel)
            case _:
                raise ValueError(f"unknown channel item {item!r} on channel {channel}")

    def end_channel(self, channel: int) -> None:
        """Channel ``channel`` ended; when every channel has, event time and the input end."""
        if channel in self.ended:
            return
        self.ended.add(channel)
        self._forward(self.valve.input_ended(channel))
        if len(self.ended) == self.channels.num_channels:
            if self.current_watermark < MAX_WATERMARK and (
                    self.valve.has_event_time or self.current_watermark > MIN_TIMESTAMP):
                # A bounded input ends event time, whatever its splits said: every window fires.
                # Also where the minimum never moved: an input that ended without a watermark
                # held the others' back until its end.
                self._forward([Watermark(MAX_WATERMARK)])
            self.finishing = True
            self.chain.end_input()

    def _forward(self, elements: list[StreamElement]) -> None:
        # What the valve lets through: the minimum watermark over the live, active inputs.
        for element in elements:
            if isinstance(element, Watermark):
                self.current_watermark = element.timestamp_ms
                if MIN_TIMESTAMP < element.timestamp_ms < MAX_WATERMARK:
                    self.last_watermark = element.timestamp_ms
                if self.watch_fault_points:
                    before = self.host.emitted()
                    self.chain.process_watermark(element)
                    if self.host.emitted() > before:
                        self.host.fault_point("window_fire")
                else:
                    self.chain.process_watermark(element)
            elif isinstance(element, WatermarkStatus):
                self.chain.process_watermark_status(element)

    # ----------------------------------------------------------------- snapshot

    def snapshot_state(self) -> dict[str, Any]:
        """The task's part of a checkpoint, plain data (``operators.state``, the instance's); the
        chain's and the in-flight input are the host's."""
        pos = self._row_pos
        return {
            "rows": [] if self._rows is None else self._rows[pos:],
            "row_origins": None if self._rows is None or self._row_origins is None else self._row_origins[pos:],
            "valve": self.valve.snapshot_state(),
            "ended": sorted(self.ended),
            "watermark": self.current_watermark,
            "records_in": self.records_in,
            "finishing": self.finishing,
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take back the task's part of a checkpoint: of format 3, or of 1 and 2, whose valve is
        the ``StatusWatermarkValve`` itself."""
        valve = state["valve"]
        if isinstance(valve, StatusWatermarkValve):
            self.valve = valve
        else:
            self.valve.restore_state(valve)
        self.ended = set(state["ended"])
        self.current_watermark = wm = state["watermark"]
        self.last_watermark = wm if MIN_TIMESTAMP < wm < MAX_WATERMARK else None
        self.records_in = state["records_in"]
        self.finishing = state["finishing"]
        if state["rows"]:
            self._rows, self._row_pos, self._row_origins = list(state["rows"]), 0, state["row_origins"]

