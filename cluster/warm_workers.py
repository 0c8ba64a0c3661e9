"""Python worker processes kept warm for the next job's actors.

A Ray actor runs in a worker process of its own, and Ray never reuses one that hosted an actor
or ran a task for a new actor. So every job would wait for fresh processes: on a small machine
about a second for two, on the critical path of the job's start. Ray prestarts workers when it
starts, but only the session's first job finds them.

When a job's actors go, ``prestart_workers(n)`` asks the local raylet to start ``n`` Python
workers for this driver's Ray job and keep them idle for ``KEEP_ALIVE_S``; the next job's actors
take them, ready in a fraction of the time. The request is the raylet's own ``PrestartWorkers``
call, which Ray 2.50's Python API does not expose yet.

The raylet starts at most as many worker processes at once as it has CPUs (its
``maximum_startup_concurrency``) and drops what a request asks for beyond that. So the request
goes out in chunks of that size from a background thread, each once the processes of the one
before are up: on a busy machine a start takes two seconds or more.

A local Ray started by ``spark_bridge.ensure_ray`` also has every new worker run
``prepare_worker`` as it starts (Ray's ``worker_process_setup_hook``): a thread imports the
actors' modules, pandas (which pyarrow imports at its first conversion of a Python value) and
what Ray imports at its first deserialization, then collects garbage once and freezes what is
left. A prestarted worker has done so before the next job begins; otherwise each actor would, on the
job's critical path. In a thread, so that a job that comes at once (its predecessor's workers
still starting) finds them ready, and waits only for the modules it needs. The request for
prestarted workers carries the actors' runtime environment, of which that hook is part (it is
the job's), so that they match the job's actors.

Ray tasks would take those workers too: a task runs in any idle worker of its job whose runtime
environment matches, and a worker that ran a task is no longer one for an actor (Ray ends it as
surplus soon after). A user's tasks, or actorflow's own for blocking calls, between two jobs would
leave the next job's actors to start cold. So the actors carry a runtime environment of their own,
``ACTOR_RUNTIME_ENV`` (one variable, merged into the job's), and the workers asked for carry it
too: only an actor of actorflow matches them. Ray merges the two environments into a string the
driver cannot see, so the job asks its first actor for it (``learn_actor_env``).

The snapshot of a Spark DataFrame and the conversion of a job's output back to Spark run as Ray
tasks of the driver, in the job's own runtime environment (``prestart_task_workers`` keeps
``TASK_WORKERS`` of those warm): without them every ``enrich()`` of a DataFrame would wait for
a new process for its second fetch task, Ray keeping only one idle worker of that environment
between jobs. A worker that ran a task is no longer kept for its own sake: Ray ends it as surplus
when a job with many processes (blocking calls in Ray tasks) goes over the node's soft limit. So
once a driver has asked for task workers, every job of it tops them up as it ends
(``top_up_task_workers``), a job without Spark (``execute()``) too.

Neither request adds to what already waits: each counts the idle workers of its kind (idle or
still starting) and asks for the rest, once at once and again once Ray has ended the ones it does
not keep, then a few times more while some are missing: the raylet may drop a start it accepted.
A prestarted worker that no job took lives ``KEEP_ALIVE_S``; once less than ``LIFE_LEFT_S`` of
that is left, it no longer counts, and the next top-up starts one in its place: otherwise the
next job could find its worker ended by Ray just before it came.
The next job ends those rounds as it starts (``end_top_ups``): it takes the workers that wait,
which they would count as missing and start again, and its own end tops them up.
A local Ray started by ``spark_bridge.ensure_ray`` keeps a worker that ran a task for a minute
after (``actors.upstream.ray.IDLE_WORKER_KEEP_MS``), where Ray ends it after a second:
so the processes of one job's blocking calls serve the next job's, and only its actors'
processes, which Ray never reuses, are new. On a machine of two cores a worker's start costs
2-3 s of CPU; without this, a job of two instances of blocking calls would start six after it
ends, its actors' two and its tasks' four.

It is an optimisation only: where it cannot apply (Ray Client, a job-level runtime environment,
whose workers a prestarted one would not match, or a raylet that refuses), nothing happens,
and actors start as Ray starts them; a failure is reported once, as a warning. The mechanism (the
raylet's gRPC call, the scan of processes) is ``actors.upstream.ray``'s, and
``ACTORFLOW_NO_PRESTART_WORKERS=1`` turns it off.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, NamedTuple

import ray

from actorflow.actors import upstream
from actorflow.actors.upstream import ray as ray_upstream

__all__ = ["ACTOR_RUNTIME_ENV", "TASK_WORKERS", "end_top_ups", "learn_actor_env", "prepare_worker",
           "prestart_task_workers", "prestart_workers", "top_up_task_workers"]

_log = logging.getLogger(__name__)

KEEP_ALIVE_S = 600
#: A prestarted worker counts as waiting only while it has at least this long to live. Ray ends
#: one whose keep-alive is over once the node has more workers than its soft limit (one per CPU),
#: perhaps just as the next job comes for it; so an older one is replaced ahead of time.
LIFE_LEFT_S = KEEP_ALIVE_S // 2
CHUNK_INTERVAL_S = 0.2  # the least time between two chunks of a request
CHUNK_WAIT_S = 10.0  # the most time a chunk waits for the processes of the one before
RETRY_ROUNDS = 3  # more requests after the last, while workers are still missing
RETRY_PAUSE_S = 2.0

# The runtime environment of actorflow's actors: the job's, plus this variable.
ACTOR_RUNTIME_ENV: dict[str, Any] = {"env_vars": {"ACTORFLOW_PROCESS": "actor"}}

#: Workers kept warm for the driver's own tasks: a DataFrame's snapshot fetches with two at once
#: (``spark_bridge.arrow_io``), and so does a large output's conversion.
TASK_WORKERS = 2
#: How long after a job its idle workers are counted: Ray ends those beyond what it keeps about
#: a second after they idle.
TASK_SETTLE_S = 2.0

# The latest top-up of each kind (``_top_up_in_thread``): an older one ends at its next round.
_top_up_generations: dict[str, int] = {}

# The Ray jobs of this driver that asked for workers for its tasks: each later job tops them up.
_task_jobs: set[str] = set()
# The address of each local node's raylet, by node ID.
_raylets: dict[str, str] = {}
# Per Ray job of this driver: the actors' runtime environment as Ray serialised it, or the
# reference of an actor's answer while it is on its way.
_actor_env: dict[str, Any] = {}


def learn_actor_env(actor: Any) -> None:
    """Ask ``actor`` (an ``OperatorActor``) for the actors' runtime environment, once per Ray job."""
    if ray.is_initialized():
        key = _job_key(ray.get_runtime_context())
        if key not in _actor_env:
            _actor_env[key] = actor.actor_runtime_env.remote()


def prestart_workers(actors: int, tasks: int = 0, settle_s: float = TASK_SETTLE_S) -> threading.Thread | None:
    """Have idle Python workers of the actors' runtime environment wait on the local node for
    the next job: ``actors`` for its actors, and ``tasks`` more for their Ray tasks (blocking
    calls), from a background thread; None if that cannot apply.

    Counts the workers of that environment that are idle or still starting, as
    ``prestart_task_workers`` does for the driver's, and asks for the rest. A worker that ran
    blocking calls serves tasks only (Ray starts no actor in it), so it counts for ``tasks``
    alone: the workers of the last job's blocking calls, which a local Ray keeps for a while,
    serve the next job's instead of new ones. An idle prestarted worker exits after ``KEEP_ALIVE_S``;
    one with less than ``LIFE_LEFT_S`` left counts for nothing.
    """
    if actors + tasks <= 0 or not ray.is_initialized() or not upstream.enabled("prestart_workers"):
        return None
    try:
        context = ray.get_runtime_context()
        job = context.get_job_id()
        address = _raylet_address()
        env = None if address is None else _known_actor_env(_job_key(context))
    except Exception as error:  # noqa: BLE001 - an optimisation: the next job starts its processes itself
        _failed(error)
        return None
    if address is None or env is None:
        return None

    def missing() -> int:
        fresh, used = _actor_workers(job)
        # Actors take fresh workers only; tasks take what the actors leave, and the used ones.
        return max(0, actors - fresh, actors + tasks - fresh - used)

    # The raylet's answer takes tens of ms, and the processes seconds: the job that asks ends
    # without waiting for either.
    return _top_up_in_thread("actorflow prestart", missing, settle_s,
                             lambda wanted: _request_chunks(address, bytes.fromhex(job), env, wanted))


def prestart_task_workers(count: int = TASK_WORKERS, settle_s: float = TASK_SETTLE_S) -> threading.Thread | None:
    """Have at least ``count`` idle Python workers for this driver's Ray tasks (its own runtime
    environment) wait on the local node, from a background thread; None if that cannot apply.

    Which idle worker a task takes is Ray's choice, so no count of requests says what is left;
    the thread counts the workers themselves, idle or still starting, and asks for the rest. So
    it never adds to what is already waiting. It counts twice: at once, so that the processes
    start while the caller's job winds down rather than as the next one begins, and again once
    Ray has ended the ones it does not keep (``settle_s``).
    """
    if count <= 0 or not ray.is_initialized() or not upstream.enabled("prestart_workers"):
        return None
    try:
        context = ray.get_runtime_context()
        _task_jobs.add(_job_key(context))
        job = context.get_job_id()
        address = _raylet_address()
        env = _driver_env()
    except Exception as error:  # noqa: BLE001 - an optimisation only
        _failed(error)
        return None
    if address is None:
        return None

    return _top_up_in_thread(
        "actorflow prestart tasks", lambda: max(0, count - _idle_task_workers(job)), settle_s,
        lambda wanted: _request(address, bytes.fromhex(job), env, min(wanted, _startup_concurrency())))


def end_top_ups() -> None:
    """End the top-ups under way before their next round: a job that starts takes the workers
    that wait, which they would count as missing and start again, and it tops up itself as it
    ends."""
    for name in list(_top_up_generations):
        _top_up_generations[name] += 1


def _top_up_in_thread(name: str, missing: Callable[[], int], settle_s: float,
                      request: Callable[[int], Any]) -> threading.Thread:
    """``request(missing())`` workers when any are missing, in a thread: at once, so that the
    processes start while the caller's job winds down rather than as the next one begins, and
    again once Ray has ended the ones it does not keep (``settle_s``).

    A request the raylet accepts may still start nothing: it sets up the runtime environment
    first, and drops the start if by then as many processes as it starts at once are starting
    (on a busy machine, those of other jobs). So while workers are missing after that, it asks
    again, ``RETRY_ROUNDS`` times at most, ``RETRY_PAUSE_S`` apart.

    A newer top-up of the same ``name``, or a job that starts (``end_top_ups``), ends this one
    before its next round."""
    generation = _top_up_generations[name] = _top_up_generations.get(name, 0) + 1

    def top_up() -> None:
        try:
            for round_, pause in enumerate((0.0, settle_s, *(RETRY_PAUSE_S,) * RETRY_ROUNDS)):
                time.sleep(pause)
                if _top_up_generations.get(name) != generation:
                    return
                wanted = missing()
                if wanted <= 0 and round_ > 0:
                    return
                if wanted > 0 and ray.is_initialized():
                    request(wanted)
        except Exception as error:  # noqa: BLE001 - an optimisation only
            _failed(error)

    thread = threading.Thread(target=top_up, name=name, daemon=True)
    thread.start()
    return thread


def top_up_task_workers() -> threading.Thread | None:
    """``prestart_task_workers()`` if this driver's Ray job has asked for them before; else None.

    For the end of a job that needs no task workers itself: a session that uses Spark keeps them
    warm through it, one that never did starts none.
    """
    if not ray.is_initialized() or _job_key(ray.get_runtime_context()) not in _task_jobs:
        return None
    return prestart_task_workers()


def _idle_task_workers(job: str) -> int:
    """Python workers of Ray job ``job`` on this machine that a task of the driver can take, idle
    or still starting, with ``LIFE_LEFT_S`` to live: not those of the actors' runtime environment
    (``ACTOR_RUNTIME_ENV``)."""
    return sum(1 for worker in _waiting_workers(job) if worker.env.get("ACTORFLOW_PROCESS") != "actor")


def _actor_workers(job: str) -> tuple[int, int]:
    """Idle or starting Python workers of Ray job ``job`` of the actors' runtime environment on
    this machine, with ``LIFE_LEFT_S`` to live: those that never ran blocking calls, and those that
    did."""
    from actorflow.actors.task_function import ran_tasks, task_workers_dir

    fresh = used = 0
    for worker in _waiting_workers(job):
        if worker.env.get("ACTORFLOW_PROCESS") == "actor":
            if ran_tasks(worker.mark):
                used += 1
            else:
                fresh += 1
    _forget_gone_task_workers(task_workers_dir())
    return fresh, used


def _waiting_workers(job: str) -> Iterator[_Worker]:
    """The idle or starting workers of ``job`` that the next job can count on: each has at least
    ``LIFE_LEFT_S`` of its keep-alive left, which runs from before its start (its process's)."""
    oldest = time.time() - (KEEP_ALIVE_S - LIFE_LEFT_S)
    return (worker for worker in _idle_workers(job) if worker.created > oldest)


def _forget_gone_task_workers(directory: Path) -> None:
    """Remove the marks of processes that are gone."""
    import psutil

    from actorflow.actors.task_function import worker_mark

    try:
        marks = list(directory.iterdir())
    except OSError:
        return
    for mark in marks:
        pid = mark.name.partition("-")[0]
        try:
            alive = pid.isdigit() and worker_mark(int(pid), psutil.Process(int(pid)).create_time()) == mark.name
        except psutil.Error:
            alive = False
        if not alive:
            mark.unlink(missing_ok=True)


class _Worker(NamedTuple):
    """A process of a Ray job on this machine."""

    cmdline: list[str]
    env: dict[str, str]
    mark: str  # its ``worker_mark``
    created: float  # when its process started, in seconds since the epoch


def _idle_workers(job: str) -> Iterator[_Worker]:
    """The Python workers of Ray job ``job`` on this machine that are idle or still starting."""
    from actorflow.actors.task_function import worker_mark

    for worker in ray_upstream.job_workers(job, _node_id()):
        if ray_upstream.idle_or_starting(worker.cmdline):
            yield _Worker(worker.cmdline, worker.env, worker_mark(worker.pid, worker.created), worker.created)


def _driver_env() -> str:
    """The runtime environment of this driver's tasks, as Ray serialised it: the job's."""
    return ray_upstream.current_runtime_env()


def _known_actor_env(key: str) -> str | None:
    """The actors' runtime environment exactly as they carry it, or they would not match; None
    if no actor of this job has said it (it died first, or none was asked)."""
    env = _actor_env.get(key)
    if env is None or isinstance(env, str):
        return env
    try:
        env = ray.get(env, timeout=5)
    except Exception:  # noqa: BLE001 - the next job asks its own first actor
        del _actor_env[key]
        raise
    _actor_env[key] = env
    return env


def _request(address: str, job_id: bytes, env: str, count: int) -> None:
    ray_upstream.request_workers(address, job_id, env, count, KEEP_ALIVE_S)


def _request_chunks(address: str, job_id: bytes, env: str, count: int) -> None:
    """Ask for ``count`` workers, as many at a time as the raylet starts at once, each chunk
    once the processes of the one before are up."""
    try:
        chunk = _startup_concurrency()
        _request(address, job_id, env, min(count, chunk))
        rest = count - chunk
        while rest > 0:
            time.sleep(CHUNK_INTERVAL_S)
            deadline = time.monotonic() + CHUNK_WAIT_S
            while _starting_workers(job_id.hex()) and time.monotonic() < deadline:
                time.sleep(CHUNK_INTERVAL_S)
            if not ray.is_initialized():
                return
            _request(address, job_id, env, min(rest, chunk))
            rest -= chunk
    except Exception as error:  # noqa: BLE001 - an optimisation only
        _failed(error)


def _starting_workers(job: str) -> int:
    """Python worker processes of Ray job ``job`` on this machine that are not up yet."""
    return sum(1 for worker in ray_upstream.job_workers(job, _node_id()) if ray_upstream.starting_script(worker.cmdline) is not None)


def _node_id() -> str | None:
    """This driver's node, whose raylet's workers are the ones to count; None without Ray."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _failed(error: Exception) -> None:
    """Report a failed request once, unless Ray went meanwhile (a driver that ends)."""
    if ray.is_initialized():
        upstream.failed("prestart_workers", error)
    else:
        _log.debug("prestarting Ray workers ended with Ray: %s", error)


def prepare_worker() -> None:
    """Start importing, in a new Ray worker, what a job's actors import first.

    In a thread of its own: the worker is ready for an actor at once, and an actor that comes
    before the imports are done waits only for the modules it needs, while they load.
    """
    threading.Thread(target=_import_for_actors, name="actorflow imports", daemon=True).start()


def _import_for_actors() -> None:
    # A failure costs nothing but the time saved: the actor imports what it needs itself.
    try:
        import actorflow.actors.operator_actor  # noqa: F401
        import actorflow.actors.source_actor  # noqa: F401
        import actorflow.operators.windows  # noqa: F401
        import actorflow.operators.windows.vectorised  # noqa: F401 - the Arrow path imports it at its first batch
        import pandas  # noqa: F401 - pyarrow's first conversion of a Python value imports it: 0.2-0.3 s
        import pyarrow.acero  # noqa: F401 - Table.group_by imports it: 12 ms

        for module in ray_upstream.DESERIALIZATION_MODULES:
            importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - an optimisation only
        _log.warning("preparing a Ray worker for actorflow's actors failed: %s", error)
        return
    # What the imports built lives as long as the process: collect once and freeze it
    # (``actors.upstream.cpython``), so that the collection an actor makes before it starts walks
    # only its own objects.
    upstream.start("worker")


def _startup_concurrency() -> int:
    """How many worker processes the local raylet starts at once: its CPUs, at most the machine's."""
    cpus = int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1
    return max(1, min(os.cpu_count() or 1, cpus))


def _job_key(context: Any) -> str:
    # Job ids repeat across Ray clusters (each one's first driver is job 01000000).
    return f"{context.gcs_address}/{context.get_job_id()}"


def _raylet_address() -> str | None:
    """The address of this process's raylet, or None (Ray Client has no local node)."""
    if ray.util.client.ray.is_connected():
        return None
    node_id = ray.get_runtime_context().get_node_id()
    if node_id not in _raylets:  # a node keeps its address: one call to the GCS per node
        node = next((n for n in ray.nodes() if n["NodeID"] == node_id and n["Alive"]), None)
        if node is None:
            return None
        _raylets[node_id] = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
    return _raylets[node_id]
