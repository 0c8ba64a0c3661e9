"""An operator instance's figures: what ``stats()`` returns, the metrics export publishes and the
job's progress reads, and the clock of the time its output could not leave.

Read and written on the actor's event-loop thread only, as every caller of the actor runs there.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from actorflow.operators.async_batch_operator import AsyncBatchWaitOperator
from actorflow.operators.async_wait_operator import AsyncWaitOperator
from actorflow.operators.clock import Clock
from actorflow.operators.elements import MAX_WATERMARK, MIN_TIMESTAMP
from actorflow.operators.operator import OperatorChain
from actorflow.operators.stream_task import StreamTask, Suspended

__all__ = ["InstanceFigures", "LATE_FIGURES", "async_operators"]

#: The waits a dashboard shows, each as a gauge of 0 or 1 (no input, the usual state, is left out).
SUSPENSIONS = (Suspended.BACKPRESSURE, Suspended.ASYNC_QUEUE_FULL, Suspended.BARRIER_ALIGNMENT, Suspended.FINISHING)

#: The late records of an instance's windows by reason (``operators.windows.LateReason``).
LATE_FIGURES = ("late_behind_watermark", "late_past_allowed_lateness", "late_window_closed")


def async_operators(chain: OperatorChain) -> list[AsyncWaitOperator | AsyncBatchWaitOperator]:
    return [op for op in chain.operators if isinstance(op, (AsyncWaitOperator, AsyncBatchWaitOperator))]


class InstanceFigures:
    """The figures of one instance; ``started`` once its chain is open and its output made."""

    def __init__(self, name: str, restarts: int, chain: OperatorChain, task: StreamTask, gate: Any, clock: Clock) -> None:
        self.name, self.restarts = name, restarts
        self._chain, self._task, self._gate, self._clock = chain, task, gate, clock
        self._processor: Any = None
        self._outbox: Any = None
        self._output: Any = None
        self._reader: Any = None  # the source split it reads itself, if it does
        self._backpressured_ms = 0  # time the output could not leave (the outbox was full)
        self._backpressured_since: int | None = None
        self._cpu_at_start: tuple[float, float] | None = None  # (event-loop thread, process) CPU seconds

    def started(self, processor: Any, outbox: Any, output: Any, reader: Any = None) -> None:
        """The chain is open: its operators' metrics and queues exist from here. ``reader``: the
        ``BlockReader`` of the source split the instance reads itself, if it does."""
        self._processor, self._outbox, self._output, self._reader = processor, outbox, output, reader
        self._cpu_at_start = (time.thread_time(), time.process_time())

    def output_full(self) -> None:
        """Downstream takes no more: backpressure from now, until ``output_has_room``."""
        if self._backpressured_since is None:
            self._backpressured_since = self._clock.now_ms()

    def output_may_have_room(self) -> None:
        if self._backpressured_since is not None and not self._outbox.is_full():
            self._backpressured_ms += self._clock.now_ms() - self._backpressured_since
            self._backpressured_since = None

    def record_progress(self) -> dict[str, Any]:
        """Records with an outcome (taken in and emitted, filtered or dead-lettered), requests in
        flight, and how long the oldest of them has been waiting (ms, or None)."""
        if self._processor is None:  # not started yet
            return {"done": 0, "in_flight": 0, "oldest_ms": None}
        pending = in_flight = 0
        oldest: int | None = None
        for op in async_operators(self._chain):
            pending += op.records_pending
            in_flight += op.requests_in_flight
            started = op.oldest_request_started_ms()
            if started is not None and (oldest is None or started < oldest):
                oldest = started
        return {
            "done": self._task.records_in - pending,
            "in_flight": in_flight,
            "oldest_ms": None if oldest is None else self._clock.now_ms() - oldest,
        }

    def figures(self) -> dict[str, Any]:
        started = self._processor is not None
        in_flight = queue_depth = 0
        totals = {"records_out": self._output.records_out if started else 0,
                  "retries": 0, "timeouts": 0, "dead_letters": 0, "failures": 0,
                  "late_records_dropped": 0, **dict.fromkeys(LATE_FIGURES, 0)}
        services: dict[str, dict[str, float]] = {}
        for async_op in async_operators(self._chain) if started else ():  # queues come with open
            queue_depth += len(async_op.queue)
            in_flight += sum(1 for e in async_op.queue if not e.done)
            if async_op.gate is not None:
                services[async_op.gate.name] = async_op.gate.metrics.figures()
        for service in services.values():  # an instance's services, summed for the exporter
            for k, v in service.items():
                totals[k] = totals.get(k, 0) + v
        for op in self._chain.operators if started else ():
            for k, v in dataclasses.asdict(op.metrics).items():
                if k in totals and k != "records_out":
                    totals[k] += v
        task = self._task
        wm = task.current_watermark
        now = self._clock.now_ms()
        mailbox = self._processor.mailbox if started else None
        oldest_ms = mailbox.oldest_mail_age_ms() if mailbox is not None else None
        suspended = task.suspended
        backpressured = self._backpressured_ms + (
            0 if self._backpressured_since is None else now - self._backpressured_since)
        return {
            "name": self.name,
            "records_in": task.records_in,
            "batches_in": task.batches_in,
            "in_flight_requests": in_flight,
            "async_queue_depth": queue_depth,
            "input_queue_depth": len(self._gate),
            "mailbox_depth": mailbox.size() if mailbox is not None else 0,
            # By the priority the mailbox takes them in (an operator's mails carry its position).
            "mailbox_depth_by_priority": mailbox.depth_by_priority() if mailbox is not None else {},
            "oldest_mail_age_ms": oldest_ms,
            # Why the input waits, if it does (operators.stream_task.Suspended), and as 0/1 gauges.
            "suspended": None if suspended is None else suspended.value,
            **{f"suspended_{why.value}": int(suspended is why) for why in SUSPENSIONS},
            "outbox_depth": self._outbox.pending if started else 0,
            "watermark_ms": None if wm in (MIN_TIMESTAMP, MAX_WATERMARK) else wm,
            # How far event time trails the wall clock (Flink's currentInputWatermark lag).
            "watermark_lag_ms": None if wm in (MIN_TIMESTAMP, MAX_WATERMARK) else now - wm,
            "backpressured_ms": backpressured,
            "last_watermark_ms": task.last_watermark,
            "restarts": self.restarts,
            **self._cpu_figures(),
            **totals,
            **({"services": services} if services else {}),
            # The row that brought the largest event time of the split it reads: what moved the
            # watermark, and what the late accounting names (``BlockReader.max_timestamp_record``).
            **({"max_timestamp_record": self._reader.max_timestamp_record()} if self._reader is not None else {}),
        }

    def _cpu_figures(self) -> dict[str, float | None]:
        """CPU time since start, in ms: the event loop's thread (the mailbox, the reader, ``async
        def`` user code) and the whole process (also Ray's own threads: calls in and out, the
        object store). Against the job's wall time they say whether an instance was busy, waited,
        or paid for Ray. Only right on the loop's thread, where every caller runs."""
        if self._cpu_at_start is None:
            return {"event_loop_cpu_ms": None, "process_cpu_ms": None}
        loop_s, process_s = self._cpu_at_start
        return {"event_loop_cpu_ms": round((time.thread_time() - loop_s) * 1000, 1),
                "process_cpu_ms": round((time.process_time() - process_s) * 1000, 1)}
