"""``OperatorHarness``: drive an operator (or a chain) by hand, deterministically.

The harness is the host an operator would have in a Ray actor, minus Ray: a mailbox whose
default action feeds queued input to the operator, a manual clock for processing time, and
a private asyncio loop for ``async def`` functions. The test's thread is the mailbox thread.

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
from collections import defaultdict, deque
from typing import Any, Sequence

from .clock import ManualClock
from .coroutine_runner import AsyncioCoroutineRunner
from .elements import Record, StreamElement, Watermark, WatermarkStatus
from .errors import ActorflowError, ConfigurationError, MailboxClosedError
from .mailbox_processor import DefaultActionController, MailboxProcessor, Suspension
from .operator import OperatorChain, OperatorContext, StreamOperator
from .timers import ManualProcessingTimeService

__all__ = ["AsyncioCoroutineRunner", "OperatorHarness"]

_END_OF_INPUT = object()


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


class OperatorHarness:
    """Feeds elements, moves processing time, snapshots and restores, and records the output.

    With ``auto_run=True`` (the default) every call runs mails until the operator is idle; with
    ``auto_run=False`` the test steps with ``step()`` / ``run_until_idle()`` itself.
    ``request_key_prefix`` (``<job>/<operator>``, say) starts the idempotency keys of async
    requests; without it they start with the operator's ``name``.
    """

    def __init__(
        self,
        operator: StreamOperator | Sequence[StreamOperator],
        *,
        start_ms: int = 0,
        name: str = "test/operator[0/1]",
        auto_run: bool = True,
        request_key_prefix: str | None = None,
    ) -> None:
        operators = [operator] if isinstance(operator, StreamOperator) else list(operator)
        self.chain = OperatorChain(operators)
        self.clock = ManualClock(start_ms)
        self.processor = MailboxProcessor(self._default_action)
        self.executor = self.processor.executor(0)
        self.processing_time = ManualProcessingTimeService(self.clock, self.executor)
        self.loop = asyncio.new_event_loop()
        self._out = _CollectingOutput()
        self._input: deque[Any] = deque()
        self._suspension: Suspension | None = None
        self._opened = False
        self._restore_state: Any = None
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
                request_key_prefix=(
                    request_key_prefix if request_key_prefix is None or len(operators) == 1 else f"{request_key_prefix}#{i}"
                ),
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

    def output_values(self) -> list[Any]:
        return [e.value for e in self._out.elements if isinstance(e, Record)]

    def output_records(self) -> list[Record]:
        return [e for e in self._out.elements if isinstance(e, Record)]

    def clear_output(self) -> None:
        self._out.elements.clear()
        self._out.side.clear()

    # -------------------------------------------------------------------- input

    def open(self) -> None:
        if self.loop.is_closed():  # close() closes it, whatever else failed
            raise MailboxClosedError("this harness is closed: feed, run and snapshot a new one")
        if not self._opened:
            self._opened = True
            self.chain.initialize_state(self._restore_state)
            self.chain.open()
            self._maybe_run()

    def process_element(
        self, value: Any, timestamp_ms: int | None = None, *, origin: tuple[Any, ...] | None = None
    ) -> None:
        self._offer(Record(value, timestamp_ms, origin))

    def process_watermark(self, timestamp_ms: int) -> None:
        self._offer(Watermark(timestamp_ms))

    def process_watermark_status(self, idle: bool) -> None:
        self._offer(WatermarkStatus(idle))

    def end_input(self) -> None:
        self._offer(_END_OF_INPUT)

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
        return len(self._input)

    @property
    def is_finished(self) -> bool:
        return self.chain.is_finished

    # ---------------------------------------------------------- snapshot/restore

    def snapshot(self) -> bytes:
        """The chain's state, pickled: a snapshot must survive leaving the process.

        It may be taken while the chain is blocked (its queue full, an element waiting for
        room inside the operator). Input still queued in the harness is not part of it: like
        records behind a checkpoint barrier, it comes after the snapshot, so a test that
        restores feeds it again (``pending_input`` says how much there is).
        """
        self.open()
        return pickle.dumps(self.chain.snapshot_state())

    def restore(self, snapshot: bytes) -> None:
        """Start from ``snapshot``; call before the first element."""
        if self._opened:
            raise ConfigurationError("restore() must come before the harness is opened (before any element)")
        self._restore_state = pickle.loads(snapshot)

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

    def _offer(self, element: Any) -> None:
        self.open()
        self._input.append(element)
        self._resume()
        self._maybe_run()

    def _maybe_run(self) -> None:
        if self.auto_run:
            self.run_until_idle()

    def _resume(self) -> None:
        if self._suspension is not None:
            suspension, self._suspension = self._suspension, None
            suspension.resume()

    def _on_progress(self) -> None:
        self.chain.advance_end_of_input()
        self._resume()

    def _default_action(self, controller: DefaultActionController) -> None:
        if not self._input or self.chain.is_blocked():
            # Nothing to feed, or the operator has no room: wait for input or progress.
            self._suspension = controller.suspend_default_action()
            return
        element = self._input.popleft()
        if isinstance(element, Record):
            self.chain.process_element(element)
        elif isinstance(element, Watermark):
            self.chain.process_watermark(element)
        elif isinstance(element, WatermarkStatus):
            self.chain.process_watermark_status(element)
        elif element is _END_OF_INPUT:
            self.chain.end_input()

    def _pump_loop(self) -> bool:
        """Let the private event loop run its ready callbacks; True if mails appeared."""
        for _ in range(8):
            self.loop.run_until_complete(asyncio.sleep(0))
            if self.processor.mailbox.has_mail():
                return True
        return False
