"""What an operator instance wires up from its spec when it starts: where its output goes, and
each operator's context; and the background tasks it runs beside the mailbox.

Everything here runs on the actor's event loop, which is the mailbox thread.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from actorflow.operators.channel_items import Partitioning
from actorflow.operators.clock import Clock
from actorflow.operators.coroutine_runner import AsyncioCoroutineRunner
from actorflow.operators.errors import ActorflowError
from actorflow.operators.mailbox_processor import MailboxExecutor, MailboxProcessor
from actorflow.operators.operator import OperatorChain, OperatorContext, StreamOperator

from .chain_spec import ChainSpec
from .channel import ChannelSender
from .instance_figures import async_operators
from .output import BatchingOutput, LocalSink, Outbox, Partitioner, pre_aggregator
from .processing_time import AsyncioProcessingTimeService
from .service_counters import open_counters
from .service_quota import RayServiceQuota

__all__ = ["BackgroundTasks", "chaos_moments", "context_factory", "instance_output", "tick"]


def instance_output(
    spec: ChainSpec, downstream: list[Any] | None, local_sink: LocalSink | None, *,
    on_room: Callable[[], None], on_error: Callable[[BaseException], None], on_side: Callable[[str, list[Any]], None],
) -> tuple[Outbox, BatchingOutput]:
    """The instance's outbox, to the next stage's actors (``downstream``) or to its own
    ``local_sink``, and the output that batches the chain's records into it."""
    senders: list[ChannelSender | LocalSink]
    if local_sink is not None:
        senders = [local_sink]
    else:
        channel_id = 0 if spec.partitioning is Partitioning.FORWARD else spec.index
        senders = [ChannelSender(h, channel_id, credits=spec.credits) for h in downstream or []]
    outbox = Outbox(senders, max_pending=spec.outbox_capacity, on_room=on_room, on_error=on_error)
    output = BatchingOutput(
        outbox, Partitioner(spec.partitioning, len(senders), spec.key), batch_size=spec.batch_size,
        schema=spec.output_schema, side=on_side, hint=spec.input_schema,
        pre_aggregate=pre_aggregator(spec.downstream_head) if spec.partitioning is Partitioning.HASH else None,
    )
    return outbox, output


def context_factory(
    spec: ChainSpec, name: str, processor: MailboxProcessor, clock: Clock, n_operators: int, *,
    signal_progress: Callable[[], None], fault_point: Callable[[str], None],
) -> Callable[[int, StreamOperator], OperatorContext]:
    """What gives the chain's ``i``-th operator its context, on the running loop."""
    loop = asyncio.get_running_loop()
    processing_time = AsyncioProcessingTimeService(loop, processor.executor(0), clock)
    runner = AsyncioCoroutineRunner(loop)

    def context_for(i: int, op: StreamOperator) -> OperatorContext:
        # Each operator's mails (results, timers) carry its position in the chain: a downstream
        # operator that yields never runs an upstream operator's mail.
        executor = processor.executor(i)
        return OperatorContext(
            name=name if n_operators == 1 else f"{name}#{op.name}",
            mailbox_executor=executor,
            processing_time=processing_time.with_executor(executor),
            clock=clock,
            coroutine_runner=runner,
            subtask_index=spec.index,
            parallelism=spec.parallelism,
            signal_progress=signal_progress,
            # The operators' own moments ("retry_wait", "completion"); unarmed, none is called.
            fault_point=fault_point,
            # Without the subtask: after a restore, a record may go to another instance.
            request_key_prefix=f"{spec.job}/{op.name}",
            service_quota=_quota_of(spec, i),
            # The counts of a killed instance still count (service_counters).
            service_counters=lambda service: open_counters(spec.job, spec.instance_name, service),
        )

    return context_for


def _quota_of(spec: ChainSpec, i: int) -> Callable[[str | None, float | None], RayServiceQuota | None] | None:
    """The context's ``service_quota`` for the chain's ``i``-th operator: the job's quota actor
    of its service (checked against its rate when the job started), if the job keeps one."""
    handle = spec.service_quotas[i] if spec.service_quotas else None
    if handle is None:
        return None
    return lambda name, per_second: RayServiceQuota(handle, name or spec.name)


async def tick(
    executor: MailboxExecutor, output: BatchingOutput, linger_ms: int, *, last_stage: bool, export: Callable[[], None],
) -> None:
    """The instance's ticker: the latency bound of a slow stream once per linger, and the live
    metrics (``export``) once a second.

    Rows for a downstream actor leave within a linger. The last stage's rows only move into its
    sink, where they wait for a block to fill anyway: while they keep coming they leave in whole
    batches, and on the tick only once they stop (a stalled or slow stream).
    """
    buffered_at_tick = 0

    def flush_lingering() -> None:
        nonlocal buffered_at_tick
        if not last_stage or output.buffered == buffered_at_tick:
            output.flush()
        buffered_at_tick = output.buffered

    beats = 0
    while True:
        await asyncio.sleep(linger_ms / 1000)
        executor.execute(flush_lingering, "flush output", deferrable=True)
        beats += 1
        if beats * linger_ms >= 1000:
            beats = 0
            export()


def chaos_moments(chain: OperatorChain, *, checkpointed: bool) -> set[str]:
    """The chaos moments (``cluster.chaos.MOMENTS``) an instance of ``chain`` can reach."""
    moments = {"snapshot"} if checkpointed else set()
    if async_operators(chain):
        moments |= {"queue_full", "retry_wait", "completion"}
    if any(op.fires_on_event_time for op in chain.operators):
        moments.add("window_fire")
    return moments


class BackgroundTasks:
    """Tasks an instance runs beside its mailbox (reading the source, the ticker, snapshot
    writes): a failure fails the job with its cause (``on_failure``) instead of dying unseen."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self._name = name
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.failed(what, t.exception())  # type: ignore[arg-type]

        task.add_done_callback(done)
        return task

    def failed(self, what: str, error: BaseException) -> None:
        failure = ActorflowError(f"{self._name}: {what} failed: {type(error).__name__}: {error}")
        failure.__cause__ = error
        self._on_failure(failure)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
