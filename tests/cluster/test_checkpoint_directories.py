"""What a job does with the checkpoint directory of its name: a fresh run never deletes the
checkpoints an earlier run could be resumed from unless told to (``overwrite=True``), and
checkpoints no one asked to keep (in the temporary directory by default) go when the job ends well."""

from __future__ import annotations

import asyncio
import importlib
import tempfile
import time
from typing import Any

import pyarrow as pa
import pytest

from actorflow.cluster import from_arrow
from actorflow.cluster.checkpoints.storage import CheckpointError, CheckpointStorage, UnfinishedRunError
from actorflow.operators import ConfigurationError, JobFailedError

pytestmark = pytest.mark.ray

N = 3_000


async def _tag(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.002)
    return [{**row, "tag": row["user"] * 2}]


async def _breaks_late(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.002)
    if row["user"] >= 2_000:
        raise RuntimeError(f"bad deploy at user {row['user']}")
    return [{**row, "tag": row["user"] * 2}]


def _stream(job: str | None, fn: Any = _tag) -> Any:
    table = pa.table({"user": list(range(N))})
    return from_arrow([table.slice(i, 500) for i in range(0, N, 500)], parallelism=1, batch_size=50,
                      job_name=job).async_map(fn, capacity=4, name="tag")


def _failed_run(job: str, directory: str) -> None:
    with pytest.raises(JobFailedError, match="bad deploy"):
        _stream(job, _breaks_late).execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=directory)


def test_a_fresh_run_refuses_to_delete_the_checkpoints_of_a_run_that_failed(ray_session, tmp_path):
    _failed_run("crashed", str(tmp_path))
    left = sorted((p.parent.name for p in (tmp_path / "crashed").glob("chk-*/_metadata")), key=lambda n: int(n[4:]))
    assert left, "the failed run left no complete checkpoint"

    with pytest.raises(CheckpointError) as refused:
        _stream("crashed").execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=str(tmp_path))

    where = f"{tmp_path}/crashed"
    assert isinstance(refused.value, UnfinishedRunError)
    assert str(refused.value) == (
        f"job 'crashed' has the checkpoints of an earlier run that did not finish in {where!r} (the latest complete "
        f"one: {left[-1]}); go on from it with resume_from={where!r}, or delete them and start afresh with "
        "overwrite=True")
    assert sorted((p.parent.name for p in (tmp_path / "crashed").glob("chk-*/_metadata")), key=lambda n: int(n[4:])) == left
    # The hint works as given.
    resumed = _stream(None).execute(progress=False, resume_from=where)
    assert sorted(resumed.to_arrow().column("user").to_pylist()) == list(range(N))


def test_overwrite_deletes_the_checkpoints_of_a_run_that_failed_and_starts_afresh(ray_session, tmp_path):
    _failed_run("overwritten", str(tmp_path))
    earlier = CheckpointStorage(str(tmp_path), job="overwritten")
    assert earlier.unfinished_run() is not None, "the failed run left no complete checkpoint"
    started_ms = time.time() * 1000

    result = _stream("overwritten").execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=str(tmp_path),
                                            overwrite=True)

    assert sorted(result.to_arrow().column("user").to_pylist()) == list(range(N))
    # A fresh run: its ids start at 1 (a resumed one goes on above the earlier run's), and every
    # checkpoint left is its own, finished.
    assert min(result.checkpoints["completed"]) == 1, result.checkpoints["completed"]
    after = CheckpointStorage(str(tmp_path), job="overwritten")
    assert after.unfinished_run() is None and after.checkpoint_ids()
    assert all(after.get(i).metadata["completed_at_ms"] >= started_ms for i in after.checkpoint_ids())


def test_overwrite_and_resume_from_are_refused_together(ray_session, tmp_path):
    _failed_run("either", str(tmp_path))
    where = f"{tmp_path}/either"
    with pytest.raises(ConfigurationError) as refused:
        _stream(None).execute(progress=False, resume_from=where, overwrite=True)
    assert str(refused.value) == (
        f"overwrite=True deletes an earlier run's checkpoints to start afresh, and resume_from={where!r} goes on from "
        "them; pass one or the other")
    assert CheckpointStorage(str(tmp_path), job="either").unfinished_run() is not None  # nothing was deleted


def test_a_fresh_run_starts_over_the_checkpoints_of_a_run_that_ended_well(ray_session, tmp_path):
    first = _stream("twice").execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=str(tmp_path))
    assert first.checkpoints["completed"], "the first run took no checkpoint"
    assert list((tmp_path / "twice").glob("chk-*/_metadata"))  # kept: the place was named

    second = _stream("twice").execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=str(tmp_path))
    assert second.output_rows == N and min(second.checkpoints["completed"]) == 1


def test_resume_from_the_checkpoint_root_names_the_job_directory(ray_session, tmp_path):
    _failed_run("rooted", str(tmp_path))
    with pytest.raises(ConfigurationError) as refused:
        _stream(None).execute(progress=False, resume_from=str(tmp_path))
    assert str(refused.value) == (
        f"resume_from={str(tmp_path)!r} is a checkpoint directory of the jobs ['rooted'], not one job's; pass the "
        f"directory of the job to resume, such as resume_from={str(tmp_path / 'rooted')!r}")


@pytest.fixture
def temporary_directory(tmp_path, monkeypatch):
    """The temporary directory, where checkpoints go when no one names a place, made the test's own."""
    monkeypatch.delenv("ACTORFLOW_CHECKPOINT_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_checkpoints_in_the_temporary_directory_go_when_the_job_ends_well(ray_session, temporary_directory):
    result = _stream(None).execute(progress=False, checkpoint_interval_ms=100)
    assert result.checkpoints["completed"], "the run took no checkpoint"
    assert result.output_rows == N
    assert list((temporary_directory / "actorflow-checkpoints").iterdir()) == []


def test_checkpoints_in_the_temporary_directory_stay_when_the_job_fails(ray_session, temporary_directory):
    with pytest.raises(JobFailedError, match="bad deploy"):
        _stream(None, _breaks_late).execute(progress=False, checkpoint_interval_ms=100)
    (job,) = (temporary_directory / "actorflow-checkpoints").iterdir()
    assert job.name.startswith("job-") and list(job.glob("chk-*/_metadata"))


def test_enrichs_automatic_checkpoints_go_when_the_job_ends_well(spark, temporary_directory, monkeypatch):
    from actorflow.spark_bridge.streams import last_job

    enrich_module = importlib.import_module("actorflow.spark_bridge.enrich")  # the package's `enrich` is the function

    # A long job as enrich() sees it: any row count; a checkpoint every 100 ms.
    monkeypatch.setattr(enrich_module, "AUTO_CHECKPOINT_ROWS", 1)
    monkeypatch.setattr(enrich_module, "AUTO_CHECKPOINT_INTERVAL_MS", 100)

    async def tag(row: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.002)
        return {"tag": row["id"] * 2}

    out = enrich_module.enrich(spark.range(0, 2 * N, 1, 6), tag, capacity=4, parallelism=1, progress=False)
    assert out.count() == 2 * N
    assert last_job().checkpoints["completed"], "enrich() took no checkpoint of its own"
    assert list((temporary_directory / "actorflow-checkpoints").iterdir()) == []


def test_enrich_overwrites_the_checkpoints_of_a_run_that_did_not_finish_when_told_to(spark, tmp_path):
    from actorflow.spark_bridge import enrich
    from actorflow.spark_bridge.streams import last_job

    async def tag(row: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        return {"tag": row["id"] * 2}

    _failed_run("clicks", str(tmp_path))
    options = dict(capacity=4, parallelism=1, progress=False, job_name="clicks", checkpoint_interval_ms=100,
                   checkpoint_dir=str(tmp_path))
    with pytest.raises(UnfinishedRunError, match=r"or delete them and start afresh with overwrite=True$"):
        enrich(spark.range(0, N, 1, 3), tag, **options)

    started_ms = time.time() * 1000
    out = enrich(spark.range(0, N, 1, 3), tag, overwrite=True, **options)
    assert sorted(r.tag for r in out.collect()) == list(range(0, 2 * N, 2))
    assert last_job().restarts == 0
    after = CheckpointStorage(str(tmp_path), job="clicks")  # the earlier run's checkpoints are gone
    assert after.unfinished_run() is None
    assert all(after.get(i).metadata["completed_at_ms"] >= started_ms for i in after.checkpoint_ids())
    # Refused before any Spark or Ray work: the two ask for opposite things.
    with pytest.raises(ConfigurationError, match=r"^overwrite=True deletes an earlier run's checkpoints"):
        enrich(spark.range(0, N, 1, 3), tag, overwrite=True, resume_from=f"{tmp_path}/clicks")
