"""A job's actors start in worker processes that Ray prestarted when the job before it ended,
whatever Ray tasks ran in between."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest
from ray.util.state import list_actors, list_workers

from actorflow.cluster import from_arrow, warm_workers
from tests.waiting import Background, find_actor, poll

pytestmark = pytest.mark.ray


async def _same(value):
    return [value]


def _run(job_name, **settings):
    table = pa.table({"user": list(range(200))})
    return from_arrow([table.slice(0, 100), table.slice(100)], parallelism=2, job_name=job_name).async_map(
        _same, name="echo").execute(progress=False, **settings)


def _gcs():
    """This session's Ray: the state API would look for one and fail where others run beside it."""
    import ray

    return ray.get_runtime_context().gcs_address


def _worker_pids():
    """Pids of live Python worker processes."""
    workers = list_workers(address=_gcs(), filters=[("worker_type", "=", "WORKER"), ("is_alive", "=", True)], detail=True,
                           limit=10_000)
    return {w.pid for w in workers}


def _idle_worker_pids():
    """Pids of live Python worker processes that host no live actor (idle, or kept by Ray for tasks)."""
    return _worker_pids() - set(_hosts())


def _hosts():
    """The live actors' names by the pid of their process."""
    return {a.pid: a.name for a in list_actors(address=_gcs(), filters=[("state", "=", "ALIVE")], detail=True, limit=10_000)}


def _actors(job, attempt=""):
    """The job's two ``echo`` instances (of ``attempt``, "@1" say, after a restart)."""
    # By name: an unfiltered listing stops at 100 actors, and a long test session has more.
    return [a for i in range(2) for a in list_actors(address=_gcs(), filters=[("name", "=", f"{job}/echo[{i}/2]{attempt}")], detail=True)]


def _ray_tasks():
    """Ray tasks of this driver, as a user's own code or actorflow's blocking calls run them."""
    import ray

    @ray.remote(num_cpus=0.01)
    def nap(i):
        time.sleep(0.05)
        return i

    # More at once than there are prestarted workers to take; each one beyond starts a process.
    assert ray.get([nap.remote(i) for i in range(4)]) == list(range(4))


def _waiting(job, *, for_actors):
    """Idle or starting workers of ``job``: of the actors' runtime environment, or for the driver's tasks."""
    return sum(warm_workers._actor_workers(job)) if for_actors else warm_workers._idle_task_workers(job)


def _kill_idle_workers(job, *, for_actors):
    """End the idle workers of ``job`` for actorflow's actors, or for the driver's tasks, as Ray
    ends its surplus; return once none is left."""
    import psutil

    import ray

    from actorflow.actors.upstream.ray import raylet_pid

    killed = set()
    raylet = str(raylet_pid(ray.get_runtime_context().get_node_id()))  # this session's Ray, no other
    for process in psutil.process_iter(["cmdline", "environ"]):
        cmdline, env = process.info["cmdline"], process.info["environ"]
        if cmdline and env and cmdline[0].startswith("ray::IDLE") and env.get("RAY_JOB_ID") == job \
                and env.get("RAY_RAYLET_PID") == raylet and (env.get("ACTORFLOW_PROCESS") == "actor") == for_actors:
            process.kill()
            killed.add(process.pid)
    poll(lambda: _waiting(job, for_actors=for_actors) == 0 or None, timeout_s=30)
    # Until the raylet has seen them die, it may still hand one of them to the next actor.
    poll(lambda: not killed & _worker_pids() or None, timeout_s=30)


def _workers_up(job, count, *, for_actors, fresh=0):
    """At least ``count`` idle workers of the kind (``fresh`` of them never ran a task), and none
    of the job still starting: they count as waiting from their start, and Ray lists them only
    once they are up."""
    enough = _waiting(job, for_actors=for_actors) >= count and warm_workers._actor_workers(job)[0] >= fresh
    return (enough and not warm_workers._starting_workers(job)) or None


@pytest.mark.parametrize("between", ["nothing", "ray-tasks"])
def test_the_next_jobs_actors_start_in_processes_prestarted_when_a_job_ended(ray_session, between):
    import ray

    job = ray.get_runtime_context().get_job_id()
    _kill_idle_workers(job, for_actors=True)  # as in a new driver: none waits for an actor yet
    first = _run(f"warm-first-{between}")
    assert first.output_rows == 200
    # Ray starts the processes in the background: wait until both are up, idle.
    poll(lambda: _workers_up(job, 2, for_actors=True, fresh=2), timeout_s=60)
    idle = _idle_worker_pids()
    if between == "ray-tasks":
        # Tasks take any idle worker whose runtime environment matches theirs: not the actors'.
        _ray_tasks()

    second = _run(f"warm-second-{between}")

    assert second.output_rows == 200
    actors = _actors(f"warm-second-{between}")
    assert len(actors) == 2
    # Each actor ran in a process that existed, idle, before its job began: none waited for a new one.
    assert {a.pid for a in actors} <= idle, ({a.name: a.pid for a in actors}, idle)


def test_after_a_job_with_checkpoints_the_next_ones_coordinator_and_actors_all_find_processes(ray_session, tmp_path):
    import ray

    job = ray.get_runtime_context().get_job_id()
    _kill_idle_workers(job, for_actors=True)  # none left by the tests before, near its keep-alive's end

    def run(name):
        return _run(name, checkpoint_interval_ms=60_000, checkpoint_dir=str(tmp_path))

    first = run("warm-checkpointed-first")
    assert first.actor_processes == 3  # two instances and the checkpoint coordinator
    poll(lambda: _workers_up(job, 3, for_actors=True, fresh=3), timeout_s=60)
    idle = _idle_worker_pids()

    assert run("warm-checkpointed-second").output_rows == 200

    coordinator = list_actors(address=_gcs(), filters=[("name", "=", "warm-checkpointed-second/checkpoint_coordinator[0/1]")], detail=True)
    pids = {a.pid for a in _actors("warm-checkpointed-second") + coordinator}
    assert len(pids) == 3 and pids <= idle, (pids, idle)


def test_a_blocking_jobs_task_workers_serve_the_next_job_instead_of_new_processes(ray_session):
    # A local Ray keeps a worker that ran a task for a while after (ensure_ray): the next job's
    # blocking calls take it, and the prestart counts it rather than starting one more. Ray
    # starts no actor in it, so the next job's actors still find fresh ones.
    import ray

    job = ray.get_runtime_context().get_job_id()
    _kill_idle_workers(job, for_actors=True)  # none left by the tests before, near its keep-alive's end
    table = pa.table({"user": list(range(200))})

    def run(name):
        stream = from_arrow([table.slice(0, 100), table.slice(100)], parallelism=2, job_name=name).async_map(
            lambda row: [row], name="blocking", capacity=4, max_tasks=2, parallelism=2)
        assert stream.execute(progress=False).output_rows == 200

    run("warm-blocking-first")
    poll(lambda: _workers_up(job, 2 + 2 * 2, for_actors=True, fresh=2), timeout_s=120)
    before = _worker_pids()

    run("warm-blocking-second")
    poll(lambda: _workers_up(job, 2 + 2 * 2, for_actors=True, fresh=2), timeout_s=120)
    # The second job's actors took two of the waiting processes; the prestart replaced only those.
    new = _worker_pids() - before
    assert len(new) <= 2, {pid: _hosts().get(pid, "no actor") for pid in new}

    idle = _idle_worker_pids()
    assert _run("warm-after-blocking").output_rows == 200
    actors = _actors("warm-after-blocking")
    assert len(actors) == 2 and {a.pid for a in actors} <= idle, ({a.name: a.pid for a in actors}, idle)


def test_a_restarted_attempts_actors_start_in_standby_processes_of_the_job(ray_session, tmp_path):
    # Once an attempt of a job with checkpoints has run for a few seconds (STANDBY_AFTER_S), as many
    # workers as it has actors wait for a restart: the new attempt's actors need not wait for new
    # processes.
    import ray

    job = ray.get_runtime_context().get_job_id()
    _kill_idle_workers(job, for_actors=True)  # none left by the tests before, near its keep-alive's end
    name = "warm-standby"
    gate = tmp_path / "open"

    async def held(row):
        while not gate.exists():  # every record waits until the test has seen the restart
            await asyncio.sleep(0.01)
        return [row]

    table = pa.table({"user": list(range(200))})
    stream = from_arrow([table.slice(0, 100), table.slice(100)], parallelism=2, job_name=name).async_map(
        held, name="echo")
    run = Background(lambda: stream.execute(progress=False, checkpoint_interval_ms=60_000, checkpoint_dir=str(tmp_path)))
    instances = [poll(lambda i=i: find_actor(f"{name}/echo[{i}/2]"), timeout_s=60) for i in range(2)]
    # Both instances up, not just the first: an instance still waiting for its process would take
    # one of the standby ones below, and a kill then would come during the first attempt's start.
    ray.get([actor.__ray_ready__.remote() for actor in instances])
    first = instances[0]
    # The coordinator and both instances took the workers that waited; two more come up for a restart.
    poll(lambda: _workers_up(job, 2, for_actors=True, fresh=2), timeout_s=120)
    before = _worker_pids()

    ray.kill(first, no_restart=True)
    restarted = [poll(lambda i=i: find_actor(f"{name}/echo[{i}/2]@1"), timeout_s=60) for i in range(2)]
    ray.get([actor.__ray_ready__.remote() for actor in restarted])
    gate.touch()
    run.join(120)
    assert run.error is None, run.error
    result = run.result

    assert result.restarts == 1 and result.output_rows == 200
    assert len(result.recoveries_s) == 1
    pids = {a.pid for a in _actors(name, "@1")}
    # Each in a process that was up before the failure: none waited for a new one.
    assert len(pids) == 2 and pids <= before, (pids, before)


def test_a_new_worker_has_imported_what_the_actors_need_before_a_job_uses_it(ray_session):
    import ray

    # Defined here, so that Ray ships it by value and the worker imports no test module for it.
    @ray.remote
    class Probe:
        def imported(self):
            import gc
            import sys

            modules = ("pandas", "actorflow.actors.operator_actor", "actorflow.operators.windows", "pyarrow.acero", "ray._common.pydantic_compat")
            # Then it freezes what they built, so an actor's collection does not walk it again.
            return [m for m in modules if m in sys.modules], gc.get_freeze_count() > 10_000

    probe = Probe.remote()
    everything = ["pandas", "actorflow.actors.operator_actor", "actorflow.operators.windows", "pyarrow.acero", "ray._common.pydantic_compat"]
    try:
        # The worker imports them in a thread of its own as it starts: soon, not necessarily yet.
        poll(lambda: ray.get(probe.imported.remote()) == (everything, True) or None, timeout_s=30)
    finally:
        ray.kill(probe)


def test_the_drivers_own_tasks_find_processes_prestarted_for_them_and_no_more_pile_up(ray_session):
    # A DataFrame's snapshot and the output's conversion are Ray tasks of the driver, two at once.
    import os

    import ray

    job = ray.get_runtime_context().get_job_id()
    warm_workers.prestart_task_workers(2, settle_s=0).join()
    poll(lambda: _workers_up(job, 2, for_actors=False), timeout_s=60)
    waiting = _waiting(job, for_actors=False)
    idle = _idle_worker_pids()

    # Asked again while they wait: nothing more starts.
    warm_workers.prestart_task_workers(2, settle_s=0).join()
    time.sleep(3)
    assert _waiting(job, for_actors=False) <= waiting

    @ray.remote(num_cpus=0)
    def pid():
        time.sleep(0.5)  # both at once: neither can take the other's process after it
        return os.getpid()

    assert set(ray.get([pid.remote() for _ in range(2)])) <= idle


def test_a_job_without_spark_tops_up_the_drivers_task_workers_once_it_has_used_them(ray_session):
    # A job whose blocking calls start many processes takes the node over Ray's soft limit, and
    # Ray ends idle workers that ran a task: the driver's snapshot tasks would then start cold.
    import ray

    job = ray.get_runtime_context().get_job_id()
    warm_workers.prestart_task_workers(2, settle_s=0).join()  # as a Spark session asks
    poll(lambda: _workers_up(job, 2, for_actors=False), timeout_s=60)
    _kill_idle_workers(job, for_actors=False)

    assert _run("warm-tasks-after-execute").output_rows == 200

    poll(lambda: _waiting(job, for_actors=False) >= 2 or None, timeout_s=60)


def test_a_request_for_more_workers_than_start_at_once_gets_them_all(ray_session):
    # The raylet starts as many at once as it has CPUs and drops the rest of a request: the
    # chunks after the first wait for the processes of the one before, however slow they are.
    import ray

    assert _run("warm-many-learn").output_rows == 200  # the actors' environment, as a job learns it
    job = ray.get_runtime_context().get_job_id()
    poll(lambda: warm_workers._starting_workers(job) == 0 or None, timeout_s=60)
    _kill_idle_workers(job, for_actors=True)
    wanted = 3 * warm_workers._startup_concurrency()

    assert warm_workers.prestart_workers(wanted, settle_s=0) is not None

    poll(lambda: _workers_up(job, wanted, for_actors=True, fresh=wanted), timeout_s=120)


def test_a_worker_near_the_end_of_its_keep_alive_counts_for_nothing_and_is_replaced(ray_session, monkeypatch):
    # Ray ends a prestarted worker whose keep-alive is over once the node is past its soft limit,
    # perhaps just as the next job comes for it: one with less than LIFE_LEFT_S to live is not
    # counted, and the top-up starts another in its place.
    import ray

    job = ray.get_runtime_context().get_job_id()
    assert _run("warm-aging").output_rows == 200
    poll(lambda: _workers_up(job, 2, for_actors=True, fresh=2), timeout_s=60)
    warm_workers.end_top_ups()  # the job's own would count again under the clock below
    old = _idle_worker_pids()
    # From here on, warm_workers' clock reads every process started until now as near its end.
    now = time.time()
    monkeypatch.setattr(warm_workers, "time", SimpleNamespace(
        time=lambda: now + warm_workers.KEEP_ALIVE_S - warm_workers.LIFE_LEFT_S, sleep=time.sleep,
        monotonic=time.monotonic))

    assert _waiting(job, for_actors=True) == 0 and old <= _idle_worker_pids()  # still there, not counted

    assert warm_workers.prestart_workers(2, settle_s=0) is not None
    poll(lambda: _workers_up(job, 2, for_actors=True, fresh=2), timeout_s=60)
    assert len(_idle_worker_pids() - old) >= 2


def test_a_mark_of_a_dead_task_worker_does_not_pass_a_new_process_with_its_pid_for_used(tmp_path, monkeypatch):
    # Pids wrap around (at 32,768 here, threads included): a worker that ran blocking calls and
    # died leaves a mark that a new worker with the same pid must not inherit.
    import os

    import psutil

    from actorflow.actors import task_function

    monkeypatch.setattr(task_function, "task_workers_dir", lambda: tmp_path)
    this = task_function.worker_mark(os.getpid(), psutil.Process().create_time())
    dead_with_this_pid = task_function.worker_mark(os.getpid(), psutil.Process().create_time() - 3600)
    (tmp_path / dead_with_this_pid).touch()
    (tmp_path / str(os.getpid())).touch()  # a mark of the pid alone, as an older version left

    assert not task_function.ran_tasks(this)
    task_function._mark_task_worker()
    assert task_function.ran_tasks(this)

    warm_workers._forget_gone_task_workers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [this]


def test_a_request_that_started_nothing_is_asked_again_while_workers_are_missing(ray_session, monkeypatch):
    # The raylet may accept a request and start nothing (it drops a start while as many others
    # are starting as it starts at once): the top-up asks again, a bounded number of times, and
    # stops as soon as nothing is missing.
    monkeypatch.setattr(warm_workers, "RETRY_PAUSE_S", 0.01)
    asked = []

    def top_up(still_missing):
        counts = iter(still_missing)
        asked.clear()
        warm_workers._top_up_in_thread("test top-up", lambda: next(counts), 0.0, asked.append).join(10)
        return list(asked)

    # Dropped twice, then the third request's processes are there.
    assert top_up([2, 2, 2, 0]) == [2, 2, 2]
    # Up after the settle round: no more requests.
    assert top_up([2, 0, 5]) == [2]
    # Nothing missing at first, nor once Ray has settled: nothing asked.
    assert top_up([0, 0, 5]) == []
    # Never there: the two rounds and RETRY_ROUNDS more, then it gives up.
    assert top_up([2] * 10) == [2] * (2 + warm_workers.RETRY_ROUNDS)


def test_a_job_that_starts_ends_the_top_ups_of_the_jobs_before_it(ray_session, monkeypatch):
    # A top-up that went on while the next job ran would count the workers that job took as
    # missing, and start more: one or two processes too many for each job run back to back.
    monkeypatch.setattr(warm_workers, "RETRY_PAUSE_S", 0.3)
    asked = []
    counted = threading.Event()

    def missing():
        counted.set()
        return 2  # never there: the top-up would ask in each of its rounds

    thread = warm_workers._top_up_in_thread("test top-up", missing, 0.3, asked.append)
    assert counted.wait(5)
    warm_workers.end_top_ups()  # as run_job does first
    thread.join(10)
    assert asked == [2]  # its first round only

    # A newer top-up of the same kind ends the older one too, and goes on itself.
    first_round = threading.Event()

    def ask_older(n):
        asked.append(n)
        first_round.set()

    older = warm_workers._top_up_in_thread("test top-up", missing, 0.3, ask_older)
    assert first_round.wait(5)
    newer = warm_workers._top_up_in_thread("test top-up", missing, 0.3, lambda n: asked.append(-n))
    older.join(10)
    newer.join(10)
    assert asked.count(2) == 2 and asked.count(-2) == 2 + warm_workers.RETRY_ROUNDS, asked
