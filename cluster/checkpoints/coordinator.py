"""The checkpoint coordinator: one actor per job that starts checkpoints and completes them.

Protocol (after Flink's ``CheckpointCoordinator``, one checkpoint at a time):

1. ``trigger`` picks the next id and asks every task that reads the input to inject a barrier
   there (``trigger_checkpoint(id)`` on the source actors, or on the operator actors that read
   their source themselves). A reader whose input has ended declines; the checkpoint is aborted.
2. Each task snapshots its state when the barrier has reached it on every input, writes it to
   storage (the last stage also stages its output epoch), and acknowledges.
3. When every task has acknowledged, the coordinator writes the checkpoint's metadata (the commit
   point), commits the output epoch, keeps the newest ``retain`` checkpoints, and notifies the
   tasks. A checkpoint that is declined or runs past ``timeout_ms`` is aborted: its files go.

Every call carries the job's *attempt*: after a restore, an acknowledgement from an actor of an
earlier attempt is ignored.

Background work: the interval loop (``_tick``) and each checkpoint's timeout (``_expire``). A
checkpoint that cannot be started or aborted (its storage unreachable for a moment, say) fails no
job: the job's output is only committed by complete checkpoints, so the loop logs a warning with
the cause, keeps it in ``figures()["failures"]``, and tries again at the next interval. It never
ends silently, which would stop the checkpoints of a job that goes on.

Threading model: a Ray asyncio actor; the filesystem work runs in worker threads, one
checkpoint at a time.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from ray.util import metrics as ray_metrics

from actorflow.actors.naming import instance_name
from actorflow.operators.errors import ConfigurationError

from .sink import FINAL_EPOCH, TwoPhaseOutput
from .storage import CheckpointError, CheckpointStorage, PendingCheckpoint

__all__ = ["COORDINATOR", "CheckpointConfig", "CheckpointCoordinator", "JobCheckpoints", "check_overwrite"]

#: The coordinator's operator name: the actor is ``<job>/checkpoint_coordinator[0/1]``, named like
#: the operator instances, so the dashboard lists it with them.
COORDINATOR = "checkpoint_coordinator"

_log = logging.getLogger(__name__)
#: Checkpoints whose figures (id, duration, size) the coordinator keeps, the newest.
_KEPT = 1_000


@dataclass(frozen=True)
class CheckpointConfig:
    """How a job takes checkpoints and recovers.

    ``interval_ms``: time between checkpoints (None: none are taken; an actor failure then
    restarts the job from its beginning, if ``max_restarts`` allows). ``directory``: a path or
    ``pyarrow.fs`` URI every actor can reach; ``filesystem`` may give the filesystem itself.
    ``retain``: complete checkpoints kept. ``max_restarts`` within ``restart_window_s``: the
    restart budget; past it the job fails, naming the actor and its last error.
    ``resume_from``: a job directory of an earlier run (``<directory>/<job>``); the job starts
    from its latest complete checkpoint and keeps the output that checkpoint committed.
    ``overwrite``: a fresh run deletes the checkpoints of an earlier run of the job that did not
    finish and starts afresh; without it, it refuses them (``UnfinishedRunError``).
    """

    interval_ms: int | None = None
    directory: str | None = None
    filesystem: Any = None
    timeout_ms: int = 60_000
    retain: int = 3
    max_restarts: int = 20
    restart_window_s: float = 60.0
    resume_from: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_overwrite(self.overwrite, self.resume_from)
        if self.interval_ms is not None and (not isinstance(self.interval_ms, int) or self.interval_ms < 10):
            raise ConfigurationError(f"checkpoint_interval_ms must be an int >= 10 or None, got {self.interval_ms!r}")
        if not isinstance(self.timeout_ms, int) or self.timeout_ms <= 0:
            raise ConfigurationError(f"checkpoint timeout_ms must be an int > 0, got {self.timeout_ms!r}")
        if not isinstance(self.retain, int) or self.retain < 1:
            raise ConfigurationError(f"retain must be an int >= 1, got {self.retain!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigurationError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")

    @property
    def enabled(self) -> bool:
        return self.interval_ms is not None or self.resume_from is not None


def check_overwrite(overwrite: object, resume_from: str | None) -> None:
    """``overwrite=True`` starts a fresh run, so it cannot go with ``resume_from``.

    >>> check_overwrite(True, "/tmp/checkpoints/clicks")
    Traceback (most recent call last):
    actorflow.operators.errors.ConfigurationError: overwrite=True deletes an earlier run's checkpoints to start afresh, \
and resume_from='/tmp/checkpoints/clicks' goes on from them; pass one or the other
    """
    if not isinstance(overwrite, bool):
        raise ConfigurationError(f"overwrite must be True or False, got {overwrite!r}")
    if overwrite and resume_from is not None:
        raise ConfigurationError(
            f"overwrite=True deletes an earlier run's checkpoints to start afresh, and resume_from={resume_from!r} "
            "goes on from them; pass one or the other")


class JobCheckpoints:
    """What an actor of a checkpointed job is given: where its state and output epochs go.

    Picklable (a ``pyarrow.fs`` filesystem and paths), so each actor writes straight to storage.
    """

    final_epoch = FINAL_EPOCH

    def __init__(self, storage: CheckpointStorage, attempt: int = 0) -> None:
        self.storage = storage
        self.output = TwoPhaseOutput(storage)
        self.attempt = attempt

    def for_attempt(self, attempt: int) -> "JobCheckpoints":
        return JobCheckpoints(self.storage, attempt)

    def write_state(self, checkpoint_id: int, task: str, data: bytes) -> int | None:
        """Store ``task``'s state; None if the checkpoint was aborted meanwhile."""
        pending = PendingCheckpoint(self.storage, checkpoint_id, self.storage._path(checkpoint_id))
        try:
            return pending.write(task, data)
        except CheckpointError:
            return None
        except OSError:
            # Aborted while the file was written: its directory went from under the write (and
            # another task's write may have made it again). Without this task's acknowledgement
            # the checkpoint cannot complete: it is aborted at its timeout, nothing else is lost.
            return None

    def read_state(self, checkpoint_id: int, task: str) -> bytes:
        return self.storage.get(checkpoint_id).read(task)

    def tasks(self, checkpoint_id: int) -> list[str]:
        """The tasks whose states checkpoint ``checkpoint_id`` holds."""
        return self.storage.get(checkpoint_id).tasks

    def stage(self, instance: int, epoch: int, table: pa.Table | None) -> int:
        return self.output.stage(instance, epoch, table, self.attempt)

    def stage_side(self, tag: str, instance: int, epoch: int, table: pa.Table | None) -> int:
        """Stage side output ``tag``'s records of ``epoch`` (a streaming job's ``instance``, counted
        over the whole job); committed and discarded with the output."""
        return self.output.side_output(tag).stage(instance, epoch, table, self.attempt)


_metrics: dict[str, Any] = {}


def _gauge(name: str, description: str) -> Any:
    if name not in _metrics:
        _metrics[name] = ray_metrics.Gauge(f"actorflow_{name}", description, tag_keys=("job",))
    return _metrics[name]


class CheckpointCoordinator:
    """``ray.remote`` is applied at the edge (``cluster.job``)."""

    def __init__(self, job: str, checkpoints: JobCheckpoints, config: CheckpointConfig, first_id: int,
                 metadata: dict[str, Any] | None = None) -> None:
        """``metadata``: what every checkpoint's metadata holds besides its own (the job's
        ``max_parallelism``)."""
        self.job = job
        self._metadata = dict(metadata or {})
        self.checkpoints = checkpoints
        self.storage = checkpoints.storage
        self.config = config
        self.attempt = 0
        self._next_id = first_id
        self._tasks: set[str] = set()
        self._readers: list[Any] = []
        self._participants: list[Any] = []
        self._pending: PendingCheckpoint | None = None
        self._acks: dict[str, int] = {}
        self._extra: dict[str, Any] = {}
        self._stream: dict[str, Any] | None = None
        self._stop_requested = False
        self._started = 0.0
        self._lock = asyncio.Lock()
        self._durations_s: list[float] = []
        self._completed: list[int] = []
        self._aborted: list[tuple[int, str]] = []
        self._sizes: list[int] = []
        self._failures: list[str] = []
        self._expiries: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._tags = {"job": job}
        for name, description in (("checkpoint_duration_ms", "Duration of the last complete checkpoint"),
                                  ("checkpoint_size_bytes", "Size of the last complete checkpoint"),
                                  ("last_completed_checkpoint", "Id of the last complete checkpoint")):
            _gauge(name, description).set(0.0, tags=self._tags)

    def __repr__(self) -> str:
        return instance_name(self.job, COORDINATOR, 0, 1)

    async def configure(self, attempt: int, tasks: list[str], readers: list[Any], participants: list[Any]) -> None:
        """Take on a new attempt of the job: its tasks, the ones that read the input, all actors."""
        async with self._lock:
            await self._abort_pending("the job restarts")
            self.attempt = attempt
            self._tasks = set(tasks)
            self._readers = readers
            self._participants = participants
        if self.config.interval_ms is not None and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def restore_point(self, attempt: int) -> int | None:
        """Before a (re)start: abort what is pending, drop the output no complete checkpoint
        committed, and return the latest complete checkpoint (None: start from the beginning).

        The coordinator commits output right after the metadata that completes a checkpoint;
        the coordinator is not among the actors a failure restarts, so nothing comes between.
        """
        async with self._lock:
            await self._abort_pending("the job restarts")
            self.attempt = attempt  # nothing from an attempt that failed counts any more
            self._readers, self._participants = [], []
            latest = await asyncio.to_thread(self.storage.latest)
            await asyncio.to_thread(self.checkpoints.output.discard_staged)
            await asyncio.to_thread(self.storage.discard_incomplete)
            if latest is None:
                return None
            return latest.checkpoint_id

    async def trigger(self, extra: dict[str, Any] | None = None) -> int | None:
        """Start a checkpoint now; None if one is still running. ``extra`` goes into its
        metadata (a streaming job's last micro-batch in it)."""
        async with self._lock:
            if self._pending is not None or not self._readers:
                return None
            checkpoint_id = self._next_id
            self._next_id += 1
            self._pending = await asyncio.to_thread(self.storage.begin, checkpoint_id)
            self._extra = dict(extra or {})
            self._acks = {}
            self._started = time.monotonic()
            for reader in self._readers:
                reader.trigger_checkpoint.remote(checkpoint_id)
            # Held until it ends: the loop keeps only a weak reference to a task, which may go unfinished.
            expiry = asyncio.get_running_loop().create_task(self._expire(checkpoint_id))
            self._expiries.add(expiry)
            expiry.add_done_callback(self._expiries.discard)
            return checkpoint_id

    async def acknowledge(self, attempt: int, checkpoint_id: int, task: str, size_bytes: int) -> None:
        async with self._lock:
            pending = self._pending
            if attempt != self.attempt or pending is None or pending.checkpoint_id != checkpoint_id:
                return  # an earlier attempt's, or an aborted checkpoint's
            self._acks[task] = size_bytes
            if set(self._acks) != self._tasks:
                return
            current = await asyncio.to_thread(self.storage.current_attempt)
            if current is not None and current != attempt:  # a newer driver took the job over
                await self._abort_pending(f"attempt {current} of the job runs now, from another driver")
                return
            await asyncio.to_thread(pending.complete, {**self._metadata, **self._extra, "attempt": attempt})
            await asyncio.to_thread(self.checkpoints.output.commit, checkpoint_id, attempt)
            self._pending = None
            duration_s = time.monotonic() - self._started
            size = sum(self._acks.values())
            self._durations_s.append(duration_s)
            self._completed.append(checkpoint_id)
            self._sizes.append(size)
            for figures in (self._durations_s, self._completed, self._sizes):
                del figures[:-_KEPT]  # a stream checkpoints for weeks: its figures keep the newest
            await asyncio.to_thread(self.storage.retain, self.config.retain)
            for actor in self._participants:
                actor.notify_checkpoint_complete.remote(checkpoint_id)
            _gauge("checkpoint_duration_ms", "").set(duration_s * 1000, tags=self._tags)
            _gauge("checkpoint_size_bytes", "").set(float(size), tags=self._tags)
            _gauge("last_completed_checkpoint", "").set(float(checkpoint_id), tags=self._tags)

    async def outcome(self, checkpoint_id: int, timeout_s: float) -> str:
        """``"completed"`` or ``"aborted"`` once checkpoint ``checkpoint_id`` has ended, or
        ``"pending"`` if it has not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if checkpoint_id in self._completed:
                return "completed"
            if any(aborted == checkpoint_id for aborted, _ in self._aborted) or (
                    checkpoint_id < self._next_id and (self._pending is None or self._pending.checkpoint_id != checkpoint_id)):
                return "aborted"
            if time.monotonic() >= deadline:
                return "pending"
            await asyncio.sleep(0.005)

    async def decline(self, attempt: int, checkpoint_id: int, task: str, reason: str) -> None:
        async with self._lock:
            pending = self._pending
            if attempt == self.attempt and pending is not None and pending.checkpoint_id == checkpoint_id:
                await self._abort_pending(f"{task} declined it: {reason}")

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        async with self._lock:
            await self._abort_pending("the job ended")
            await asyncio.to_thread(self.storage.discard_incomplete)

    async def note_stream(self, figures: dict[str, Any]) -> None:
        """A streaming job's driver says how its last epoch went (``actorflow status`` shows it)."""
        self._stream = figures

    async def stream_figures(self) -> dict[str, Any] | None:
        return self._stream

    async def request_stop(self) -> None:
        """Ask a streaming job's driver to stop it, with a final checkpoint (``actorflow stop``)."""
        self._stop_requested = True

    async def stop_requested(self) -> bool:
        return self._stop_requested

    async def figures(self) -> dict[str, Any]:
        durations = self._durations_s
        return {
            "completed": list(self._completed),
            "aborted": list(self._aborted),
            "last_completed": self._completed[-1] if self._completed else None,
            "duration_s_p50": statistics.median(durations) if durations else None,
            "duration_s_max": max(durations) if durations else None,
            "size_bytes_last": self._sizes[-1] if self._sizes else None,
            "failures": list(self._failures),
        }

    async def _abort_pending(self, reason: str) -> None:
        # With the lock held.
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._aborted.append((pending.checkpoint_id, reason))
        del self._aborted[:-_KEPT]
        await asyncio.to_thread(pending.abort)
        for actor in self._participants:
            actor.abort_checkpoint.remote(pending.checkpoint_id)

    def _failed(self, what: str, error: BaseException) -> None:
        # A warning with the cause, and the job carries on (see the module's docstring).
        message = f"{self!r}: {what} failed, the next checkpoint is tried at the next interval: {type(error).__name__}: {error}"
        _log.warning(message)
        self._failures.append(message)
        del self._failures[:-20]  # the newest ones: a storage down for hours must not grow this

    async def _expire(self, checkpoint_id: int) -> None:
        await asyncio.sleep(self.config.timeout_ms / 1000)
        try:
            async with self._lock:
                if self._pending is not None and self._pending.checkpoint_id == checkpoint_id:
                    await self._abort_pending(f"it ran past its timeout of {self.config.timeout_ms} ms")
        except Exception as error:  # noqa: BLE001 - logged with its cause; the checkpoint is given up all the same
            self._failed(f"aborting checkpoint {checkpoint_id} at its timeout", error)

    async def _tick(self) -> None:
        assert self.config.interval_ms is not None
        while True:
            await asyncio.sleep(self.config.interval_ms / 1000)
            try:
                await self.trigger()
            except Exception as error:  # noqa: BLE001 - logged with its cause; the next interval tries again
                self._failed("starting a checkpoint", error)
