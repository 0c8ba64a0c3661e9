"""A job over an unbounded input: one deployment for the input's whole life, fed an epoch at a time.

The input arrives in *epochs*: a streaming query's micro-batch ``N`` is offered as epoch ``N``
(``offer``). Each epoch's rows go to the readers of the running job (``EpochReader``), and a
checkpoint follows them: its barrier enters behind the epoch's last row. Nothing drains between
epochs: window contents, timers, requests in flight and their retries, watermarks and idleness
carry over, and requests in flight at the barrier are saved in the checkpoint, not waited for.
Once that checkpoint is complete, the output it committed is *published* (``StreamSink``) and
only then does ``offer`` return, so that the caller (Spark's ``foreachBatch``) commits the
micro-batch after its output is out.

A checkpoint's metadata names the last epoch in it (``"epoch"``). A driver that starts again on
the same checkpoint directory resumes from the latest complete checkpoint: the epochs up to its
``"epoch"`` are in that state, and an epoch offered again (Spark re-runs a micro-batch it had not
committed) is recognised and skipped. Its output was published, or is now: publishing is
idempotent.

An actor that dies restarts the job from the latest complete checkpoint within the restart
budget, as a bounded job does (``cluster.job``); the epochs fed after that checkpoint are kept
here, by reference, until a checkpoint covers them, and are fed again. An operator that fails
fails the job: ``failure`` holds the error, and every later call raises it.

``stop()`` takes a final checkpoint and publishes its output, and the job ends there with its
state saved: a later run on the same directory resumes from it (Flink's stop-with-savepoint).
``stop(drain=True)`` ends the input instead: event time runs to its end, every window fires, and
the last output is published (Flink's ``--drain``); nothing is left to resume.

Side outputs (dead letters, late data) are streams too: each checkpoint stages the records that
came since the last one, beside the output it commits, and they leave the actors' state. A side
output with a sink of its own (``side_sinks``) is published with the output, epoch by epoch;
one without is kept in the checkpoint directory, on disk, until a drain hands it over
(``side_outputs``).

Threading model: ``offer``, ``checkpoint`` and ``stop`` run in the caller's thread (Spark's
``foreachBatch`` calls come one at a time); a watcher thread recovers from a failure that comes
between two calls. One lock serialises them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pyarrow as pa
import ray
from ray.exceptions import RayError

from actorflow.actors.naming import instance_name, validate_job_name
from actorflow.actors.service_counters import remove_counters
from actorflow.operators.async_wait_operator import DEAD_LETTER
from actorflow.operators.errors import ConfigurationError, JobFailedError, SchemaError

from actorflow.actors.instance_checkpoints import pack_side_records, unpack_side_records

from .checkpoints.coordinator import COORDINATOR, CheckpointConfig, CheckpointCoordinator, JobCheckpoints
from .checkpoints.sink import TwoPhaseOutput
from .checkpoints.storage import CheckpointStorage
from .job import (
    _Attempt, _AttemptFailed, _cause, _describe, _job_failure, _remote, _restore_point, check_resumable,
    checkpoint_metadata, default_checkpoint_directory, end_service_quotas, instance_placement, near_driver, on_each_machine,
    revive_service_quotas, start_service_quotas,
)
from .job_graph import JobGraph, SourceNode

__all__ = ["DRIVER_MOMENTS", "EpochFigures", "StreamSink", "StreamingJob"]


class StreamSink(Protocol):
    """Where a streaming job's committed output goes (``cluster.stream_sinks``)."""

    def publish(self, output: TwoPhaseOutput, instances: int, up_to: int,
                before_commit: Callable[[], None] = lambda: None) -> int:
        """Publish every committed epoch up to ``up_to`` that is not out yet, then free it from
        ``output``; returns the rows published. Repeating it publishes nothing twice.
        ``before_commit`` runs once the files are written, before they become visible."""
        ...


@dataclass
class EpochFigures:
    """One offered epoch: what ``last_progress`` says of it."""

    epoch: int
    checkpoint_id: int | None
    rows_in: int
    rows_out: int
    skipped: bool = False  # offered again after a restart, and already in the state restored
    between_epochs: bool = False  # a checkpoint while no epoch came (``checkpoint_interval_ms``)
    started_at_ms: int = 0
    feed_ms: float = 0.0
    checkpoint_ms: float = 0.0
    publish_ms: float = 0.0
    latency_ms: float = 0.0  # from the offer to its output published
    restarts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


#: The moments at which the chaos tool can end a streaming job's driver (``StreamingJob.fault_point``):
#: an epoch fed to the actors, not yet checkpointed; its checkpoint complete, its output not yet
#: published; its output files written, not yet in the sink's log; published, not yet returned
#: (so not yet committed by Spark); a restart's checkpoint chosen, its actors not yet deployed.
DRIVER_MOMENTS = ("fed", "checkpointed", "publishing", "published", "restoring")


def no_fault_point(moment: str, epoch: int | None) -> None:
    return None


class StreamingJob:
    """``graph`` (its source ``unbounded``) running until ``stop``; see the module's docstring.

    ``fault_point(moment, epoch)`` is called at each of ``DRIVER_MOMENTS``: the chaos tool sets
    it (on the class, before ``start``) to end the driver there, as a crash would.
    """

    fault_point: Callable[[str, int | None], None] = staticmethod(no_fault_point)

    def __init__(
        self, graph: JobGraph, sink: StreamSink, *, job_name: str | None = None, directory: str | None = None,
        filesystem: Any = None, output_schema: pa.Schema | None = None, max_restarts: int = 20,
        restart_window_s: float = 60.0, checkpoint_timeout_ms: int = 60_000, retain: int = 3,
        actor_resources: dict[str, float] | None = None, checkpoint_interval_ms: int | None = 1_000,
        side_sinks: dict[str, StreamSink] | None = None,
    ) -> None:
        if not graph.source.unbounded:
            raise ConfigurationError("a streaming job needs an unbounded source (from_spark of a streaming DataFrame)")
        self.graph, self.sink = graph, sink
        self.side_tags = (DEAD_LETTER, *graph.side_tags)
        self.side_sinks = dict(side_sinks or {})
        unknown = sorted(set(self.side_sinks) - set(self.side_tags))
        if unknown:
            raise ConfigurationError(f"side outputs {unknown} have sinks, and the pipeline writes only {list(self.side_tags)}")
        self.job = validate_job_name(job_name or f"stream-{uuid.uuid4().hex[:8]}")
        self.directory = directory or default_checkpoint_directory()
        self.config = CheckpointConfig(None, self.directory, filesystem,
                                       timeout_ms=checkpoint_timeout_ms, retain=retain, max_restarts=max_restarts,
                                       restart_window_s=restart_window_s)
        self.output_schema = output_schema
        self.placement: dict[str, Any] = instance_placement(0.0, actor_resources)
        self.epoch: int | None = None  # the last epoch in a complete checkpoint
        self.failure: BaseException | None = None
        self.restarts = 0
        self.failures: list[str] = []
        self.resumed_from: int | None = None  # the checkpoint a start resumed from
        self.figures: deque[EpochFigures] = deque(maxlen=100)
        #: After ``stop(drain=True)``: each side output's records (dead letters, late data), by tag.
        self.side_outputs: dict[str, list[Any]] = {}
        self._lock = threading.RLock()
        self._pending: dict[int, list[list[Any]]] = {}  # epochs fed since the last checkpoint: pieces per split
        self._restart_times: deque[float] = deque()
        self._attempt: Any = None
        self._number = 0
        self._coordinator: Any = None
        self._quotas: dict[str, Any] = {}  # node name -> its service's quota actor (job.start_service_quotas)
        self._checkpoints: JobCheckpoints | None = None
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self._last_commit = time.monotonic()
        #: Called, in a thread of its own, once when ``actorflow stop`` asks for the job to stop.
        self.on_stop_request: Callable[[], None] = self.stop
        self.stop_requested = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "StreamingJob":
        """Deploy the job: afresh, or from the latest complete checkpoint in its directory."""
        with self._lock:
            storage = CheckpointStorage(self.directory, job=self.job, filesystem=self.config.filesystem)
            latest = storage.latest()
            if latest is not None and storage.unfinished_run() is None:
                raise ConfigurationError(
                    f"job {self.job!r} in {storage.directory} was drained (stop(drain=True)): its event time ran to "
                    "its end and every window fired, so nothing can follow it; start the query with a new "
                    "checkpoint location")
            # A driver that died may have left its actors running for a while, in a Ray cluster of
            # its own: this run's attempts come after theirs, and the checkpoints become this run's.
            # Its checkpoint ids, too, come after any that one of them may still be writing.
            earlier = storage.current_attempt()
            first_id = max(storage.checkpoint_ids(complete_only=False), default=0) + 1
            if latest is None:
                storage.clear()
            else:
                check_resumable(latest, self.graph)
                storage.unmark_finished()
            self._number = 0 if earlier is None else earlier + 1
            storage.note_attempt(self._number)
            self._checkpoints = JobCheckpoints(storage)
            self._coordinator = _remote(CheckpointCoordinator, instance_name(self.job, COORDINATOR, 0, 1),
                                        near_driver()).remote(self.job, self._checkpoints, self.config, first_id,
                                                                  checkpoint_metadata(self.graph))
            self._quotas = start_service_quotas(self.graph, self.job)
            restore = _restore_point(self.job, self._coordinator, self._number)
            self.resumed_from = restore
            self.epoch = self._epoch_of(restore)
            type(self).fault_point("restoring", self.epoch)
            if restore is not None:  # output that checkpoint committed, which a crash kept from going out
                self._publish(restore)
            try:
                self._deploy(restore)
            except (_AttemptFailed, RayError) as failure:  # an actor died while the job started
                self._recover(failure.error if isinstance(failure, _AttemptFailed) else failure)
        self._watcher = threading.Thread(target=self._watch, name=f"{self.job} watcher", daemon=True)
        self._watcher.start()
        return self

    def offer(self, epoch: int, table: pa.Table) -> EpochFigures:
        """Run ``table`` through the job as ``epoch``; returns once its checkpoint is complete and
        the output it committed is published. An epoch already in the restored state is skipped."""
        with self._lock:
            self._check_running()
            started = time.perf_counter()
            figures = EpochFigures(epoch, None, table.num_rows, 0, started_at_ms=int(time.time() * 1000))
            if self.epoch is not None and epoch <= self.epoch:
                figures.skipped = True
                self.figures.append(figures)
                return figures
            restarts = self.restarts
            self._feed(epoch, self._pieces(table))
            figures.feed_ms = (time.perf_counter() - started) * 1000
            type(self).fault_point("fed", epoch)
            checkpoint_id, figures.checkpoint_ms, figures.publish_ms, figures.rows_out = self._commit(epoch)
            figures.checkpoint_id, figures.restarts = checkpoint_id, self.restarts - restarts
            figures.latency_ms = (time.perf_counter() - started) * 1000
            self.figures.append(figures)
            self._coordinator.note_stream.remote({**figures.as_dict(), "at_ms": int(time.time() * 1000)})
            type(self).fault_point("published", epoch)
            return figures

    def checkpoint(self) -> EpochFigures:
        """Take a checkpoint now, between epochs, and publish the output it commits: what the
        job produced since the last epoch (windows that fired, requests that completed). The job
        does so on its own every ``checkpoint_interval_ms`` without an epoch."""
        with self._lock:
            self._check_running()
            return self._between_epochs()

    def _between_epochs(self) -> EpochFigures:
        figures = EpochFigures(self.epoch if self.epoch is not None else -1, None, 0, 0,
                               started_at_ms=int(time.time() * 1000), between_epochs=True)
        started = time.perf_counter()
        figures.checkpoint_id, figures.checkpoint_ms, figures.publish_ms, figures.rows_out = self._commit(self.epoch)
        figures.latency_ms = (time.perf_counter() - started) * 1000
        return figures

    def stop(self, drain: bool = False) -> None:
        """End the job: with a final checkpoint that a later run resumes from, or, with
        ``drain``, at the end of its input, every window fired and all output published."""
        with self._lock:
            if self._stopped.is_set():
                return
            if self.failure is not None:  # failed: its latest checkpoint is where a new run starts
                self._end()
                return
            try:
                self._check_running()
                if drain:
                    self._drain()
                else:
                    self._commit(self.epoch)
            finally:
                self._end()

    def _end(self) -> None:
        self._stopped.set()
        if self._attempt is not None:
            self._attempt.kill()
        if self._coordinator is not None:
            ray.kill(self._coordinator, no_restart=True)
        end_service_quotas(self._quotas)
        on_each_machine(remove_counters, self.job)

    @property
    def running(self) -> bool:
        return not self._stopped.is_set() and self.failure is None

    @property
    def _instances(self) -> int:
        return self.graph.stages()[-1].parallelism

    @property
    def _all_instances(self) -> int:
        return sum(stage.parallelism for stage in self.graph.stages())

    # ------------------------------------------------------------------ the work

    def _pieces(self, table: pa.Table) -> list[list[Any]]:
        source = self.graph.source
        if table.num_rows == 0:
            return [[] for _ in range(source.parallelism)]
        # Each split takes an equal, contiguous share of every epoch: all of them move through event
        # time with each micro-batch, so none holds the watermark back for want of rows (pieces
        # dealt round-robin would give all of a small micro-batch to one split).
        node = SourceNode([ray.put(table)], [table.num_rows], source.parallelism, batch_size=source.batch_size)
        return node.split()

    def _feed(self, epoch: int, pieces: list[list[Any]]) -> None:
        self._pending[epoch] = pieces
        try:
            _feed_readers(self._attempt, epoch, pieces)
        except RayError as error:
            self._recover(error)  # feeds the epochs after the restored checkpoint again, this one too

    def _commit(self, epoch: int | None) -> tuple[int, float, float, int]:
        """A checkpoint after ``epoch``, complete, and its output published: (id, ms, ms, rows)."""
        started = time.perf_counter()
        while True:
            self._recover_if_failed()
            checkpoint_id = ray.get(self._coordinator.trigger.remote({"epoch": epoch}))
            if checkpoint_id is None:  # the coordinator is between attempts
                time.sleep(0.01)
                continue
            outcome = "pending"
            while outcome == "pending":
                outcome = ray.get(self._coordinator.outcome.remote(checkpoint_id, 0.2))
                if outcome == "pending" and self._attempt_error() is not None:
                    break
            if outcome == "completed":
                break
        checkpointed = time.perf_counter()
        self._last_commit = time.monotonic()
        self.epoch = epoch
        for fed in [e for e in self._pending if epoch is not None and e <= epoch]:
            del self._pending[fed]
        assert self._checkpoints is not None
        type(self).fault_point("checkpointed", epoch)
        rows = self._publish(checkpoint_id, before_commit=lambda: type(self).fault_point("publishing", epoch))
        return checkpoint_id, (checkpointed - started) * 1000, (time.perf_counter() - checkpointed) * 1000, rows

    def _publish(self, up_to: int, before_commit: Callable[[], None] = lambda: None) -> int:
        """Publish the output and the side outputs with sinks that checkpoints up to ``up_to``
        committed; returns the output's rows. A sink that refuses (an epoch that does not fit
        its files, the user's callback raising) fails the job: what was committed stays in the
        checkpoint directory, and a run that starts again there publishes it."""
        assert self._checkpoints is not None
        output = self._checkpoints.output
        try:
            rows = self.sink.publish(output, self._instances, up_to, before_commit=before_commit)
            for tag, sink in self.side_sinks.items():
                sink.publish(output.side_output(tag), self._all_instances, up_to)
        except Exception as error:
            self.failure = error if isinstance(error, (SchemaError, JobFailedError)) else JobFailedError(
                f"job {self.job!r}: publishing the output of checkpoint {up_to} failed: {type(error).__name__}: {error}")
            self._end()
            if self.failure is error:
                raise
            raise self.failure from error
        return rows

    def _drain(self) -> None:
        attempt = self._attempt
        while True:
            try:
                ray.get([reader.finish_input.remote() for reader in attempt.readers])
                attempt.await_end(time.perf_counter())
                break
            except (_AttemptFailed, RayError) as failure:
                self._recover(failure.error if isinstance(failure, _AttemptFailed) else failure)
                attempt = self._attempt
        everyone = [actor for actors in attempt.stage_actors for actor in actors]
        assert self._checkpoints is not None
        output, final = self._checkpoints.output, self._checkpoints.final_epoch
        staging = self._checkpoints.for_attempt(self._number)
        for tag in self.side_tags:  # what came after the last checkpoint is the final epoch's
            for index, values in enumerate(ray.get([a.take_side.remote(tag) for a in everyone])):
                if values:
                    staging.stage_side(tag, index, final, pack_side_records(values))
        ray.get(self._coordinator.stop.remote())
        output.commit(final, self._number)
        self._publish(final)
        for tag in self.side_tags:
            if tag not in self.side_sinks:
                side = output.side_output(tag)
                self.side_outputs[tag] = [record for instance in range(self._all_instances)
                                          for epoch in side.committed_epochs(instance)
                                          for record in unpack_side_records(side.read_epoch(instance, epoch))]
        self._checkpoints.storage.mark_finished()

    # ------------------------------------------------------------------ failures

    def _deploy(self, restore: int | None) -> None:
        assert self._checkpoints is not None
        if self._attempt is not None:  # a restart
            self._quotas.update(revive_service_quotas(self.graph, self.job, self._quotas))
        attempt = _Attempt(self.graph, self.job, self._number, self._checkpoints.for_attempt(self._number),
                           self._coordinator, restore, self.output_schema, self.placement, service_quotas=self._quotas)
        self._attempt = attempt
        attempt.deploy()
        for epoch in sorted(self._pending):
            if self.epoch is None or epoch > self.epoch:
                _feed_readers(attempt, epoch, self._pending[epoch])

    def _attempt_error(self) -> BaseException | None:
        """The error of an attempt whose actor died or failed, or None while all run."""
        refs = self._attempt.refs
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            try:
                ray.get(ref)
            except RayError as error:
                return error
            return JobFailedError(f"job {self.job!r}: an actor ended before its unbounded input did")
        return None

    def _recover_if_failed(self) -> None:
        error = self._attempt_error()
        if error is not None:
            self._recover(error)

    def _recover(self, error: BaseException) -> None:
        """Restart from the latest complete checkpoint, or fail the job (an operator's error, or
        the restart budget used up)."""
        while True:
            attempt = self._attempt
            dead = attempt.dead_actor()
            attempt.kill()
            attempt.settle()
            if dead is None:  # an operator failed: a replay would fail the same way
                self._fail(_job_failure(self.job, error), error)
            self.failures.append(f"{dead}: {_describe(error)}")
            now = time.monotonic()
            self._restart_times.append(now)
            while self._restart_times and self._restart_times[0] < now - self.config.restart_window_s:
                self._restart_times.popleft()
            if len(self._restart_times) > self.config.max_restarts:
                self._fail(JobFailedError(
                    f"job {self.job!r} failed: {len(self._restart_times) - 1} restarts within "
                    f"{self.config.restart_window_s:g} s used up its restart budget "
                    f"(max_restarts={self.config.max_restarts}); the last failure: actor {dead} died: {_describe(error)}"
                ), error)
            self._number += 1
            self.restarts += 1
            assert self._checkpoints is not None
            self._checkpoints.storage.note_attempt(self._number)
            restore = _restore_point(self.job, self._coordinator, self._number)
            self.epoch = self._epoch_of(restore)
            try:
                self._deploy(restore)
                return
            except (_AttemptFailed, RayError) as again:  # another death during the restart
                error = again.error if isinstance(again, _AttemptFailed) else again

    def _fail(self, failure: JobFailedError, error: BaseException) -> None:
        self.failure = failure
        self._end()
        raise failure from _cause(error)

    def _check_running(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._stopped.is_set():
            raise ConfigurationError(f"job {self.job!r} was stopped; start a new one to go on from its checkpoint")

    def _epoch_of(self, checkpoint_id: int | None) -> int | None:
        if checkpoint_id is None:
            return None
        assert self._checkpoints is not None
        return self._checkpoints.storage.get(checkpoint_id).metadata["extra"].get("epoch")

    def _watch(self) -> None:
        # Between two epochs, a death restarts the job at once (its timers and requests go on),
        # and a checkpoint every checkpoint_interval_ms publishes what the job produced meanwhile:
        # windows that an idle input or a timer closed, requests that completed.
        interval_s = None if self.checkpoint_interval_ms is None else self.checkpoint_interval_ms / 1000
        tick_s = 0.5 if interval_s is None else min(0.5, interval_s / 4)
        while not self._stopped.wait(tick_s):
            if not self._lock.acquire(blocking=False):
                continue
            try:
                if self.running and not self.stop_requested.is_set() and ray.get(
                        self._coordinator.stop_requested.remote(), timeout=5):
                    self.stop_requested.set()
                    threading.Thread(target=self.on_stop_request, name=f"{self.job} stop", daemon=True).start()
                if self.running:
                    self._recover_if_failed()
                    if interval_s is not None and time.monotonic() - self._last_commit >= interval_s:
                        figures = self._between_epochs()
                        if figures.rows_out:  # else the progress would fill up with idle checkpoints
                            self.figures.append(figures)
            except BaseException:  # noqa: BLE001 - kept in self.failure; the next call raises it
                pass
            finally:
                self._lock.release()


def _feed_readers(attempt: Any, epoch: int, pieces: list[list[Any]]) -> None:
    """Hand each reader of ``attempt`` its share of ``epoch``."""
    ray.get([reader.feed_epoch.remote(epoch, pieces[i]) for i, reader in enumerate(attempt.readers)])


def run_streaming(graph: JobGraph, sink: StreamSink, **options: Any) -> StreamingJob:
    """Start ``graph`` as a ``StreamingJob`` writing to ``sink``."""
    return StreamingJob(graph, sink, **options).start()

