"""The bar of a real enrich(), as a console shows it: each phase in order, a rate counted from the
call's start, 100 % and closed at the end; and where the call stopped when it fails."""

from __future__ import annotations

import asyncio
import re
import time
import warnings

import pytest

from actorflow.operators import JobFailedError
from actorflow.spark_bridge import enrich, from_spark, last_job

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ROWS = 2_000


async def _tag(row):
    await asyncio.sleep(0.005)
    return {"tag": row["id"] * 2}


async def _fails_late(row):
    await asyncio.sleep(0.005)
    if row["id"] == 1_900:
        raise LookupError(f"no user {row['id']}")
    return {"tag": row["id"] * 2}


def _states(err: str) -> list[str]:
    """Each state the text bar showed, in order (tqdm redraws its line after a carriage return)."""
    return [line for line in err.replace("\n", "\r").split("\r") if " · " in line]


def test_enrich_shows_its_phases_and_ends_at_100_percent_with_the_rate_the_caller_saw(spark, capsys):
    df = spark.range(0, ROWS, 1, 4)
    started = time.perf_counter()
    out = enrich(df, _tag, capacity=8, parallelism=2, job_name="progress-bar")
    took = time.perf_counter() - started
    err = capsys.readouterr().err
    assert sorted(r.tag for r in out.collect()) == list(range(0, 2 * ROWS, 2))

    states = _states(err)
    assert list(dict.fromkeys(s.partition(":")[0] for s in states)) == [
        f"progress-bar · {phase}" for phase in ("snapshot", "deploy", "run", "collect", "output", "done")]
    end = re.fullmatch(r"progress-bar · done: 100%\|[^|]*\| 2000/2000 \[(\d\d):(\d\d)<00:00, ([\d.]+)rec/s\]",
                       states[-1])
    assert end, states[-1]
    assert err.endswith("rec/s]\n"), err[-200:]  # closed, and left on screen
    elapsed_s, rate = int(end[1]) * 60 + int(end[2]), float(end[3])
    # Counted from the call's start: the rows over what the caller waited, not over the run alone.
    assert int(took) - 1 <= elapsed_s <= took, (elapsed_s, took)
    # The bar's clock counts whole milliseconds (its start and its end each truncated); the rate is
    # shown to 2 decimals.
    assert ROWS / (took + 0.002) - 0.01 <= rate <= 1.05 * ROWS / took, (rate, ROWS / took)
    run_s = last_job().phases_s["run"]
    assert rate < 0.9 * ROWS / run_s, (rate, ROWS / run_s, last_job().phases_s)


def test_a_failing_enrich_leaves_the_bar_where_it_stopped(spark, capsys):
    with pytest.raises(JobFailedError, match="no user 1900"):
        enrich(spark.range(0, ROWS, 1, 4), _fails_late, capacity=8, parallelism=2, job_name="progress-fails")
    err = capsys.readouterr().err
    states = _states(err)
    assert [s.partition(":")[0] for s in states][-1] == "progress-fails · failed in run", states[-3:]
    stopped = re.fullmatch(r"progress-fails · failed in run: +\d+%\|[^|]*\| (\d+)/2000 \[.*\]", states[-1])
    assert stopped and int(stopped[1]) < ROWS, states[-1]
    assert err.endswith("]\n"), err[-200:]


def test_a_warning_of_to_spark_still_names_the_callers_line(spark):
    # The bar's wrapper is one more frame between the caller and to_spark(); the warnings skip it.
    untyped = from_spark(spark.range(0, 6, 1, 1), parallelism=1).map(lambda row: {**row, "segment": None})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        untyped.to_spark(progress=False)
    (warning,) = [w for w in caught if "were None (or empty) in every row" in str(w.message)]
    assert warning.filename == __file__, warning.filename
