"""A Structured Streaming query through one long-running job: Parquet files arrive as micro-batches,
go through async enrichment (retries, a timeout fallback, dead letters) and keyed event-time
windows, and the Parquet output equals the same files processed as one bounded DataFrame."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from pyspark.sql import DataFrame

import actorflow as af
from actorflow.operators.errors import ConfigurationError, JobFailedError, SchemaError
from actorflow.operators.windows import (
    Aggregations,
    Count,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
)
from actorflow.cluster.chaos import live_instances
from actorflow.spark_bridge import from_spark
from tests.waiting import poll

pytestmark = [pytest.mark.spark, pytest.mark.ray]

BASE_US = 1_760_000_000_000_000
STEP_US = 100_000  # an event every 100 ms of event time
OUT_OF_ORDERNESS_MS = 5_000
SCHEMA = "id long, user long, amount long, ts timestamp"
HANGS = 4_999  # every HANGS-th event's request hangs until its timeout


def write_event_files(directory: str, events: int, files: int, *, seed: int = 3) -> list[int]:
    """``events`` clicks in ``files`` Parquet files, in time order but shuffled within runs of 20
    (at most 2 s apart, within the out-of-orderness bound), each file newer than the last (the
    file source reads them in that order). Every 5,000th click from the 20,000th on is dated an
    hour back: late for any window, in any run. Returns the ids of the late clicks."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    ids = list(range(events))
    for start in range(0, events, 20):
        run = ids[start:start + 20]
        rng.shuffle(run)
        ids[start:start + 20] = run
    late = [i for i in range(20_000, events, 5_000)]
    times = {i: BASE_US + i * STEP_US - (3_600_000_000 if i in set(late) else 0) for i in ids}
    per_file = events // files
    mtime = 1_700_000_000
    for k in range(files):
        chunk = ids[k * per_file:(k + 1) * per_file] if k < files - 1 else ids[k * per_file:]
        table = pa.table({
            "id": pa.array(chunk, pa.int64()),
            "user": pa.array([i % 61 for i in chunk], pa.int64()),
            "amount": pa.array([i % 100 for i in chunk], pa.int64()),
            "ts": pa.array([times[i] for i in chunk], pa.timestamp("us", tz="UTC")),
        })
        path = os.path.join(directory, f"events-{k:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (mtime + k, mtime + k))
    return late


class Enrich:
    """Deterministic per event: every 17th fails its first attempt (a retry succeeds), every
    1,009th always fails (a dead letter after its retries), every 4,999th hangs (the timeout's
    fallback answers for it). The timeout, a second, is long enough that no other event meets it
    on a busy machine; few hang, as each holds the watermarks behind it back for that second."""

    def __init__(self) -> None:
        self.failed_once: set[int] = set()

    async def __call__(self, row):
        i = row["id"]
        if i % 1_009 == 0:
            raise LookupError(f"no event {i}")
        if i % 17 == 0 and i not in self.failed_once:
            self.failed_once.add(i)
            raise ConnectionError(f"event {i}: try again")
        if i % HANGS == 0:
            await asyncio.sleep(30)
        await asyncio.sleep(0)
        return [{**row, "fell_back": 0}]


def _fallback(row):
    return [{**row, "fell_back": 1}]


def _pipeline(stream, window, parallelism=None):
    return (stream
            .async_map(Enrich(), ordered=False, capacity=200, timeout_ms=1_000, fallback=_fallback,
                       retry=af.retry.FixedDelay(3, 10), on_error="dead_letter")
            .key_by("user", parallelism=parallelism)
            .window(window)
            .allowed_lateness(2_000)
            .side_output_late_data("late")
            .aggregate(Aggregations(n=Count(), total=Sum("amount"), fallbacks=Sum("fell_back"))))


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("user", "window_start", "window_end", "n", "total", "fallbacks").collect())


WINDOWS = {
    "tumbling": TumblingEventTimeWindows.of(60_000),
    "sliding": SlidingEventTimeWindows.of(size_ms=120_000, slide_ms=60_000),
    "sessions": EventTimeSessionWindows.with_gap(30_000),
}


# Tumbling windows over 200,000 events; sliding windows and sessions, the same pipeline, over fewer.
SIZES = {"tumbling": 200_000, "sliding": 40_000, "sessions": 40_000}


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "sessions"])
def test_a_file_stream_through_enrichment_and_windows_equals_the_bounded_run(spark, tmp_path, kind):
    directory, window, n = str(tmp_path / "in"), WINDOWS[kind], SIZES[kind]
    late = write_event_files(directory, n, 20)
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
    query = _pipeline(from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2),
                      window).write_stream(str(tmp_path / "out"), checkpoint_location=str(tmp_path / "chk"))
    query.process_all_available()
    progress = [p for p in query.recent_progress if not p["between_epochs"]]
    query.stop(drain=True)
    assert not query.is_active and query.exception() is None
    # One job for the query's life: each file was one micro-batch, one epoch and its checkpoint.
    assert [p["epoch"] for p in progress] == list(range(20))
    assert [p["checkpoint_id"] for p in progress] == sorted({p["checkpoint_id"] for p in progress})
    assert sum(p["rows_in"] for p in progress) == n and not any(p["restarts"] for p in progress)

    ours = _rows(spark.read.parquet(str(tmp_path / "out")))
    # The same files as one DataFrame, in the order the stream read them (spark.read.parquet of the
    # directory would pack the files into partitions by size).
    files = [spark.read.schema(SCHEMA).parquet(os.path.join(directory, name)) for name in sorted(os.listdir(directory))]
    bounded = _pipeline(from_spark(functools.reduce(DataFrame.union, files), timestamp_column="ts",
                                   out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2), window)
    theirs = _rows(bounded.to_spark(dead_letters=True, progress=False)[0])
    assert ours == theirs
    fallbacks = len([i for i in range(0, n, HANGS) if i % 1_009 and i not in late])
    assert sum(r[5] for r in ours) == fallbacks * (2 if kind == "sliding" else 1)  # a sliding window counts twice

    # The records that failed and those that came late: the same as the bounded run's, each named.
    assert sorted(r.id for r in query.dead_letters().collect()) == list(range(0, n, 1_009))
    late_seen = query.side_output("late").collect()
    assert sorted(r.id for r in late_seen) == [i for i in late if i % 1_009]
    assert {r.late_reason for r in late_seen} == {"past_allowed_lateness"}


def test_the_parquet_output_is_read_by_spark_as_files_and_as_a_stream_and_only_published_epochs_show(spark, tmp_path):
    directory = str(tmp_path / "in")
    write_event_files(directory, 6_000, 3)
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)

    async def tag(row):
        return [{"id": row["id"], "ts": row["ts"], "tag": f"t{row['id']}"}]

    out = str(tmp_path / "out")
    query = from_spark(events, timestamp_column="ts").async_map(tag).write_stream(out, checkpoint_location=str(tmp_path / "chk"))
    query.process_all_available()
    query.stop()
    assert sorted(r.id for r in spark.read.parquet(out).collect()) == list(range(6_000))
    # A file that is there but not in the log (a publish that a crash cut short) is not read.
    pq.write_table(pa.table({"id": [-1], "ts": pa.array([BASE_US], pa.timestamp("us", tz="UTC")), "tag": ["x"]}),
                   os.path.join(out, "part-stray.parquet"))
    assert spark.read.parquet(out).count() == 6_000
    read_back = (spark.readStream.schema("id long, ts timestamp, tag string").parquet(out)
                 .writeStream.format("memory").queryName("actorflow_stream_read_back").start())
    read_back.processAllAvailable()
    read_back.stop()
    assert spark.sql("select count(*) c, min(id) lo from actorflow_stream_read_back").collect()[0][:] == (6_000, 0)


def test_stop_then_resume_at_another_parallelism_from_the_final_checkpoint_equals_an_uninterrupted_run(spark, tmp_path):
    directory = str(tmp_path / "in")
    os.makedirs(directory)
    all_files = str(tmp_path / "all")
    write_event_files(all_files, 40_000, 8)
    names = sorted(os.listdir(all_files))

    window = TumblingEventTimeWindows.of(60_000)

    def start(source: str, location: str, windows: int = 2):
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
        return _pipeline(from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
                                    parallelism=2), window, windows).write_stream(
            str(tmp_path / f"out-{location}"), checkpoint_location=str(tmp_path / location))

    # The first half of the files, then a stop with a final checkpoint (in-flight requests, open windows saved).
    for name in names[:4]:
        os.link(os.path.join(all_files, name), os.path.join(directory, name))
    first = start(directory, "resumed")
    first.process_all_available()
    first.stop()
    assert first.last_progress["epoch"] == 3
    # The rest arrive while nothing runs; the same script started again, with three window
    # instances instead of two, goes on where it stopped: the open windows move with their keys.
    for name in names[4:]:
        os.link(os.path.join(all_files, name), os.path.join(directory, name))
    second = start(directory, "resumed", windows=3)
    assert second.job.resumed_from is not None
    windows = [name.partition("@")[0] for name in live_instances(second.name) if "/window[" in name]
    assert windows == [f"resumed/window[{i}/3]" for i in range(3)], windows
    second.process_all_available()
    second.stop(drain=True)
    assert [p["epoch"] for p in second.recent_progress if not p["between_epochs"]] == [4, 5, 6, 7]

    uninterrupted = start(all_files, "uninterrupted")
    uninterrupted.process_all_available()
    uninterrupted.stop(drain=True)
    # A drained job fired every window at the end of event time: nothing can follow it.
    with pytest.raises(ConfigurationError, match="was drained .* start the query with a new checkpoint location"):
        start(all_files, "uninterrupted")
    assert _rows(spark.read.parquet(str(tmp_path / "out-resumed"))) == _rows(
        spark.read.parquet(str(tmp_path / "out-uninterrupted")))


def test_dead_letters_and_late_data_are_streams_published_with_each_micro_batch_exactly_once(spark, tmp_path):
    directory, n = str(tmp_path / "in"), 30_000
    late = write_event_files(directory, n, 6)
    failed = list(range(0, n, 1_009))
    letters, late_dir = str(tmp_path / "dead"), str(tmp_path / "late")

    def start(**sides):
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
        stream = _pipeline(from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
                                      parallelism=2), WINDOWS["tumbling"])
        return stream.write_stream(str(tmp_path / "out"), checkpoint_location=str(tmp_path / "chk"), **sides)

    # Each stream has a directory of its own, and names a side output the pipeline writes.
    with pytest.raises(ConfigurationError, match=r"names \['nope'\], and this pipeline's side outputs are \['dead_letter', 'late'\]"):
        start(side_outputs={"nope": late_dir})
    with pytest.raises(ConfigurationError, match="side output 'dead_letter' and the output would share the directory"):
        start(dead_letters=str(tmp_path / "out"))

    query = start(dead_letters=letters, side_outputs={"late": late_dir})
    query.process_all_available()
    # While the query runs, the failed rows come out with the checkpoints after their last retry,
    # each with why it failed, and they are no longer in the actors' state.
    poll(lambda: len(query.checkpoint() and query.dead_letters().collect()) == len(failed), timeout_s=60)
    running = query.dead_letters().collect()
    assert sorted(r.id for r in running) == failed
    assert {(r.error_type, r.attempts) for r in running} == {("LookupError", 3)}  # FixedDelay(3, 10)
    assert {r.operator for r in running} <= {"chk/async_map[0/2]", "chk/async_map[1/2]"}
    actors = [a for stage in query.job._attempt.stage_actors for a in stage]
    assert not any(ray.get([a.take_side.remote(tag) for a in actors for tag in ("dead_letter", "late")]))
    assert sorted(r.id for r in query.side_output("late").collect()) == [i for i in late if i % 1_009]
    query.stop()  # a savepoint: the next run goes on from it

    again = start(dead_letters=letters, side_outputs={"late": late_dir})
    assert again.job.resumed_from is not None
    again.process_all_available()
    again.stop(drain=True)
    assert again.job.side_outputs == {}  # each side output went to its files, none waits in the job
    # Read by Spark as any file sink's output: every record once, across the stop and the resume.
    dead = spark.read.parquet(letters)
    assert sorted(r.id for r in dead.collect()) == failed
    assert {"id", "user", "amount", "ts", "error_type", "error", "attempts", "operator"} <= set(dead.columns)
    late_rows = spark.read.parquet(late_dir).collect()
    assert sorted(r.id for r in late_rows) == [i for i in late if i % 1_009]
    assert {r.late_reason for r in late_rows} == {"past_allowed_lateness"} and all(r.late_windows for r in late_rows)


def _ids_in(spark, out: str) -> list[int]:
    return sorted(r.id for r in spark.read.parquet(out).select("id").collect())


def test_a_file_of_another_schema_in_the_middle_of_the_stream_fails_the_query_saying_so_and_loses_nothing(spark, tmp_path):
    directory, out, chk = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "chk")
    write_event_files(directory, 6_000, 3)
    third = os.path.join(directory, sorted(os.listdir(directory))[2])
    good = pq.read_table(third)
    pq.write_table(good.set_column(2, "amount", good.column("amount").cast(pa.string())), third)  # amount: a string
    os.utime(third, (1_700_000_002, 1_700_000_002))

    async def tag(row):
        return [{"id": row["id"], "ts": row["ts"], "amount": row["amount"]}]

    def start():
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
        return from_spark(events, timestamp_column="ts").async_map(tag).write_stream(out, checkpoint_location=chk)

    query = start()
    with pytest.raises(JobFailedError) as failed:
        query.await_termination(timeout=120)
    said = str(failed.value)
    assert "amount" in said and os.path.basename(third) in said and len(said.splitlines()) < 10, said
    assert query.exception() is not None and not query.is_active
    query.stop()
    assert _ids_in(spark, out) == list(range(4_000))  # the first two files are out, once
    # The file mended, the same script goes on with the micro-batch that failed.
    pq.write_table(good, third)
    os.utime(third, (1_700_000_002, 1_700_000_002))
    again = start()
    again.process_all_available()
    again.stop()
    assert _ids_in(spark, out) == list(range(6_000))


def test_output_that_gains_a_column_mid_stream_fails_naming_it_and_a_declared_schema_then_publishes_it(spark, tmp_path):
    directory, out, chk = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "chk")
    write_event_files(directory, 6_000, 3)

    async def grow(row):  # from the third file on, the function adds a column
        extra = {"note": f"n{row['id']}"} if row["id"] >= 4_000 else {}
        return [{"id": row["id"], "ts": row["ts"], **extra}]

    def start(**options):
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
        return from_spark(events, timestamp_column="ts").async_map(grow).write_stream(
            out, checkpoint_location=chk, **options)

    query = start()
    with pytest.raises(SchemaError, match=r"epoch \d+'s output has columns \['id', 'ts', 'note'\].* \['note'\] are new"):
        query.await_termination(timeout=120)
    query.stop()
    # Published: what checkpoints committed before the failing epoch, once each, none with the new
    # column. A row whose request was in flight at a barrier goes out with a later epoch, and each
    # reader takes its own contiguous share of a micro-batch, so the cut need not fall at the end
    # of a file, nor be one prefix of the input: a share's rows may be out while another's wait.
    published = _ids_in(spark, out)
    assert published and len(set(published)) == len(published) and published[-1] < 4_000, published[-5:]
    # Declared, the column is null where the function did not set it; the epoch kept is published.
    again = start(output_schema="id long, ts timestamp, note string")
    again.process_all_available()
    again.stop()
    rows = spark.read.option("mergeSchema", True).parquet(out).select("id", "note").collect()
    assert sorted(r.id for r in rows) == list(range(6_000))
    assert all(r.note == (f"n{r.id}" if r.id >= 4_000 else None) for r in rows)


def test_a_rate_micro_batch_source_streams_through_the_job_every_row_once(spark, tmp_path):
    # Spark's own replayable test source: 500 rows a micro-batch, a second of event time apart.
    events = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 500).option("numPartitions", 2)
              .option("startTimestamp", BASE_US // 1000).option("advanceMillisPerBatch", 1_000).load())

    async def tag(row):
        return [{"value": row["value"], "timestamp": row["timestamp"], "tag": f"v{row['value']}"}]

    out = str(tmp_path / "out")
    query = from_spark(events, timestamp_column="timestamp").async_map(tag, ordered=False).write_stream(
        out, checkpoint_location=str(tmp_path / "chk"), processing_time="200 milliseconds")
    poll(lambda: len([p for p in query.recent_progress if not p["between_epochs"]]) >= 4, timeout_s=60)
    query.stop(drain=True)
    offered = [p for p in query.recent_progress if not p["between_epochs"]]
    assert [p["epoch"] for p in offered] == list(range(len(offered))) and all(p["rows_in"] == 500 for p in offered)
    rows = spark.read.parquet(out).collect()
    assert sorted(r.value for r in rows) == list(range(500 * len(offered)))
    assert all(r.tag == f"v{r.value}" for r in rows)


def test_a_socket_source_is_refused_saying_why(spark):
    lines = spark.readStream.format("socket").option("host", "127.0.0.1").option("port", 9).load()
    with pytest.raises(ConfigurationError, match="replayable streaming source .* socket source keeps no offsets"):
        from_spark(lines)


def test_a_streaming_stream_is_written_with_write_stream_and_a_bounded_one_with_to_spark(spark, tmp_path):
    events = spark.readStream.schema(SCHEMA).parquet(str(tmp_path))
    with pytest.raises(ConfigurationError, match="start it with write_stream"):
        from_spark(events).map(lambda r: r).to_spark()
    with pytest.raises(ConfigurationError, match="this one reads a bounded DataFrame: call to_spark"):
        from_spark(spark.range(3)).map(lambda r: r).write_stream(str(tmp_path / "o"), checkpoint_location=str(tmp_path / "c"))


def test_a_null_event_time_in_a_micro_batch_fails_the_query_naming_the_column(spark, tmp_path):
    directory = str(tmp_path / "in")
    os.makedirs(directory)
    pq.write_table(pa.table({"id": [1, 2], "user": [1, 1], "amount": [1, 1],
                             "ts": pa.array([BASE_US, None], pa.timestamp("us", tz="UTC"))}),
                   os.path.join(directory, "bad.parquet"))
    events = spark.readStream.schema(SCHEMA).parquet(directory)
    query = from_spark(events, timestamp_column="ts").map(lambda r: r).write_stream(
        str(tmp_path / "out"), checkpoint_location=str(tmp_path / "chk"))
    with pytest.raises(af.errors.JobFailedError, match="column 'ts' holds nulls in 1 rows"):
        query.await_termination(120)
    assert not query.is_active


def _published_windows(out: str) -> set[int]:
    """The window starts (ms from BASE) in the files the sink's log lists."""
    from actorflow.cluster.stream_sinks import FileSink

    starts: set[int] = set()
    for name in FileSink(out).files:
        for start in pq.read_table(os.path.join(out, name)).column("window_start").to_pylist():
            starts.add(int(start.timestamp() * 1000) - BASE_US // 1000)
    return starts


def test_a_window_that_an_idle_input_closes_during_a_pause_is_published_within_the_stated_bound(spark, tmp_path):
    directory = str(tmp_path / "in")
    os.makedirs(directory)
    # One file of a minute of clicks in time order: the first split reads its first half, the
    # second the rest, so after it the watermark is the first split's, 30 s in.
    pq.write_table(pa.table({"id": list(range(600)), "user": [1] * 600, "amount": [1] * 600,
                             "ts": pa.array([BASE_US + i * STEP_US for i in range(600)], pa.timestamp("us", tz="UTC"))}),
                   os.path.join(directory, "minute.parquet"))
    idleness_ms, interval_ms = 500, 500
    events = spark.readStream.schema(SCHEMA).parquet(directory)
    out = str(tmp_path / "out")
    appeared: dict[int, float] = {}  # window start -> when the sink's log first listed it
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            if os.path.isdir(os.path.join(out, "_spark_metadata")):
                for start in _published_windows(out):
                    appeared.setdefault(start, time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    query = (from_spark(events, timestamp_column="ts", parallelism=2, idleness_ms=idleness_ms)
             .key_by("user").window(TumblingEventTimeWindows.of(10_000)).count()
             .write_stream(out, checkpoint_location=str(tmp_path / "chk"), checkpoint_interval_ms=interval_ms))
    try:
        query.process_all_available()
        deadline = time.monotonic() + 10
        while len(appeared) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        query.stop()
    progress = query.recent_progress
    epoch = next(p for p in progress if not p["between_epochs"])
    epoch_out_s = (epoch["started_at_ms"] + epoch["latency_ms"]) / 1000
    assert sorted(appeared) == [0, 10_000, 20_000, 30_000, 40_000], appeared
    # The windows the epoch's watermark closed (29.9 s in) go out with its checkpoint, or, where the
    # barrier overtook that watermark (it then waits in the checkpoint), with the next one. No file
    # came after it: the first split went idle, the watermark became the second's (59.9 s), the
    # windows up to 50 s closed, and a checkpoint between micro-batches published them.
    later_ms = [(appeared[start] - epoch_out_s) * 1000 for start in (20_000, 30_000, 40_000)]
    assert all(ms >= idleness_ms - 50 for ms in later_ms), later_ms
    # The bound: idleness, then the next checkpoint between micro-batches, and that checkpoint's own
    # time (its checkpoint and publish), as the job measured it; 200 ms for the watcher's polling.
    between = [p for p in progress if p["between_epochs"] and p["rows_out"]]
    own_ms = max(p["checkpoint_ms"] + p["publish_ms"] for p in between)
    assert all(ms <= idleness_ms + interval_ms + own_ms + 200 for ms in later_ms), (later_ms, between)


class EventService:
    """A real HTTP service on 127.0.0.1 whose answer for an event is a pure function of its id and
    how many times it was asked: every 13th event answers 503 the first time (a retry succeeds),
    every 1,009th 404 always (a dead letter), every 4,999th hangs (the timeout's fallback answers)."""

    def __init__(self) -> None:
        self.asked: dict[int, int] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "EventService":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    def _serve(self) -> None:
        from aiohttp import web

        async def event(request):
            i = int(request.match_info["id"])
            self.asked[i] = self.asked.get(i, 0) + 1
            if i % 1_009 == 0:
                return web.json_response({"error": f"no event {i}"}, status=404)
            if i % 13 == 0 and self.asked[i] == 1:
                return web.json_response({"error": "busy"}, status=503)
            if i % HANGS == 0:
                await asyncio.sleep(30)
            return web.json_response({"id": i, "segment": f"s{i % 5}"})

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            app = web.Application()
            app.router.add_get("/event/{id}", event)
            runner = web.AppRunner(app, shutdown_timeout=0.2)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        asyncio.run(main())


def _service_pipeline(stream, url: str):
    async def lookup(row):
        from examples.enrich_service import http_session

        async with http_session().get(f"{url}/event/{row['id']}") as response:
            if response.status != 200:
                raise ConnectionError(f"event {row['id']}: {response.status}")
            body = await response.json()
        return [{**row, "segment": body["segment"], "fell_back": 0}]

    return (stream
            .async_map(lookup, ordered=False, capacity=100, timeout_ms=1_000, fallback=_fallback,
                       retry=af.retry.FixedDelay(3, 20), on_error="dead_letter")
            .key_by("user")
            .window(TumblingEventTimeWindows.of(60_000))
            .aggregate(Aggregations(n=Count(), total=Sum("amount"), fallbacks=Sum("fell_back"))))


def test_actor_kills_during_a_stream_against_a_real_service_lose_and_duplicate_nothing(spark, tmp_path):
    from actorflow.cluster.chaos import ChaosMonkey

    n, directory = 30_000, str(tmp_path / "in")
    late = write_event_files(directory, n, 20)
    with EventService() as service:
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
        stream = from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2,
                            job_name="stream-chaos")
        query = _service_pipeline(stream, service.url).write_stream(
            str(tmp_path / "out"), checkpoint_location=str(tmp_path / "chk"), processing_time="500 milliseconds")
        with ChaosMonkey("stream-chaos", every_s=2.0, max_kills=3, first_after_s=2.0, seed=11) as monkey:
            query.process_all_available()
        query.stop(drain=True)
        assert len(monkey.kills) >= 2, monkey.kills
        assert query.job.restarts == len(monkey.kills), (query.job.failures, monkey.kills)

        calm = from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2,
                          job_name="stream-calm")
        control = _service_pipeline(calm, service.url).write_stream(
            str(tmp_path / "out-calm"), checkpoint_location=str(tmp_path / "chk-calm"))
        control.process_all_available()
        control.stop(drain=True)

    ours, theirs = _rows(spark.read.parquet(str(tmp_path / "out"))), _rows(spark.read.parquet(str(tmp_path / "out-calm")))
    assert ours == theirs
    assert sum(r[3] for r in ours) == n - len(range(0, n, 1_009)) - len([i for i in late if i % 1_009])
    assert sum(r[5] for r in ours) == len([i for i in range(0, n, HANGS) if i % 1_009 and i not in late])
    assert sorted(r.id for r in query.dead_letters().collect()) == list(range(0, n, 1_009))


def test_a_micro_batch_whose_rows_are_all_late_goes_whole_to_the_late_output(spark, tmp_path):
    directory = str(tmp_path / "in")
    write_event_files(directory, 4_000, 2)
    # A third file, dated an hour before the others: every row of its micro-batch is late.
    late = pa.table({"id": pa.array(range(10_000, 10_500), pa.int64()), "user": [1] * 500, "amount": [1] * 500,
                     "ts": pa.array([BASE_US - 3_600_000_000 + i * STEP_US for i in range(500)],
                                    pa.timestamp("us", tz="UTC"))})
    pq.write_table(late, os.path.join(directory, "late.parquet"))
    os.utime(os.path.join(directory, "late.parquet"), (1_700_000_010, 1_700_000_010))  # read after the others
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)
    query = (from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2)
             .key_by("user").window(TumblingEventTimeWindows.of(60_000)).side_output_late_data("late").count()
             .write_stream(str(tmp_path / "out"), checkpoint_location=str(tmp_path / "chk")))
    query.process_all_available()
    query.stop(drain=True)
    assert [p["rows_in"] for p in query.recent_progress if not p["between_epochs"]] == [2_000, 2_000, 500]
    late_rows = query.side_output("late").collect()
    assert sorted(r.id for r in late_rows) == list(range(10_000, 10_500))
    assert sum(r["count"] for r in spark.read.parquet(str(tmp_path / "out")).collect()) == 4_000
