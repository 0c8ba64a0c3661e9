"""A job's progress: samples of records done and requests in flight over its run, bar or no bar,
and how far event time got by its end."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from actorflow.cluster import from_arrow
from actorflow.operators.windows import TumblingEventTimeWindows

pytestmark = pytest.mark.ray

ROWS = 400
CAPACITY = 4


async def _slow(row):
    await asyncio.sleep(0.02)
    return [row]


def test_progress_is_sampled_without_a_bar_and_ends_with_every_record(ray_session):
    # 400 calls of 20 ms, 4 at a time: about 2 s of work, so several samples fall inside it.
    result = (
        from_arrow([pa.table({"user": list(range(ROWS))})], parallelism=1, job_name="progress-samples")
        .async_map(_slow, capacity=CAPACITY, timeout_ms=10_000)
        .execute(progress=False)
    )
    samples = result.progress_samples
    assert len(samples) >= 3, samples
    times = [t for t, _, _ in samples]
    done = [d for _, d, _ in samples]
    assert times == sorted(times) and 0 < times[0] and times[-1] <= result.elapsed_s
    # Polled at most every 0.5 s; only the closing sample may follow sooner.
    assert all(b - a >= 0.49 for a, b in zip(times[:-2], times[1:-1])), times
    assert done == sorted(done) and all(0 <= d <= ROWS for d in done)
    assert samples[-1][1:] == (ROWS, 0)
    during = [(d, f) for _, d, f in samples[:-1] if 0 < d < ROWS]
    assert during, samples  # some sample caught the job half-way
    assert all(1 <= f <= CAPACITY for _, f in during), during
    # Where the time went: the run holds the 2 s of calls, and the phases add up to the whole.
    phases = result.phases_s
    assert list(phases) == ["deploy", "run", "collect"], phases
    assert all(s > 0 for s in phases.values()), phases
    assert phases["run"] >= ROWS / CAPACITY * 0.02, phases
    assert sum(phases.values()) <= result.elapsed_s, (phases, result.elapsed_s)


def test_the_figures_keep_the_last_watermark_after_the_end_of_input_ended_event_time(ray_session):
    # Event time 0..1,999 ms, 100 ms out of order: the last watermark before the end is
    # 1,999 - 100 - 1. The end of input then ends event time, and the current watermark with it.
    table = pa.table({"k": ["a", "b"] * 1_000, "ts": list(range(2_000))})
    result = (
        from_arrow([table], timestamp_column="ts", out_of_orderness_ms=100, parallelism=1, batch_size=500,
                   job_name="last-watermark")
        .key_by("k").window(TumblingEventTimeWindows.of(1_000)).count()
        .execute(progress=False)
    )
    window = {f["name"]: f for f in result.figures}["last-watermark/window[0/1]"]
    assert (window["watermark_ms"], window["last_watermark_ms"]) == (None, 1_898)
