"""Resuming a job at another parallelism: its keyed window state moves by key group to the new
instances, its in-flight records with it, and the output equals an uninterrupted run's."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from actorflow.cluster import from_arrow
from actorflow.cluster.checkpoints.storage import CheckpointError, CheckpointStorage
from actorflow.operators import JobFailedError
from actorflow.operators.windows import TumblingEventTimeWindows

pytestmark = pytest.mark.ray

N, USERS, BREAK_AT = 24_000, 50, 18_000


def _clicks() -> list[pa.Table]:
    table = pa.table({"click": list(range(N)), "user": [i % USERS for i in range(N)], "ts": [i * 10 for i in range(N)]})
    return [table.slice(i, 2_000) for i in range(0, N, 2_000)]


def _slow(row: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.0001)  # slow enough for checkpoints to land mid-stream
    return row


def _breaks_late(row: dict[str, Any]) -> dict[str, Any]:
    if row["click"] == BREAK_AT:
        raise RuntimeError(f"bad deploy at click {row['click']}")
    return _slow(row)


def _job(name: str, window_parallelism: int, fn: Any, source_parallelism: int = 2) -> Any:
    return (from_arrow(_clicks(), parallelism=source_parallelism, batch_size=200, timestamp_column="ts", job_name=name)
            .map(fn)
            .key_by("user", parallelism=window_parallelism)
            .window(TumblingEventTimeWindows.of(5_000))
            .count())


def _expected() -> Counter:
    return Counter((i % USERS, (i * 10) // 5_000 * 5_000) for i in range(N))


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1), (1, 4)])
def test_a_windowed_job_resumed_at_another_parallelism_equals_an_uninterrupted_run(ray_session, tmp_path, before, after):
    job = f"rescale-{before}-{after}"
    with pytest.raises(JobFailedError, match="bad deploy"):
        _job(job, before, _breaks_late).execute(progress=False, checkpoint_interval_ms=100,
                                                checkpoint_dir=str(tmp_path), max_restarts=0)
    storage = CheckpointStorage(str(tmp_path), job=job)
    latest = storage.latest()
    assert latest is not None, "the first run left no checkpoint to resume from"
    windows = [t for t in latest.tasks if t.startswith("window")]
    assert len(windows) == before, latest.tasks
    resumed = _job(job, after, _slow).execute(progress=False, resume_from=f"{tmp_path}/{job}")
    table = resumed.to_arrow()
    got = Counter({(r["user"], r["window_start"]): r["count"] for r in table.to_pylist()})
    assert got == _expected()
    assert table.num_rows == len(_expected())  # one firing per key and window: none lost, none twice
    assert len([f for f in resumed.figures if str(f.get("name", "")).startswith(f"{job}/window")]) == after


def test_a_resume_with_another_max_parallelism_is_refused_naming_both(ray_session, tmp_path):
    job = "rescale-max"
    with pytest.raises(JobFailedError, match="bad deploy"):
        _job(job, 2, _breaks_late).execute(progress=False, checkpoint_interval_ms=100, checkpoint_dir=str(tmp_path),
                                           max_restarts=0, max_parallelism=64)
    with pytest.raises(CheckpointError, match=r"written with max_parallelism=64, and this job has max_parallelism=128"):
        _job(job, 2, _slow).execute(progress=False, resume_from=f"{tmp_path}/{job}")
    # What reads the source keeps its parallelism: refused before any actor starts.
    with pytest.raises(CheckpointError, match=r"holds 'map' at parallelism 2, and this job runs it at 3: what reads "
                                              r"the source keeps its parallelism across a resume"):
        _job(job, 2, _slow, source_parallelism=3).execute(progress=False, resume_from=f"{tmp_path}/{job}",
                                                           max_parallelism=64)
    resumed = _job(job, 3, _slow).execute(progress=False, resume_from=f"{tmp_path}/{job}", max_parallelism=64)
    assert Counter({(r["user"], r["window_start"]): r["count"] for r in resumed.to_arrow().to_pylist()}) == _expected()


async def _lookup(values: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    await asyncio.sleep(0.002)
    return [[{**v, "score": v["click"] * 3 + 1}] for v in values]


async def _lookup_breaks_late(values: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    if any(v["click"] == BREAK_AT for v in values):
        raise RuntimeError(f"bad deploy at click {BREAK_AT}")
    return await _lookup(values)


def test_batched_enrichment_resumed_at_another_parallelism_gives_every_row_once(ray_session, tmp_path):
    job = "rescale-batches"

    def enrichment(parallelism: int, fn: Any) -> Any:
        return (from_arrow(_clicks(), parallelism=2, batch_size=200, job_name=job).map(_slow)
                .rebalance(parallelism)
                .async_map_batch(fn, batch_size=16, capacity=4))

    with pytest.raises(JobFailedError, match="bad deploy"):
        enrichment(2, _lookup_breaks_late).execute(progress=False, checkpoint_interval_ms=100,
                                                   checkpoint_dir=str(tmp_path), max_restarts=0)
    latest = CheckpointStorage(str(tmp_path), job=job).latest()
    assert latest is not None and len([t for t in latest.tasks if "async_map_batch[" in t]) == 2, latest
    table = enrichment(3, _lookup).execute(progress=False, resume_from=f"{tmp_path}/{job}").to_arrow()
    assert sorted(zip(table.column("click").to_pylist(), table.column("score").to_pylist())) == [
        (i, i * 3 + 1) for i in range(N)]
