"""A job's actors start in worker processes that Ray prestarted when the job before it ended."""

from __future__ import annotations

import pyarrow as pa
import pytest
from ray.util.state import list_actors, list_workers

from cluster import from_arrow
from tests.ring2.waiting import poll

pytestmark = pytest.mark.ray


async def _same(value):
    return [value]


def _run(job_name):
    table = pa.table({"user": list(range(200))})
    return from_arrow([table.slice(0, 100), table.slice(100)], parallelism=2, job_name=job_name).async_map(
        _same, name="echo").execute(progress=False)


def _idle_worker_pids():
    """Pids of live Python worker processes that host no live actor."""
    workers = list_workers(filters=[("worker_type", "=", "WORKER"), ("is_alive", "=", True)], detail=True,
                           raise_on_missing_output=False)
    hosts = {a.pid for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True, raise_on_missing_output=False)}
    return {w.pid for w in workers} - hosts


def test_the_next_jobs_actors_start_in_processes_prestarted_when_a_job_ended(ray_session):
    first = _run("warm-first")
    assert first.output_rows == 200
    # Ray starts the processes in the background; wait until both are up and idle.
    idle = poll(lambda: (lambda pids: pids if len(pids) >= 2 else None)(_idle_worker_pids()), timeout_s=60)

    second = _run("warm-second")

    assert second.output_rows == 200
    actors = [a for a in list_actors(detail=True, raise_on_missing_output=False)
              if a.name.startswith("warm-second/echo[")]
    assert len(actors) == 2
    # Each actor ran in a process that existed, idle, before its job began: none waited for a new one.
    assert {a.pid for a in actors} <= idle, ({a.name: a.pid for a in actors}, idle)
