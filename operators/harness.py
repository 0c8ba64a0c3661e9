"""``OperatorHarness``: drive an operator (or a chain) by hand, deterministically.

The harness is the host an operator would have in a Ray actor, minus Ray: the same stream task
(``operators.stream_task``) over ``num_inputs`` input channels, whose default action feeds queued
input to the operator through the watermark valve and barrier alignment, a manual clock for
processing time, and a private asyncio loop for ``async def`` functions. The test's thread is the
mailbox thread.

The end of every input ends event time as the runtime does: a ``Watermark(MAX_WATERMARK)`` goes
to the chain first if event time had begun (some watermark arrived), so every window fires.

>>> from actorflow.operators.operator import MapOperator
>>> with OperatorHarness(MapOperator(lambda v: v + 1)) as h:
...     h.process_element(1, timestamp_ms=10); h.process_watermark(10)
>>> h.output
[Record(value=2, timestamp_ms=10), Watermark(timestamp_ms=10)]

Leaving the ``with`` block closes the harness (``close()``): the operators close, the requests
still running are cancelled, and the event loop closes, however the block ended.
"""

from __future__ import annotations

import asyncio
import pickle
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from .clock import ManualClock
from .coroutine_runner import AsyncioCoroutineRunner
from .channel_items import END_OF_INPUT, ChannelItem, Records
from .elements import CheckpointBarrier, Record, StreamElement, Watermark, WatermarkStatus
from .errors import ActorflowError, ConfigurationError, MailboxClosedError
from .input_channels import InputChannels
from .mailbox_processor import DefaultActionController, MailboxProcessor
from .operator import OperatorChain, OperatorContext, StreamOperator, no_fault_point
from .service_quota import ServiceQuotas
from .stream_task import Rows, StreamTask
from .timers import ManualProcessingTimeService

__all__ = ["AsyncioCoroutineRunner", "HarnessCheckpoint", "OperatorHarness"]


@dataclass(frozen=True)
class HarnessCheckpoint:
    """A checkpoint taken at aligned barriers: the chain's state, the task's (valve, channels
    ended, records of a batch not yet fed), and each channel's input in front of its barrier."""

    checkpoint_id: int | None  # None: taken by ``snapshot()``
    chain: Any
    task: dict[str, Any]
    input: list[list[ChannelItem]]


class _CollectingOutput:
    def __init__(self) -> None:
        self.elements: list[StreamElement] = []
        self.side: dict[str, list[Any]] = defaultdict(list)

    def collect(self, record: Record) -> None:
        self.elements.append(record)

    def collect_value(self, value: Any, timestamp_ms: int | None, origin: tuple[Any, ...] | None) -> None:
        self.elements.append(Record(value, timestamp_ms, origin))

    def collect_table(self, table: Any, timestamps: Any) -> None:
        # As an actor's output takes a window operator's fired windows: one table.
        for value, ts in zip(table.to_pylist(), timestamps.to_pylist()):
            self.elements.append(Record(value, ts))

    def emit_watermark(self, watermark: Watermark) -> None:
        self.elements.append(watermark)

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self.elements.append(status)

    def collect_side(self, tag: str, value: Any) -> None:
        self.side[tag].append(value)


class _HarnessHost:
    """The harness's side of the stream task (``TaskHost``)."""

    def __init__(self, harness: "OperatorHarness") -> None:
        self._harness = harness

    def output_is_full(self) -> bool:
        return False

    def rows_of(self, batch: list[Record]) -> Rows:
        origins = [r.origin for r in batch]
        return [(r.value, r.timestamp_ms) for r in batch], None if all(o is None for o in origins) else origins

    def whole_batch(self, batch: Any) -> None:
        return None  # the harness feeds records; a test of whole batches calls the operator

    def snapshot(self, checkpoint_id: int, in_front: list[list[ChannelItem]]) -> None:
        h = self._harness
        checkpoint = HarnessCheckpoint(checkpoint_id, h.chain.snapshot_state(), h.task.snapshot_state(), in_front)
        h.checkpoints[checkpoint_id] = pickle.dumps(checkpoint)

    def finished(self, controller: DefaultActionController) -> None:
        self._harness.task.wake()  # nothing more comes: the next default action suspends

    def fault_point(self, moment: str) -> None:
        self._harness.fault_points.append(moment)

    def emitted(self) -> int:
        return len(self._harness.output_records())


class OperatorHarness:
    """Feeds elements, moves processing time, snapshots and restores, and records the output.

    With ``auto_run=True`` (the default) every call runs mails until the operator is idle; with
    ``auto_run=False`` the test steps with ``step()`` / ``run_until_idle()`` itself.
    ``request_key_prefix`` (``<job>/<operator>``, say) starts the idempotency keys of async
    requests; without it they start with the operator's ``name``.

    With ``num_inputs`` > 1, input methods take a ``channel``: watermarks are combined by the
    valve, a barrier holds its channel until every live channel delivered it, and the input
    ends when every channel has ended. ``checkpoints`` holds the checkpoint taken at each
    aligned barrier (for ``restore``); ``fault_points`` lists the chaos moments reached, with
    ``watch_fault_points=True``. Harnesses given the same ``service_quotas`` share the rate
    quotas and pauses of their services, as a job's instances do.
    """

    def __init__(
        self,
        operator: StreamOperator | Sequence[StreamOperator],
        *,
        start_ms: int = 0,
        name: str = "test/operator[0/1]",
        auto_run: bool = True,
        request_key_prefix: str | None = None,
        num_inputs: int = 1,
        watch_fault_points: bool = False,
        service_quotas: ServiceQuotas | None = None,
    ) -> None:
        operators = [operator] if isinstance(operator, StreamOperator) else list(operator)
        self.chain = OperatorChain(operators)
        self.clock = ManualClock(start_ms)
        self.channels = InputChannels(num_inputs)
        self.task = StreamTask(self.chain, self.channels, _HarnessHost(self))
        self.task.watch_fault_points = watch_fault_points
        self.processor = MailboxProcessor(self.task.default_action)
        self.executor = self.processor.executor(0)
        self.processing_time = ManualProcessingTimeService(self.clock, self.executor)
        self.loop = asyncio.new_event_loop()
        self._out = _CollectingOutput()
        self._opened = False
        self._restore_state: Any = None
        self._restore_checkpoint: HarnessCheckpoint | None = None
        self.checkpoints: dict[int, bytes] = {}
        self.fault_points: list[str] = []
        self.auto_run = auto_run
        self.name = name

        def context_for(i: int, op: StreamOperator) -> OperatorContext:
            # Each operator's mails (and timers) carry its position in the chain.
            executor = self.processor.executor(i)
            return OperatorContext(
                name=name if len(operators) == 1 else f"{name}#{i}",
                mailbox_executor=executor,
                processing_time=self.processing_time.with_executor(executor),
                clock=self.clock,
                coroutine_runner=AsyncioCoroutineRunner(self.loop),
                signal_progress=self._on_progress,
                # The operators' own moments ("retry_wait", "completion") go in the same list.
                fault_point=self.fault_points.append if watch_fault_points else no_fault_point,
                request_key_prefix=(
                    request_key_prefix if request_key_prefix is None or len(operators) == 1 else f"{request_key_prefix}#{i}"
                ),
                service_quota=None if service_quotas is None else (
                    lambda service, per_second: service_quotas.quota(
                        service or f"{request_key_prefix or 'operator'}#{i}", per_second, self.clock.now_ms())),
            )

        self.chain.setup(context_for, self._out)

    # ------------------------------------------------------------------- output

    @property
    def output(self) -> list[StreamElement]:
        """Everything emitted on the main output, in order."""
        return self._out.elements

    @property
    def side_outputs(self) -> dict[str, list[Any]]:
        return self._out.side

    def side_output(self, tag: str) -> list[Any]:
        """What went to side output ``tag`` so far (empty if nothing did; the tag is not created)."""
        return list(self._out.side.get(tag, ()))

    def output_values(self) -> list[Any]:
        return [e.value for e in self._out.elements if isinstance(e, Record)]

    def output_records(self) -> list[Record]:
        return [e for e in self._out.elements if isinstance(e, Record)]

    def clear_output(self) -> None:
        self._out.elements.clear()
        self._out.side.clear()

    # ------------------------------------------------------------- state views

    def window_state(self, operator: int | None = None) -> dict[Any, dict[Any, Any]]:
        """Read-only: what the window operator's windows hold, ``{key: {window: contents}}``
        (``WindowOperator.window_state``), instead of unpickling a snapshot.

        ``operator`` is the operator's position in the chain; it may be left out when the chain
        holds one window operator.

        >>> from actorflow.operators.windows import Count, TumblingEventTimeWindows, WindowOperator
        >>> h = OperatorHarness(WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count()))
        >>> h.process_element({"k": "a"}, 3); h.window_state()
        {'a': {TimeWindow(start_ms=0, end_ms=10): 1}}
        >>> h.timers()
        {'event': [(9, 'a', TimeWindow(start_ms=0, end_ms=10))], 'processing': []}
        """
        view: dict[Any, dict[Any, Any]] = self._viewed(operator, "window_state").window_state()
        return view

    def timers(self, operator: int | None = None) -> dict[str, list[tuple[int, Any, Any]]]:
        """Read-only: the window operator's pending timers, ``{"event": [(timestamp_ms, key, window),
        ...], "processing": [...]}`` in firing order (``WindowOperator.timers``)."""
        pending: dict[str, list[tuple[int, Any, Any]]] = self._viewed(operator, "timers").timers()
        return pending

    def _viewed(self, index: int | None, method: str) -> Any:
        operators = self.chain.operators
        if index is not None:
            op = operators[index]
            if not hasattr(op, method):
                raise ConfigurationError(f"operator {index} of the chain ({op!r}) has no {method}(); a window operator has")
            return op
        found = [op for op in operators if hasattr(op, method)]
        if len(found) != 1:
            raise ConfigurationError(
                f"{method}() needs operator= when the chain does not hold exactly one window operator; it holds {len(found)}"
            )
        return found[0]

    # -------------------------------------------------------------------- input

    def open(self) -> None:
        if self.loop.is_closed():  # close() closes it, whatever else failed
            raise MailboxClosedError("this harness is closed: feed, run and snapshot a new one")
        if not self._opened:
            self._opened = True
            self.chain.initialize_state(self._restore_state)
            checkpoint = self._restore_checkpoint
            if checkpoint is not None:
                self.task.restore_state(checkpoint.task)
                for channel, items in enumerate(checkpoint.input):
                    for item in items:
                        self.channels.file(channel, item)
            self.chain.open()
            self._maybe_run()

    def process_element(
        self, value: Any, timestamp_ms: int | None = None, *, origin: tuple[Any, ...] | None = None, channel: int = 0,
    ) -> None:
        self._offer(channel, Records([Record(value, timestamp_ms, origin)]))

    def process_watermark(self, timestamp_ms: int, *, channel: int = 0) -> None:
        self._offer(channel, Watermark(timestamp_ms))

    def process_watermark_status(self, idle: bool, *, channel: int = 0) -> None:
        self._offer(channel, WatermarkStatus(idle))

    def process_barrier(self, checkpoint_id: int, *, channel: int = 0) -> None:
        """Checkpoint ``checkpoint_id``'s barrier on ``channel``; once every live channel has
        delivered it, the checkpoint is taken (``checkpoints[checkpoint_id]``)."""
        self._offer(channel, CheckpointBarrier(checkpoint_id))

    def end_input(self, channel: int | None = None) -> None:
        """End ``channel``, or every channel (None)."""
        for c in range(self.channels.num_channels) if channel is None else (channel,):
            self._offer(c, END_OF_INPUT)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Tell the chain that checkpoint ``checkpoint_id`` completed, as a mail (as the runtime does)."""
        self.open()
        self.executor.execute(self.chain.notify_checkpoint_complete, "checkpoint complete", checkpoint_id)
        self._maybe_run()

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.open()
        self.channels.drop_barriers(checkpoint_id)
        self.task.wake()  # a channel the barrier held may have input
        self.executor.execute(self.chain.notify_checkpoint_aborted, "checkpoint aborted", checkpoint_id)
        self._maybe_run()

    def set_processing_time(self, timestamp_ms: int) -> None:
        """Move processing time; timers that fall due run as mails."""
        self.open()
        # What was ready before time moved runs first, at the old time (a completion that the
        # test made before moving the clock is seen before the timers it races).
        self._maybe_run()
        self.processing_time.advance_to(timestamp_ms)
        self._maybe_run()

    # ------------------------------------------------------------------ running

    def step(self) -> bool:
        """Run one mail or one default action; False when idle."""
        self.open()
        if self.processor.step():
            return True
        return self._pump_loop()

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Run mails, input and coroutines until nothing can move without the test."""
        self.open()
        for _ in range(max_steps):
            self.processor.run_until_idle()
            if not self._pump_loop():
                return
        raise ActorflowError(f"the harness was not idle after {max_steps} rounds")

    @property
    def pending_input(self) -> int:
        """Items queued on the channels, and records of a batch not yet fed."""
        return len(self.channels) + self.task.rows_pending

    @property
    def is_finished(self) -> bool:
        return self.chain.is_finished

    # ---------------------------------------------------------- snapshot/restore

    def snapshot(self) -> bytes:
        """A ``HarnessCheckpoint``, pickled (a snapshot must survive leaving the process): the
        chain's state (``.chain``) and the task's (the valve, the inputs ended), with no input.

        It may be taken while the chain is blocked (its queue full, an element waiting for
        room inside the operator). Input not yet fed to the chain is not part of it: like
        records behind a checkpoint barrier, it comes after the snapshot, so a test that
        restores feeds it again (``pending_input`` says how much there is). A checkpoint at
        barriers (``process_barrier``) holds its in-flight input instead.
        """
        self.open()
        task = {**self.task.snapshot_state(), "rows": [], "row_origins": None}
        return pickle.dumps(HarnessCheckpoint(None, self.chain.snapshot_state(), task, []))

    def restore(self, snapshot: bytes) -> None:
        """Start from ``snapshot`` (of ``snapshot()`` or ``checkpoints``, or a chain's state,
        pickled); call before the first element."""
        if self._opened:
            raise ConfigurationError("restore() must come before the harness is opened (before any element)")
        state = pickle.loads(snapshot)
        if isinstance(state, HarnessCheckpoint):
            self._restore_checkpoint, state = state, state.chain
        self._restore_state = state

    def close(self) -> list[Any]:
        """Close the operators and the mailbox; returns the mails that never ran.

        The requests still running are cancelled and the event loop closes, even if an operator's
        ``close`` raises. Closing again does nothing.
        """
        if self.loop.is_closed():
            return []
        try:
            self.chain.close()
            return self.processor.close()
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))  # each cancelled coroutine runs its cleanup
            self.loop.close()

    def __enter__(self) -> OperatorHarness:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _offer(self, channel: int, item: ChannelItem) -> None:
        self.open()
        self.channels.file(channel, item)
        self.task.wake()
        self._maybe_run()

    def _maybe_run(self) -> None:
        if self.auto_run:
            self.run_until_idle()

    def _on_progress(self) -> None:
        self.chain.advance_end_of_input()
        self.task.wake()

    def _pump_loop(self) -> bool:
        """Let the private event loop run its ready callbacks; True if mails appeared."""
        for _ in range(8):
            if not self._loop_has_work():
                return False
            self.loop.run_until_complete(asyncio.sleep(0))
            if self.processor.mailbox.has_mail():
                return True
        return False

    def _loop_has_work(self) -> bool:
        """Whether a turn of the private loop would run anything: a ready callback (a task that can
        go on, a finished future's callback) or a timer that is due. A turn costs tens of µs, and
        most calls of a test have none: skipping them keeps a harness call at a few µs. A loop
        without asyncio's usual ``_ready``/``_scheduled`` is always turned."""
        ready, scheduled = getattr(self.loop, "_ready", None), getattr(self.loop, "_scheduled", None)
        if ready is None or scheduled is None:
            return True
        return bool(ready) or (bool(scheduled) and scheduled[0].when() <= self.loop.time())
