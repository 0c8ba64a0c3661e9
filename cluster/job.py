"""Deploy a job graph as named Ray actors, run it to the end, and collect its output.

Failure handling in this module is fail-fast: the first operator error, or the death of any
actor, stops the job, kills its actors, and raises ``JobFailedError`` with the cause.
"""

from __future__ import annotations

import functools
import math
import os
import re
import socket
import tempfile
import threading
import time
import uuid
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from actorflow.actors.keys import KeyRouter
from actorflow.actors.naming import instance_name, old_tasks, task_name, validate_job_name
from actorflow.actors.operator_actor import ChainSpec, OperatorActor
from actorflow.actors.service_counters import counters_of, remove_counters
from actorflow.actors.service_quota import SERVICE_PREFIX, ServiceQuotaActor
from actorflow.actors.source_actor import BlockReader, EpochReader, SourceActor
from actorflow.operators.channel_items import Partitioning
from actorflow.operators.errors import ActorflowError, ConfigurationError, JobFailedError
from actorflow.operators.service_quota import check_same_rate

from .checkpoints.coordinator import COORDINATOR, CheckpointConfig, CheckpointCoordinator, JobCheckpoints
from .checkpoints.storage import CheckpointError, CheckpointStorage

from .job_graph import JobGraph, OperatorNode, SourceNode, Stage
from .job_report import OperatorSummary, job_html, job_text, operator_summaries
from .pickling import explain_unpicklable
from .progress import current_progress, reports_progress
from .warm_workers import ACTOR_RUNTIME_ENV, end_top_ups, learn_actor_env, prestart_workers

__all__ = ["CheckpointConfig", "JobResult", "default_checkpoint_directory", "run_job"]

NAMESPACE = "actorflow"
#: How long the first attempt of a job with checkpoints runs before standby processes start for a restart.
STANDBY_AFTER_S = 5.0


@dataclass
class JobResult:
    """What a finished job produced.

    ``tables`` holds one Arrow table ``ObjectRef`` per instance of the last stage, in order;
    they are owned by the caller and outlive the job's actors. ``progress_samples`` holds
    ``(seconds since the job started, input records done, requests in flight)`` about every
    0.5 s while the job ran, the last at its end with every record done. ``phases_s`` says where
    the time of its last attempt went: ``deploy`` (its actors created and connected), ``run``
    (from then until every actor drained), ``collect`` (the output and the figures gathered).

    In a notebook it shows as a table (``_repr_html_``): its state, records in and out, elapsed
    time, throughput, the last watermark, restarts, checkpoints, and each operator with its
    parallelism; ``repr()`` gives the same in one line.
    """

    job: str
    tables: list[Any]
    schemas: list[pa.Schema | None]
    side_outputs: dict[str, list[Any]]
    input_rows: int
    output_rows: int
    elapsed_s: float
    figures: list[dict[str, Any]] = field(default_factory=list)
    finished: Any = None
    restarts: int = 0
    # Failure seen -> new actors running, one per recovery; a recovery that another failure
    # interrupts (before its attempt runs) has none, and the next one counts from that failure.
    recoveries_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "<actor>: <error>", one per restart
    checkpoints: dict[str, Any] | None = None  # the coordinator's figures
    progress_samples: list[tuple[float, int, int]] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    #: What the instances that were killed counted of their services (``actors.service_counters``).
    killed_figures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def actor_processes(self) -> int:
        """The actors the job ran on: its operators' and sources', and its checkpoint coordinator."""
        return len(self.figures) + (self.checkpoints is not None)

    @property
    def operators(self) -> list[OperatorSummary]:
        """Each operator's figures summed over its instances (sources first), with the figures
        of the services its async operators call (``OperatorSummary.services``)."""
        return operator_summaries(self.job, self.figures + self.killed_figures)

    def __repr__(self) -> str:
        return job_text(self)

    def _repr_html_(self) -> str:
        return job_html(self)

    def to_arrow(self) -> pa.Table:
        tables = [t for t in ray.get(self.tables) if t is not None]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="permissive")


@functools.cache
def _actor_class(cls: type) -> Any:
    # One remote class per process: each ray.remote(cls) is exported to the cluster anew, which
    # costs about 0.2 s a job (Ray disassembles the class to name it).
    return ray.remote(cls)


def near_driver() -> dict[str, Any]:
    """Where a job's own actors go (its checkpoint coordinator, its services' quotas): on the
    driver's node, as Flink's JobManager holds its coordination, so that the death of another
    node takes only instances, which the job restores. Hard affinity: that node is alive while
    the driver is, and Ray 2.x places a zero-CPU actor with *soft* affinity on any node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not several_nodes():
        return {"num_cpus": 0}
    return {"num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's entries of the cluster's live nodes (none before Ray starts)."""
    return [node for node in ray.nodes() if node.get("Alive")] if ray.is_initialized() else []


def live_nodes() -> int:
    """How many live nodes the cluster has (0 before Ray starts)."""
    return len(alive_nodes())


def several_nodes() -> bool:
    """Whether the cluster has more than one live node: only then does placement matter (on one
    node Ray's default placement stays, which hands a restart's actors the standby processes)."""
    return live_nodes() > 1


def on_each_machine(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """``fn(*args, **kwargs)`` once on each machine of the cluster, for what lives in a machine's
    files (the service counters of its instances): here on one node; else as a task on one live
    node of each address, since the nodes of one machine share its files. A machine that dies
    meanwhile answers nothing: what its files held went with it."""
    alive = alive_nodes()
    if len(alive) <= 1:
        return [fn(*args, **kwargs)]
    machines: dict[str, str] = {}
    for node in alive:
        machines.setdefault(node["NodeManagerAddress"], node["NodeID"])
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    calls = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args, **kwargs)
             for node in machines.values()]
    answers = []
    for call in calls:
        try:
            answers.append(ray.get(call, timeout=60))
        except RayError:
            continue
    return answers


def instance_placement(num_cpus: float, resources: dict[str, float] | None) -> dict[str, Any]:
    """What each of a job's operator and source instances asks Ray for; where each goes is
    decided at each deployment, over the nodes alive then (see ``spread_over_nodes``)."""
    return {"num_cpus": num_cpus, "resources": dict(resources or {})}


def _needs(placement: dict[str, Any]) -> dict[str, float]:
    need = {"CPU": float(placement.get("num_cpus") or 0.0), **placement.get("resources", {})}
    return {name: float(amount) for name, amount in need.items() if amount}


def _room(node: dict[str, Any], need: dict[str, float]) -> float:
    """How many instances asking for ``need`` the node holds (unbounded for instances that ask
    for nothing)."""
    return min((node["Resources"].get(name, 0.0) // amount for name, amount in need.items()), default=math.inf)


def spread_over_nodes(placement: dict[str, Any], instances: int) -> list[dict[str, Any]]:
    """The placement of each of ``instances`` instances that ask for ``placement``'s resources:
    on one node, Ray's own; on several, a node each, dealt over the live nodes (``deal``), so
    that a node's death takes few of them. Ray's ``SPREAD`` does not do this for actors that ask
    for no CPU: its GCS hands each to a node at random, whose raylet counts its turns alone, and
    four instances on three nodes often land three or four on one. The affinity is hard: Ray
    places a zero-CPU actor with a soft one on any node. An instance whose node dies before it
    starts fails its deployment, which the job restarts over the nodes alive then."""
    alive = alive_nodes()
    if len(alive) <= 1:
        return [placement] * instances
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    need = _needs(placement)
    nodes = deal({n["NodeID"]: _room(n, need) for n in alive if _answers(n)}, instances)
    return [placement if node is None else
            {**placement, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)} for node in nodes]


def _answers(node: dict[str, Any]) -> bool:
    """Whether the node's raylet takes a connection. Ray lists a node whose raylet died as alive
    until its health checks fail, 15-30 s with Ray's defaults, while a job that lost its instances
    there restarts within a second or two: an instance placed there would die at once and cost
    a second restart."""
    if "NodeManagerPort" not in node:
        return True  # nothing to ask: as Ray lists it
    try:
        with socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout=1.0):
            return True
    except OSError:
        return False


def deal(room: dict[str, float], instances: int) -> list[str | None]:
    """The node of each of ``instances`` instances, given how many each node has room for:
    each next instance to the node with room that holds fewest so far (the first in name order
    among equals), so that consecutive instances, and the instances of each stage, land on
    different nodes. None where no node has room left: Ray's own choice (``check_room`` has
    refused a job that the nodes cannot hold)."""
    held = dict.fromkeys(sorted(room), 0)
    nodes: list[str | None] = []
    for _ in range(instances):
        free = [node for node in held if held[node] < room[node]]
        if not free:
            nodes.append(None)
            continue
        node = min(free, key=held.__getitem__)
        held[node] += 1
        nodes.append(node)
    return nodes


def check_room(job: str, actors: int, placement: dict[str, Any]) -> None:
    """Refuse to deploy ``actors`` instances that each ask for ``placement``'s resources when
    the cluster's live nodes cannot hold them all (after a node died, say), naming what each
    asks for and what is left, instead of leaving Ray to wait for nodes that may never come."""
    need = _needs(placement)
    if not need:
        return
    nodes = alive_nodes()
    room = int(sum(_room(n, need) for n in nodes))
    if room >= actors:
        return
    left = "; ".join(
        f"{n['NodeManagerAddress']}: " + ", ".join(f"{name} {n['Resources'].get(name, 0.0):g}" for name in need)
        for n in nodes) or "no live node"
    raise ConfigurationError(
        f"job {job!r} needs {actors} instances of {', '.join(f'{a:g} {r}' for r, a in need.items())} each, and the "
        f"{len(nodes)} live node(s) of the cluster have room for {room} ({left}): add nodes with these resources, or "
        "run the job with fewer instances or smaller ones")


def _remote(cls: type, name: str, placement: dict[str, Any], **options: Any) -> Any:
    # The runtime environment sets the actors' processes apart from tasks' (see warm_workers).
    return _NamedActor(_actor_class(cls).options(
        name=name, namespace=NAMESPACE, max_restarts=0, lifetime=None, runtime_env=ACTOR_RUNTIME_ENV,
        **placement, **options
    ), name)


class _NamedActor:
    """Creates a named actor; while an earlier run's actor of the same name is still being
    killed (``ray.kill`` is asynchronous), waits for the name to be free, up to 10 s."""

    def __init__(self, options: Any, name: str) -> None:
        self._options, self._name = options, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 10
        while True:
            try:
                return self._options.remote(*args, **kwargs)
            except ValueError as error:
                if "already taken" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def start_service_quotas(graph: JobGraph, job: str, only: set[str] | None = None) -> dict[str, Any]:
    """One quota actor per service of the job that has a rate limit, or that more than one
    instance calls (to share its pauses): the node name -> the actor of its service. A service
    is its ``Service(name=...)``, else its operator's; one service with two rates is refused.
    ``only``: the services of these nodes alone."""
    by_service: dict[str, list[OperatorNode]] = {}
    for node in graph.nodes:
        if node.service is not None:
            by_service.setdefault(_service_of(node), []).append(node)
    quotas: dict[str, Any] = {}
    for service, nodes in by_service.items():
        rates = [n.service.calls_per_second for n in nodes]
        for rate in rates[1:]:
            check_same_rate(service, rates[0], rate)
        if rates[0] is None and sum(n.parallelism for n in nodes) == 1:
            continue
        if only is not None and not only & {n.name for n in nodes}:
            continue
        name = _quota_actor_name(job, service)
        handle = _actor_class(ServiceQuotaActor).options(
            name=name, namespace=NAMESPACE, max_restarts=-1, lifetime=None, runtime_env=ACTOR_RUNTIME_ENV, **near_driver(),
        )
        actor = _NamedActor(handle, name).remote(service, rates[0])
        quotas.update((n.name, actor) for n in nodes)
    return quotas


def _service_of(node: OperatorNode) -> str:
    """The service a node calls: its ``Service(name=...)``, else the node's own name."""
    return node.service.name or node.name


def _quota_actor_name(job: str, service: str) -> str:
    return f"{job}/{SERVICE_PREFIX}{service}"


def revive_service_quotas(graph: JobGraph, job: str, quotas: dict[str, Any]) -> dict[str, Any]:
    """The job's quota actors for a restart: those killed for good (Ray restarts the others
    itself) started anew."""
    dead: set[str] = set()
    for handle in {id(h): h for h in quotas.values()}.values():
        try:
            ray.get(handle.figures.remote(), timeout=30)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            dead |= {node for node, h in quotas.items() if h is handle}
    return {**quotas, **start_service_quotas(graph, job, only=dead)} if dead else quotas


def end_service_quotas(quotas: dict[str, Any]) -> None:
    for handle in {id(h): h for h in quotas.values()}.values():
        ray.kill(handle, no_restart=True)


@reports_progress
def run_job(
    graph: JobGraph,
    *,
    job_name: str | None = None,
    output_schema: pa.Schema | None = None,
    side_tags: tuple[str, ...] = ("dead_letter",),
    progress: bool = True,
    actor_num_cpus: float = 0.0,
    actor_resources: dict[str, float] | None = None,
    on_finish: Callable[[list[Any], list[pa.Schema | None], list[list[Any]]], Any] | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> JobResult:
    """Run ``graph`` on the connected Ray cluster until its input is exhausted.

    With ``on_finish``, the last stage's output leaves its actors while the job runs, in blocks
    of a few MiB that this process owns, so that the actors' memory does not grow with the
    input; ``on_finish(last_stage_actors, their_schemas, blocks)`` (``blocks[i]``: instance
    ``i``'s block references, in order) runs after the job drained and before its actors go.
    What it returns is ``JobResult.finished``, and ``JobResult.tables`` stays empty. Without it,
    each last-stage actor keeps its output until the job ends, one table per instance in
    ``tables``. A checkpointed job's output is in storage instead: ``on_finish`` is not called,
    and ``tables`` holds it.

    With ``progress``, a bar shows the job's phases and its input records done, from the start
    of the outermost call that runs it (``to_spark()``, ``enrich()``: see ``cluster.progress``).

    The operator and source actors ask Ray for ``actor_num_cpus`` and ``actor_resources``
    (custom resources, which can keep them to the nodes that offer them).

    The first stage reads the source itself when their parallelism matches, and the last stage
    keeps its output: a job of operators with one parallelism P runs on P actors. Otherwise
    source actors feed the first stage over rebalancing channels.

    With ``checkpoint`` enabled, a coordinator actor takes checkpoints, and the death of any
    actor restarts the job from the latest complete one (from the beginning before the first),
    within the restart budget. Without, the first failure fails the job.
    """
    resumed = checkpoint.resume_from.rstrip("/").rpartition("/")[2] if checkpoint and checkpoint.resume_from else None
    job = validate_job_name(job_name or resumed or f"job-{uuid.uuid4().hex[:8]}")
    current_progress().name(job)
    config = checkpoint if checkpoint is not None and checkpoint.enabled else None
    started = time.perf_counter()
    end_top_ups()  # the last job's: this one takes what waits, and tops up as it ends
    placement = instance_placement(actor_num_cpus, actor_resources)
    on_each_machine(remove_counters, job)  # an earlier run's, which did not end
    quotas = start_service_quotas(graph, job)
    try:
        if config is None:
            attempt = _Attempt(graph, job, 0, None, None, None, output_schema, placement,
                               stream_output=on_finish is not None, service_quotas=quotas)
            try:
                attempt.deploy()
                attempt.await_end(started)
                return attempt.result(started, side_tags, on_finish)
            except _AttemptFailed as failure:
                raise _job_failure(job, failure.error) from _cause(failure.error)
            except RayError as error:  # an actor died, or a call into one failed, outside the wait
                raise _job_failure(job, error) from _cause(error)
            finally:
                attempt.kill()
        return _run_recoverable(graph, job, config, started, output_schema, side_tags, placement, quotas)
    finally:
        end_service_quotas(quotas)
        on_each_machine(remove_counters, job)


def _run_recoverable(
    graph: JobGraph, job: str, config: CheckpointConfig, started: float, output_schema: pa.Schema | None,
    side_tags: tuple[str, ...], placement: dict[str, Any], quotas: dict[str, Any],
) -> JobResult:
    checkpoints, first_id = _open_checkpoints(job, config, graph)
    coordinator = _remote(CheckpointCoordinator, instance_name(job, COORDINATOR, 0, 1), near_driver()).remote(
        job, checkpoints, config, first_id, checkpoint_metadata(graph))
    restarts: deque[float] = deque()
    recoveries_s: list[float] = []
    failures: list[str] = []
    samples: list[tuple[float, int, int]] = []  # of the attempts that failed
    number = 0
    failed_at: float | None = None  # when the failure that the job recovers from was seen
    restore = _restore_point(job, coordinator, 0) if config.resume_from is not None else None
    try:
        while True:
            if number:
                quotas.update(revive_service_quotas(graph, job, quotas))
            attempt = _Attempt(graph, job, number, checkpoints.for_attempt(number), coordinator, restore,
                               output_schema, placement, service_quotas=quotas)
            try:
                attempt.deploy()
                if failed_at is not None:
                    recoveries_s.append(time.monotonic() - failed_at)
                    failed_at = None
                standby = _standby(len(attempt.handles), 0.0 if number else STANDBY_AFTER_S)
                try:
                    attempt.await_end(started)
                finally:
                    standby.cancel()
                ray.get(coordinator.stop.remote())
                checkpoints.output.commit(checkpoints.final_epoch, number)
                result = attempt.result(started, side_tags, None, output=checkpoints.output)
                result.restarts, result.recoveries_s, result.failures = number, recoveries_s, failures
                # The service calls of the instances that were killed (actors.service_counters).
                skip = {str(f.get("name")) for f in result.figures}
                result.killed_figures = [f for found in on_each_machine(counters_of, job, skip=skip) for f in found]
                result.checkpoints = ray.get(coordinator.figures.remote())
                result.progress_samples = samples + result.progress_samples
                _finish_checkpoints(checkpoints.storage, config)
                return result
            except (_AttemptFailed, RayError) as failure:
                error = failure.error if isinstance(failure, _AttemptFailed) else failure
                failed_at = time.monotonic()
                samples.extend(attempt.samples)
                dead = attempt.dead_actor()
                attempt.kill()
                attempt.settle()
                if dead is None:  # an operator failed: a replay would fail the same way
                    raise _job_failure(job, error) from _cause(error)
                failures.append(f"{dead}: {_describe(error)}")
                now = time.monotonic()
                restarts.append(now)
                while restarts and restarts[0] < now - config.restart_window_s:
                    restarts.popleft()
                if len(restarts) > config.max_restarts:
                    raise JobFailedError(
                        f"job {job!r} failed: {len(restarts) - 1} restarts within {config.restart_window_s:g} s used up "
                        f"its restart budget (max_restarts={config.max_restarts}); the last failure: actor {dead} died: "
                        f"{_describe(error)}"
                    ) from _cause(error)
                number += 1
                restore = _restore_point(job, coordinator, number)
    finally:
        ray.kill(coordinator, no_restart=True)


def _standby(actors: int, after_s: float) -> threading.Timer:
    """Once an attempt has run for ``after_s``, have one idle worker per actor wait on the local
    node, so that a restart's actors start in them: a recovery then takes about 0.1 s here
    instead of 1.3-1.5 s for two new processes. A job's first attempt waits ``STANDBY_AFTER_S``:
    a process's start costs about a second of CPU, which a short job would pay while a restart
    is unlikely to need it. An attempt after a restart asks at once: a job that failed once may
    well fail again (a flaky host, a chaos test). After the job they serve the next job's actors
    (``prestart_workers`` counts them)."""
    timer = threading.Timer(after_s, prestart_workers, (actors,))
    timer.daemon = True
    timer.start()
    return timer


def _restore_point(job: str, coordinator: Any, attempt: int) -> int | None:
    """The checkpoint that attempt ``attempt`` restores; a coordinator that died, or could not
    prepare the restore (its storage failed), fails the job."""
    try:
        return ray.get(coordinator.restore_point.remote(attempt))
    except RayError as error:
        what = "could not prepare the restore" if isinstance(error, RayTaskError) else "died"
        raise JobFailedError(
            f"job {job!r} failed: its checkpoint coordinator {what}, so no attempt can restore: {_describe(error)}"
        ) from _cause(error)


def checkpoint_metadata(graph: JobGraph) -> dict[str, Any]:
    """What a job's checkpoints record of it: its ``max_parallelism``."""
    return {"max_parallelism": graph.max_parallelism}


def check_resumable(checkpoint: Any, graph: JobGraph) -> None:
    """Refuse to restore ``checkpoint`` (a ``CompletedCheckpoint``) into ``graph`` where what
    reads the source changed its parallelism, or the key groups differ: keyed state lives in the
    key groups it was written in, and a key's group depends on ``max_parallelism``. A checkpoint
    that names none predates key groups (keys went to ``hash % parallelism``): a keyed job
    cannot restore it."""
    where = f"checkpoint {checkpoint.checkpoint_id} in {checkpoint.path}"
    _check_readers_keep_parallelism(checkpoint.tasks, graph, where)
    written = checkpoint.metadata.get("extra", {}).get("max_parallelism")
    if written == graph.max_parallelism or (written is None and not graph.routes_by_key):
        return
    if written is None:
        raise CheckpointError(
            f"{where} was written before keyed state had key groups, and this job routes by key: its keys would "
            "not find their state; finish that run with the release that wrote it, or start afresh")
    raise CheckpointError(
        f"{where} was written with max_parallelism={written}, and this job has max_parallelism="
        f"{graph.max_parallelism}: a key's group, where its state lives, depends on it, so it cannot change "
        f"between runs; resume with max_parallelism={written}")


def _check_readers_keep_parallelism(tasks: list[str], graph: JobGraph, where: str) -> None:
    """What reads the source keeps its parallelism across a resume: its position is per split,
    and the splits are cut by its parallelism (``instance_rescale``). Refused before any actor
    starts, naming the stage and both parallelisms."""
    stages = graph.stages()
    readers = [stages[0]] if graph.reads_source(stages) else []
    named = [(stage.name, stage.parallelism) for stage in readers] + (
        [] if readers else [(graph.source.name, graph.source.parallelism)])
    for name, parallelism in named:
        old = old_tasks(tasks, name)
        if old and len(old) != parallelism:
            raise CheckpointError(
                f"{where} holds {name!r} at parallelism {len(old)}, and this job runs it at {parallelism}: what "
                f"reads the source keeps its parallelism across a resume (its position is per split); resume it at "
                f"{len(old)}, and change the parallelism after a key_by or rebalance")


def _open_checkpoints(job: str, config: CheckpointConfig, graph: JobGraph) -> tuple[JobCheckpoints, int]:
    """The job's checkpoint storage, and the first checkpoint id of this run.

    ``resume_from`` keeps the job's directory, and carries on from its latest complete
    checkpoint with ids above every id it holds. A fresh run starts the directory afresh, but
    only when no earlier run could be resumed from it: one that ended well (its output was
    delivered), or one that left no complete checkpoint. The checkpoints of a run that failed,
    was interrupted, or still runs are refused, never deleted: re-running a script that crashed
    would otherwise throw away the state it could go on from. Refusing, rather than keeping them
    beside the new ones, keeps one run per job directory, so that ``resume_from`` always means
    the one it names; the error says how to resume, or to start afresh with ``overwrite=True``,
    which deletes them.
    """
    if config.resume_from is not None:
        path = config.resume_from.rstrip("/")
        root, _, name = path.rpartition("/")
        storage = CheckpointStorage(root, job=name, filesystem=config.filesystem)
        if not storage.checkpoint_ids(complete_only=False):
            jobs = _jobs_with_checkpoints(storage.filesystem, storage.directory)
            if jobs:  # the checkpoint directory itself, not one of its jobs'
                hint = f"resume_from={path + '/' + (job if job in jobs else jobs[0])!r}"
                raise ConfigurationError(
                    f"resume_from={config.resume_from!r} is a checkpoint directory of the jobs {jobs}, not one "
                    f"job's; pass the directory of the job to resume, such as {hint}")
        if name != job:
            raise ConfigurationError(
                f"resume_from={config.resume_from!r} holds the checkpoints of job {name!r}, not of {job!r}; "
                f"pass job_name={name!r}")
        latest = storage.latest()
        if latest is None:
            raise CheckpointError(f"resume_from={config.resume_from!r} holds no complete checkpoint of job {job!r}")
        check_resumable(latest, graph)
        storage.unmark_finished()
        ids = storage.checkpoint_ids(complete_only=False)
        return JobCheckpoints(storage), max(ids) + 1
    directory = config.directory or default_checkpoint_directory()
    storage = CheckpointStorage(directory, job=job, filesystem=config.filesystem)
    storage.start_afresh(f"{directory.rstrip('/')}/{job}", overwrite=config.overwrite)
    return JobCheckpoints(storage), 1


def _finish_checkpoints(storage: CheckpointStorage, config: CheckpointConfig) -> None:
    """A job that ended well removes its own checkpoints (see ``_own_checkpoints``), or marks
    them finished, so that its next fresh run may start over them. Neither fails the job, whose
    output is delivered: a directory left unmarked is refused to a fresh run, which says why."""
    try:
        if _own_checkpoints(config):
            storage.filesystem.delete_dir(storage.directory)
        else:
            storage.mark_finished()
    except OSError as error:
        warnings.warn(f"job {storage.job!r} ended well, but its checkpoints in {storage!r} could not be "
                      f"{'removed' if _own_checkpoints(config) else 'marked finished'}: {error}", stacklevel=2)


def _jobs_with_checkpoints(filesystem: Any, directory: str) -> list[str]:
    """The jobs under ``directory`` that hold a checkpoint: it is then a checkpoint root."""
    import pyarrow.fs as pafs

    infos = filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
    return sorted(n for n in names if CheckpointStorage(directory, job=n, filesystem=filesystem).checkpoint_ids())


def _own_checkpoints(config: CheckpointConfig) -> bool:
    """Whether the job's checkpoints are its own to remove when it ends well: those a fresh run
    puts in the temporary directory because no one named a place (no ``checkpoint_dir``, no
    ``$ACTORFLOW_CHECKPOINT_DIR``), as ``enrich()``'s automatic ones do. Left there, each large
    run would leave its checkpoints behind (165 MB for 1M rows) for no one to resume from; a
    named place is a request to keep them. A run that fails keeps them either way, to resume.
    """
    return (config.resume_from is None and config.directory is None and config.filesystem is None
            and not os.environ.get("ACTORFLOW_CHECKPOINT_DIR"))


def default_checkpoint_directory() -> str:
    """``$ACTORFLOW_CHECKPOINT_DIR``, or ``actorflow-checkpoints`` in the temporary directory."""
    return os.environ.get("ACTORFLOW_CHECKPOINT_DIR") or os.path.join(tempfile.gettempdir(), "actorflow-checkpoints")


class _BlockDrain:
    """A thread that takes an actor's stream of output blocks, in order, as the actor sends them.

    The stream ends with the actor's output. Where it fails instead, ``join`` raises that failure:
    the job's own calls report an actor that died, but a stream that broke while its actor went
    on would leave the result short of rows, so the job fails rather than return it.
    """

    def __init__(self, stream: Any, name: str) -> None:
        self.blocks: list[Any] = []
        self.name = name
        self._stream = stream
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._take, name=name, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        try:
            for ref in self._stream:
                self.blocks.append(ref)
        except BaseException as error:  # noqa: BLE001 - raised again by join(), in the job's thread
            self._error = error

    def join(self, timeout_s: float) -> None:
        """Wait for the stream's end; raise if it did not end, or ended with an error."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"{self.name}: its stream of blocks did not end with the job")
        if self._error is not None:
            raise RuntimeError(f"{self.name}: its stream of blocks failed after {len(self.blocks)} block(s), "
                               f"so the result would miss rows: {type(self._error).__name__}: {self._error}"
                               ) from self._error


class _AttemptFailed(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Attempt:
    """One deployment of the job's actors: the first, or one after a restart."""

    quota_names: dict[Any, str] = {}  # the services' quota actors -> their names (never changed in place)

    def __init__(
        self, graph: JobGraph, job: str, number: int, checkpoints: JobCheckpoints | None, coordinator: Any,
        restore: int | None, output_schema: pa.Schema | None, placement: dict[str, Any],
        stream_output: bool = False, service_quotas: dict[str, Any] | None = None,
    ) -> None:
        self.graph, self.job, self.number = graph, job, number
        self.service_quotas = service_quotas or {}  # node name -> its service's quota actor
        self.quota_names = {self.service_quotas[n.name]: _quota_actor_name(job, _service_of(n))
                            for n in graph.nodes if n.name in self.service_quotas}
        # With stream_output, the last stage's output leaves its actors as it is produced:
        # blocks[i] holds instance i's blocks, owned by this process, in order.
        self.stream_output = stream_output
        self.blocks: list[list[Any]] = []
        self._drains: list[_BlockDrain] = []
        self.checkpoints, self.coordinator, self.restore = checkpoints, coordinator, restore
        self.output_schema, self.placement = output_schema, placement
        self.handles: list[Any] = []
        self.names: dict[Any, str] = {}
        self.stage_actors: list[list[Any]] = []
        self.sources: list[Any] = []
        self.readers: list[Any] = []  # the actors that read the input: the sources, or the first stage
        self.refs: list[Any] = []
        self.samples: list[tuple[float, int, int]] = []
        self._times: dict[str, float] = {}  # perf_counter() as each phase ended (see JobResult.phases_s)

    def _router(self, key: Any) -> KeyRouter | None:
        """The router of a stage's key, over the job's key groups."""
        return None if key is None else KeyRouter(key, max_parallelism=self.graph.max_parallelism)

    def deploy(self) -> None:
        self._times["started"] = time.perf_counter()
        graph, job = self.graph, self.job
        stages = graph.stages()
        source = graph.source
        progress = current_progress()
        deploying = "deploy" if self.number == 0 else "recover"
        # What the call waits on first: a Spark DataFrame's snapshot, which the actors start beside.
        progress.phase("snapshot" if source.blocks is None and not source.unbounded else deploying)
        # A keyed first stage with the source's parallelism reads the source itself too: each
        # instance routes its split by key over the stage, and no source actors start.
        keyed_source = stages[0].partitioning is Partitioning.HASH and source.parallelism == stages[0].parallelism
        reads_source = graph.reads_source(stages)
        instances = sum(s.parallelism for s in stages) + (0 if reads_source else source.parallelism)
        check_room(job, instances, self.placement)
        placements = iter(spread_over_nodes(self.placement, instances))
        # Create stages from the last to the first, so every actor knows its downstream. Actor
        # creation does not block: all the processes start at once.
        downstream: list[Any] | None = None
        downstream_partitioning = Partitioning.FORWARD
        wiring: list[tuple[Any, list[Any] | None, bool, int]] = []
        tasks: list[str] = []
        for position in range(len(stages) - 1, -1, -1):
            stage = stages[position]
            num_inputs = source.parallelism if position == 0 else stages[position - 1].parallelism
            if stage.partitioning is Partitioning.FORWARD:
                num_inputs = 1
            actors = []
            for i in range(stage.parallelism):
                spec = ChainSpec(
                    job=job,
                    name=stage.name,
                    index=i,
                    parallelism=stage.parallelism,
                    num_inputs=num_inputs,
                    operator_factories=[n.factory for n in stage.nodes],
                    partitioning=downstream_partitioning,
                    key=None if position == len(stages) - 1 else self._router(stages[position + 1].key),
                    downstream_head=stages[position + 1].nodes[0].factory if downstream_partitioning is Partitioning.HASH else None,
                    output_schema=self.output_schema if position == len(stages) - 1 else None,
                    input_schema=source.schema,
                    checkpoints=self.checkpoints,
                    coordinator=self.coordinator,
                    attempt=self.number,
                    restore=self.restore,
                    side_index=(sum(s.parallelism for s in stages[:position]) + i
                                if source.unbounded and self.checkpoints is not None else None),
                    service_quotas=[self.service_quotas.get(n.name) for n in stage.nodes] if self.service_quotas else None,
                    input_key=self._router(stage.key) if stage.partitioning is Partitioning.HASH else None,
                    max_parallelism=self.graph.max_parallelism,
                )
                try:
                    actor = _remote(OperatorActor, spec.instance_name, next(placements)).remote(spec)
                except Exception as error:
                    self.kill()  # the actors of later stages, already made
                    raise _unsendable(stages, error) from error
                self.handles.append(actor)
                self.names[actor] = spec.instance_name
                tasks.append(spec.task)
                actors.append(actor)
            self.stage_actors.insert(0, actors)
            for i, actor in enumerate(actors):
                targets = None if downstream is None else (
                    [downstream[i]] if downstream_partitioning is Partitioning.FORWARD else downstream)
                wiring.append((actor, targets, position == 0 and reads_source, i))
            downstream = actors
            downstream_partitioning = stage.partitioning

        first = self.stage_actors[0]
        if not reads_source:
            for i in range(source.parallelism):
                name = instance_name(job, source.name, i, source.parallelism, self.number)
                handle = _remote(SourceActor, name, next(placements)).remote(
                    job, source.name, i, source.parallelism,
                    key=self._router(stages[0].key) if stages[0].partitioning is Partitioning.HASH else None,
                    head=stages[0].nodes[0].factory if stages[0].partitioning is Partitioning.HASH else None,
                    checkpoints=self.checkpoints, coordinator=self.coordinator, attempt=self.number,
                    restore=self.restore)
                self.names[handle] = name
                tasks.append(task_name(source.name, i, source.parallelism))
                self.sources.append(handle)
            self.handles.extend(self.sources)
        learn_actor_env(self.stage_actors[0][0])

        # The processes start while the input is prepared (a Spark DataFrame's snapshot).
        splits = [[] for _ in range(source.parallelism)] if source.unbounded else graph.splits()
        progress.phase(deploying)
        if not source.unbounded:
            progress.set_total(source.total_rows)
        connects = [
            actor.connect.remote(targets, _reader(source, splits[i], i), first, self._router(stages[0].key))
            if reads and keyed_source
            else actor.connect.remote(targets, _reader(source, splits[i], i) if reads else None)
            for actor, targets, reads, i in wiring
        ]
        connects += [handle.connect.remote(first, i, _reader(source, splits[i], i)) for i, handle in enumerate(self.sources)]
        operators = [a for actors in self.stage_actors for a in actors]
        if self.coordinator is None:
            # Nothing to configure in between: the actors start as soon as they are connected,
            # without a round trip here (an item pushed to one not connected yet waits).
            starts = [a.start.remote() for a in operators]
        ray.get(connects)
        if self.stream_output:
            for actor in self.stage_actors[-1]:
                self._drain(actor)
        self.readers = first if reads_source else self.sources
        if self.coordinator is not None:
            ray.get(self.coordinator.configure.remote(self.number, tasks, self.readers, self.handles))
            starts = [a.start.remote() for a in operators]
        ray.get(starts)
        self.refs = [s.run.remote() for s in self.sources] + [a.wait.remote() for a in operators]
        self._times["deploy"] = time.perf_counter()

    def _drain(self, actor: Any) -> None:
        drain = _BlockDrain(actor.output_blocks.options(num_returns="streaming").remote(), f"{self.names[actor]} output")
        self.blocks.append(drain.blocks)
        self._drains.append(drain)

    def await_end(self, started: float) -> None:
        operators = [a for actors in self.stage_actors for a in actors]
        source = self.graph.source
        _await_job(self.refs, self.stage_actors[0], operators, None if source.unbounded else source.total_rows, started,
                   self.samples)
        self._times["run"] = time.perf_counter()
        current_progress().phase("collect")

    def result(
        self, started: float, side_tags: tuple[str, ...], on_finish: Callable[..., Any] | None,
        output: Any = None,
    ) -> JobResult:
        last = self.stage_actors[-1]
        # Every question to the actors goes out at once: one round trip, not one per question.
        everyone = [a for actors in self.stage_actors for a in actors]
        side_refs = {tag: [a.take_side.remote(tag) for a in everyone] for tag in side_tags}
        stats_refs = [a.stats.remote() for a in last]
        schema_refs = [a.output_schema.remote() for a in last] if output is None else []
        # With a hook, the hook takes the output in its own form; the tables are not made too.
        tables = [a.take_table.remote() for a in last] if output is None and on_finish is None else []
        figures = ray.get(self.refs)
        side = {tag: [v for values in ray.get(refs) for v in values] for tag, refs in side_refs.items()}
        finished = None
        if output is not None:  # a checkpointed job: the committed output, read from storage
            tables = [ray.put(t) for t in (output.read(i) for i in range(output.instances(len(last))))]
            schemas = [t.schema if t is not None else None for t in ray.get(tables)]
        else:
            schemas = ray.get(schema_refs)
            for drain in self._drains:  # the streams end with the actors' output
                drain.join(60)
            finished = on_finish(last, schemas, self.blocks) if on_finish is not None else None
            ray.wait(tables, num_returns=len(tables), fetch_local=False)
        output_rows = sum(f["records_out"] for f in ray.get(stats_refs))
        if output is not None:
            output_rows = sum(t.num_rows for t in ray.get(tables) if t is not None)
        times = self._times
        times["collect"] = time.perf_counter()
        phases = {phase: times[phase] - times[before] for before, phase in
                  (("started", "deploy"), ("deploy", "run"), ("run", "collect"))}
        return JobResult(self.job, tables, schemas, side, self.graph.source.total_rows, output_rows,
                         times["collect"] - started, figures, finished, progress_samples=list(self.samples),
                         phases_s=phases)

    def dead_actor(self) -> str | None:
        """The name of an actor of this attempt that died, or None if all are alive.

        Returns at the first dead one: the probe of an actor whose process is still starting
        (a kill during the deploy) answers only once it has started, seconds later. The
        services' quota actors count too: one killed for good fails the instances that lease
        from it, and a restart starts it anew (``revive_service_quotas``)."""
        names = {**{handle: self.names[handle] for handle in self.handles}, **self.quota_names}
        probes = {handle.__ray_ready__.remote(): handle for handle in names}
        pending, deadline = list(probes), time.monotonic() + 10
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                ray.get(ready[0])
            except RayError:
                return names[probes[ready[0]]]
        return None

    def kill(self) -> None:
        for handle in self.handles:
            ray.kill(handle, no_restart=True)

    def settle(self) -> None:
        """Collect the failed calls of a killed attempt, so that Ray does not report each one as
        an unhandled error when it is dropped: in a thread, for up to a second, while the next
        attempt deploys."""
        refs = self.refs

        def collect() -> None:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0, fetch_local=False)
            for ref in ready:
                try:
                    ray.get(ref)
                except RayError:
                    pass

        threading.Thread(target=collect, name=f"{self.job} settle #{self.number}", daemon=True).start()


def _reader(source: SourceNode, blocks: list[Any], split: int) -> BlockReader:
    if source.unbounded:
        return EpochReader(split=split, batch_size=source.batch_size, timestamp_column=source.timestamp_column,
                           out_of_orderness_ms=source.out_of_orderness_ms, idleness_ms=source.idleness_ms)
    return BlockReader(
        blocks,
        split=split,
        batch_size=source.batch_size,
        timestamp_column=source.timestamp_column,
        out_of_orderness_ms=source.out_of_orderness_ms,
        idleness_ms=source.idleness_ms,
    )


def _await_job(
    refs: list[Any], first_stage: list[Any], operators: list[Any], total_rows: int | None, started: float,
    samples: list[tuple[float, int, int]],
) -> None:
    """Wait for the job, failing fast; the call's bar counts input records that have an outcome.

    A record is done once the first stage has emitted its outcome (or filtered it out). The
    bar also shows the requests in flight in every stage and the age of the oldest, so that a
    stuck call is visible even when every record has been read.

    Every 0.5 s, bar or no bar, ``samples`` gets ``(seconds since started, records done,
    requests in flight)``; the last, at the end, has every record done.
    """
    pending = list(refs)
    progress = current_progress()
    progress.phase("run")
    polled = 0.0
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
        for ref in ready:
            try:
                ray.get(ref)
            except RayError as error:
                raise _AttemptFailed(error) from _cause(error)
        if pending and time.perf_counter() - polled >= 0.5:
            polled = time.perf_counter()
            try:
                figures = ray.get([a.record_progress.remote() for a in operators])
            except RayError as error:  # an actor died between two polls
                raise _AttemptFailed(error) from _cause(error)
            done = sum(f["done"] for f in figures[: len(first_stage)])
            if total_rows is not None:
                done = min(total_rows, done)
            in_flight = sum(f["in_flight"] for f in figures)
            samples.append((polled - started, done, in_flight))
            oldest = max((f["oldest_ms"] for f in figures if f["oldest_ms"] is not None), default=None)
            progress.advance(done, f"in flight {in_flight}" + ("" if oldest is None else f", oldest {oldest / 1000:.1f}s"))
    if total_rows is not None:
        progress.advance(total_rows)
        samples.append((time.perf_counter() - started, total_rows, 0))


def _cause(error: BaseException) -> BaseException:
    if isinstance(error, RayTaskError):
        cause = error.cause if getattr(error, "cause", None) is not None else error
        return cause
    return error


def _describe(error: BaseException) -> str:
    cause = _cause(error)
    return f"{type(cause).__name__}: {cause}".splitlines()[0][:500]


def _unsendable(stages: list[Stage], error: Exception) -> Exception:
    """A clear error for an actor's arguments that cannot be pickled, naming what cannot; else ``error``."""
    for stage in stages:
        for node in stage.nodes:
            why = explain_unpicklable(node.factory) or explain_unpicklable(node.key)
            if why is not None:
                return ConfigurationError(
                    f"operator {node.name!r} cannot be sent to its actors: {why}. Create such an object where "
                    "the function runs: inside it, or in an AsyncFunction's open(), which runs in the actor"
                )
    return error


# What Ray says when a worker cannot unpickle an actor's arguments: a function of the job comes
# from a module that the driver imports and the workers cannot.
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


def _job_failure(job: str, error: BaseException) -> JobFailedError:
    cause = _cause(error)
    if isinstance(cause, RayActorError):
        missing = _MISSING_MODULE.search(str(cause)) if cause.actor_init_failed else None
        if missing is not None:
            module = missing.group(1)
            return JobFailedError(
                f"job {job!r} failed: its actors cannot import module {module!r}, which a function of the job "
                f"comes from (the driver imports it, the Ray workers do not). Make it importable on the workers "
                f"(install it, or ray.init(runtime_env={{'py_modules': [...]}})), or have it pickled with the "
                f"functions: ray.cloudpickle.register_pickle_by_value({module}). Ray said: {_describe(cause)}"
            )
        return JobFailedError(f"job {job!r} failed: an actor died: {cause}")
    if isinstance(cause, ActorflowError):
        return JobFailedError(f"job {job!r} failed: {cause}")
    return JobFailedError(f"job {job!r} failed: {type(cause).__name__}: {cause}")
