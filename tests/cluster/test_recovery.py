"""Exactly-once recovery on Ray actors: kill instances of running jobs, at random and at named
moments, and check that the output is exactly the output of a run without failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray

from actorflow.cluster import from_arrow, from_blocks
from actorflow.cluster.chaos import ChaosMonkey, compare_outputs, kill_actor
from actorflow.operators import FixedDelay, JobFailedError
from actorflow.operators.windows import TumblingEventTimeWindows
from tests.waiting import find_actor, poll

pytestmark = pytest.mark.ray

KEYS = 13


def _clicks(n: int, parts: int = 4) -> list[pa.Table]:
    """Clicks of KEYS users; ``seq`` numbers each user's clicks 0, 1, 2, ... in input order."""
    users = [i % KEYS for i in range(n)]
    seq = [i // KEYS for i in range(n)]
    table = pa.table({"click": list(range(n)), "user": users, "seq": seq, "ts": [i * 10 for i in range(n)]})
    size = -(-n // parts)
    return [table.slice(i, size) for i in range(0, n, size)]


async def _enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{**row, "score": row["click"] * 3 + 1}]


async def _enrich_slowly(row: dict[str, Any]) -> list[dict[str, Any]]:
    # For jobs that must still run when a kill comes at a given time, however fast actors start.
    await asyncio.sleep(0.005)
    return [{**row, "score": row["click"] * 3 + 1}]


def _expected_enriched(n: int) -> pa.Table:
    table = pa.concat_tables(_clicks(n))
    return table.append_column("score", pa.array([c * 3 + 1 for c in table.column("click").to_pylist()]))


def _run(stream: Any, **settings: Any) -> tuple[Any, BaseException | None]:
    outcome: list[Any] = [None, None]

    def run() -> None:
        try:
            outcome[0] = stream.execute(progress=False, **settings)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome[1] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _check_sequences(table: pa.Table) -> None:
    # Per user, in output order, each seq is the previous one + 1: nothing lost, nothing twice,
    # nothing out of order.
    seen: dict[int, int] = {}
    for user, seq in zip(table.column("user").to_pylist(), table.column("seq").to_pylist()):
        assert seq == seen.get(user, -1) + 1, f"user {user}: seq {seq} after {seen.get(user)}"
        seen[user] = seq


def test_random_kills_of_an_ordered_enrichment_lose_and_duplicate_nothing(ray_session, tmp_path):
    n = 30_000
    stream = from_arrow(_clicks(n), parallelism=2, batch_size=250, job_name="chaos-ordered").async_map(
        _enrich_slowly, capacity=40)
    with ChaosMonkey("chaos-ordered", every_s=1.5, max_kills=3, first_after_s=1.0, seed=1) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    table = result.to_arrow()
    report = compare_outputs(_expected_enriched(n), table, key="click")
    assert report.exact, report.lines()
    assert table.column("click").to_pylist() == list(range(n))  # ordered mode keeps input order
    _check_sequences(table)
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    assert result.checkpoints["completed"], result.checkpoints  # recovery came from checkpoints


async def _enrich_user_zero_slowly(row: dict[str, Any]) -> list[dict[str, Any]]:
    # One slow key: in key-ordered mode the others overtake it.
    await asyncio.sleep(0.03 if row["user"] == 0 else 0.002)
    return [{**row, "score": row["click"] * 3 + 1}]


def test_random_kills_of_a_key_ordered_enrichment_keep_each_keys_order_and_lose_nothing(ray_session, tmp_path):
    n = 20_000
    stream = from_arrow(_clicks(n), parallelism=2, batch_size=250, job_name="chaos-key-ordered").async_map(
        _enrich_user_zero_slowly, capacity=40, queue_capacity=400, ordered="key", order_key="user")
    with ChaosMonkey("chaos-key-ordered", every_s=1.5, max_kills=3, first_after_s=1.0, seed=3) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    table = result.to_arrow()
    report = compare_outputs(_expected_enriched(n), table, key="click")
    assert report.exact, report.lines()
    _check_sequences(table)  # each user's clicks in input order, once each
    clicks = table.column("click").to_pylist()
    assert clicks != sorted(clicks), "no key overtook the slow one: the run did not test key order"
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    assert result.checkpoints["completed"], result.checkpoints


def test_window_counts_are_exact_per_key_and_window_after_restarts(ray_session, tmp_path):
    n = 40_000
    tables = _clicks(n)
    stream = (
        from_arrow(tables, parallelism=2, batch_size=250, timestamp_column="ts", job_name="chaos-windows")
        .async_map(_enrich, capacity=40, ordered=False)
        .key_by("user", parallelism=2)
        .window(TumblingEventTimeWindows.of(5_000))
        .count()
    )
    with ChaosMonkey("chaos-windows", every_s=1.5, max_kills=3, first_after_s=1.0, seed=2) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    got = Counter()
    for row in result.to_arrow().to_pylist():
        got[(row["user"], row["window_start"])] += row["count"]
        assert row["count"] <= 5_000 // 10  # a count above what the window can hold is a replay counted twice
    want = Counter((u, (t // 5_000) * 5_000) for u, t in zip(*(pa.concat_tables(tables).column(c).to_pylist()
                                                              for c in ("user", "ts"))))
    assert got == want
    assert result.to_arrow().num_rows == len(want)  # one firing per key and window, not two
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills)



def test_a_keyed_stage_that_reads_the_source_itself_recovers_exactly(ray_session, tmp_path):
    # key_by straight after the source, with its parallelism: each window instance reads a split
    # and routes it by key over both, itself included; no source actors run.
    n = 20_000
    tables = [t.append_column("one", pa.array([1] * t.num_rows)) for t in _clicks(n)]

    def slow_count(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.0002)  # slow enough for kills and checkpoints to land mid-stream
        return {"one": a["one"] + b["one"]}

    stream = (
        from_arrow(tables, parallelism=2, batch_size=200, timestamp_column="ts", job_name="chaos-keyed-read")
        .key_by("user", parallelism=2).window(TumblingEventTimeWindows.of(5_000)).reduce(slow_count)
    )
    with ChaosMonkey("chaos-keyed-read", every_s=1.0, max_kills=2, first_after_s=0.8, seed=5) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    assert [f for f in result.figures if "rows_sent" in f] == [] and len(result.figures) == 2
    got = Counter()
    for row in result.to_arrow().to_pylist():
        got[(row["user"], row["window_start"])] += row["one"]
    want = Counter((u, (t // 5_000) * 5_000) for u, t in zip(*(pa.concat_tables(tables).column(c).to_pylist()
                                                              for c in ("user", "ts"))))
    assert got == want
    assert result.to_arrow().num_rows == len(want)  # one firing per key and window, not two
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    assert result.checkpoints["completed"], result.checkpoints

def test_a_keyed_read_that_pre_aggregates_recovers_exactly(ray_session, tmp_path):
    # As above, with a built-in count: each instance sends its peers a row per key and window of
    # each batch instead of the rows, and such partials in flight at a checkpoint are part of it.
    # The blocks come in over about three seconds, so that kills and checkpoints land mid-stream.
    n = 32_000
    tables = _clicks(n, parts=16)

    @ray.remote(num_cpus=0)
    def later(table: pa.Table, delay_s: float) -> pa.Table:
        time.sleep(delay_s)
        return table

    blocks = [later.remote(t, 0.2 * i) for i, t in enumerate(tables)]
    stream = (
        from_blocks(blocks, [t.num_rows for t in tables], parallelism=2, batch_size=250, timestamp_column="ts",
                    job_name="chaos-partials", schema=tables[0].schema)
        .key_by("user", parallelism=2).window(TumblingEventTimeWindows.of(5_000)).count()
    )
    with ChaosMonkey("chaos-partials", every_s=1.0, max_kills=2, first_after_s=0.8, seed=7) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=200, checkpoint_dir=str(tmp_path))
    want = Counter((u, (t // 5_000) * 5_000) for u, t in zip(*(pa.concat_tables(tables).column(c).to_pylist()
                                                              for c in ("user", "ts"))))
    table = result.to_arrow()
    assert Counter({(r["user"], r["window_start"]): r["count"] for r in table.to_pylist()}) == want
    assert table.num_rows == len(want)  # one firing per key and window, not two
    assert sum(f["late_records_dropped"] for f in result.figures) == 0
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    assert result.checkpoints["completed"], result.checkpoints


def _kill_in_turn(directory: Path, job: str, n: int, interval_ms: int, kills: list[tuple[str, int]]) -> Any:
    """Run the enrichment of ``n`` clicks; kill each named instance once it has taken in that
    many records (0: as soon as it exists); return the result."""
    stream = from_arrow(_clicks(n), parallelism=2, batch_size=100, job_name=job).async_map(_enrich, capacity=10)
    thread, outcome = _run(stream, checkpoint_interval_ms=interval_ms, checkpoint_dir=str(directory))
    for name, records_in in kills:
        actor = poll(lambda: find_actor(f"{job}/{name}"), timeout_s=60)
        poll(lambda: ray.get(actor.stats.remote())["records_in"] >= records_in)
        ray.kill(actor, no_restart=True)
    thread.join(180)
    result, error = outcome
    assert error is None, error
    return result


def test_a_failure_before_the_first_checkpoint_restarts_from_the_beginning(ray_session, tmp_path):
    n = 10_000
    result = _kill_in_turn(tmp_path, "chaos-early", n, 600_000, [("async_map[1/2]", 500)])
    assert result.restarts == 1 and result.checkpoints["completed"] == []
    assert compare_outputs(_expected_enriched(n), result.to_arrow(), key="click").exact


def test_a_second_failure_right_after_recovery_is_recovered_too(ray_session, tmp_path):
    n = 20_000
    # The restarted instance dies as soon as it exists, before the attempt's first checkpoint.
    result = _kill_in_turn(tmp_path, "chaos-twice", n, 400, [("async_map[0/2]", 2_000), ("async_map[1/2]@1", 0)])
    assert result.restarts == 2, result.failures
    table = result.to_arrow()
    assert table.column("click").to_pylist() == list(range(n))
    assert compare_outputs(_expected_enriched(n), table, key="click").exact


def _failing_always(row: dict[str, Any]) -> Any:
    async def call() -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        raise ConnectionError(f"service down for click {row['click']}")

    return call()


@pytest.mark.parametrize("moment", ["snapshot", "queue_full", "completion", "window_fire"])
def test_a_kill_at_a_named_moment_loses_and_duplicates_nothing(ray_session, tmp_path, moment):
    n = 20_000
    job = f"chaos-{moment.replace('_', '-')}"
    tables = _clicks(n)
    stream = from_arrow(tables, parallelism=2, batch_size=200, timestamp_column="ts", job_name=job)

    async def slow_first(row: dict[str, Any]) -> list[dict[str, Any]]:
        # The first record of each batch is slow: in ordered mode the rest complete and wait.
        await asyncio.sleep(0.02 if row["click"] % 200 == 0 else 0.0005)
        return [{**row, "score": row["click"] * 3 + 1}]

    stream = stream.async_map(slow_first, capacity=20)
    if moment == "window_fire":
        stream = stream.key_by("user", parallelism=2).window(TumblingEventTimeWindows.of(5_000)).count()
    with ChaosMonkey(job, every_s=1.0, max_kills=2, first_after_s=1.0, moment=moment, seed=3,
                     operator="window" if moment == "window_fire" else "async_map") as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    table = result.to_arrow()
    if moment == "window_fire":
        want = Counter((u, (t // 5_000) * 5_000) for u, t in zip(*(pa.concat_tables(tables).column(c).to_pylist()
                                                                  for c in ("user", "ts"))))
        assert Counter({(r["user"], r["window_start"]): r["count"] for r in table.to_pylist()}) == want
        assert table.num_rows == len(want)
    else:
        assert compare_outputs(_expected_enriched(n), table, key="click").exact
        assert table.column("click").to_pylist() == list(range(n))


def test_a_kill_while_retries_wait_keeps_each_records_attempt_count(ray_session, tmp_path):
    n = 600
    stream = from_arrow(_clicks(n), parallelism=1, batch_size=50, job_name="chaos-retry").async_map(
        _failing_always, capacity=60, retry=FixedDelay(3, 400), on_error="dead_letter")
    with ChaosMonkey("chaos-retry", every_s=1.0, max_kills=2, first_after_s=0.8, moment="retry_wait",
                     operator="async_map") as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=200, checkpoint_dir=str(tmp_path))
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills)
    letters = result.side_outputs["dead_letter"]
    assert sorted(letter.value["click"] for letter in letters) == list(range(n))  # each once
    assert {letter.attempts for letter in letters} == {3}  # a restore neither adds nor resets attempts
    assert result.output_rows == 0


def test_an_aborted_checkpoint_leaves_no_files_and_its_output_is_kept(ray_session, tmp_path):
    n = 8_000
    stream = from_arrow(_clicks(n), parallelism=2, batch_size=100, job_name="chaos-aborts").async_map(
        _enrich, capacity=10)
    result = stream.execute(progress=False, checkpoint_interval_ms=100, checkpoint_timeout_ms=1,
                            checkpoint_dir=str(tmp_path))
    assert result.checkpoints["aborted"] and not result.checkpoints["completed"], result.checkpoints
    reasons = [reason for _, reason in result.checkpoints["aborted"]]
    # The last one may meet the end of the input (declined, or pending when the job ends) before
    # its timeout is seen; every other one times out.
    assert all("timeout" in reason for reason in reasons[:-1]), reasons
    assert any(why in reasons[-1] for why in ("timeout", "its input has ended", "the job ended")), reasons
    assert compare_outputs(_expected_enriched(n), result.to_arrow(), key="click").exact
    job_dir = tmp_path / "chaos-aborts"
    assert not list(job_dir.glob("chk-*")), list(job_dir.iterdir())
    assert not [p for p in job_dir.rglob("*") if p.name.endswith((".staged", ".tmp"))]


def test_a_job_resumes_from_a_retained_checkpoint_with_the_same_result(ray_session, tmp_path):
    n = 20_000
    broken_from = 15_000

    async def breaks_late(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        if row["click"] >= broken_from:
            raise RuntimeError(f"bad deploy at click {row['click']}")
        return [{**row, "score": row["click"] * 3 + 1}]

    first = from_arrow(_clicks(n), parallelism=2, batch_size=100, job_name="resumable").async_map(
        breaks_late, capacity=10)
    with pytest.raises(JobFailedError, match="bad deploy"):
        first.execute(progress=False, checkpoint_interval_ms=200, checkpoint_dir=str(tmp_path))
    job_dir = tmp_path / "resumable"
    assert list(job_dir.glob("chk-*/_metadata")), "the failed run left no complete checkpoint"
    fixed = from_arrow(_clicks(n), parallelism=2, batch_size=100).async_map(_enrich, capacity=10)
    result = fixed.execute(progress=False, resume_from=str(job_dir))
    assert result.job == "resumable"
    table = result.to_arrow()
    assert table.column("click").to_pylist() == list(range(n))
    assert compare_outputs(_expected_enriched(n), table, key="click").exact


def test_checkpoints_go_to_any_pyarrow_filesystem(ray_session, tmp_path):
    # A SubTreeFileSystem rooted in a directory: every actor writes through the same object.
    filesystem = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    n = 6_000
    stream = from_arrow(_clicks(n), parallelism=2, batch_size=100, job_name="subtree").async_map(_enrich_slowly, capacity=10)
    thread, outcome = _run(stream, checkpoint_interval_ms=200, checkpoint_dir="chk", checkpoint_filesystem=filesystem)
    actor = poll(lambda: find_actor("subtree/async_map[0/2]"))
    poll(lambda: ray.get(actor.checkpoints_done.remote()) >= 2)
    kill_actor("subtree", "async_map[0/2]")
    thread.join(120)
    result, error = outcome
    assert error is None, error
    assert result.restarts == 1 and result.checkpoints["completed"]
    assert compare_outputs(_expected_enriched(n), result.to_arrow(), key="click").exact
    assert list(Path(tmp_path, "chk", "subtree").glob("chk-*/_metadata"))


def test_an_exhausted_restart_budget_names_the_actor_and_its_error(ray_session, tmp_path):
    n = 50_000
    stream = from_arrow(_clicks(n), parallelism=1, batch_size=100, job_name="chaos-budget").async_map(
        _enrich, capacity=5)
    with ChaosMonkey("chaos-budget", every_s=0.8, max_kills=3, first_after_s=0.8, operator="async_map"):
        with pytest.raises(JobFailedError) as failure:
            stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path), max_restarts=1)
    message = str(failure.value)
    assert "restart budget (max_restarts=1)" in message and "chaos-budget/async_map[0/1]" in message
    assert "ActorDiedError" in message


@ray.remote
class _Ledger:
    """What a de-duplicating service would see: every call's idempotency key, per click."""

    def __init__(self) -> None:
        self.keys: dict[int, set[str]] = {}

    def record(self, click: int, key: str) -> None:
        self.keys.setdefault(click, set()).add(key)

    def seen(self) -> dict[int, set[str]]:
        return self.keys


def test_a_replayed_request_carries_the_idempotency_key_of_its_first_call(ray_session, tmp_path):
    from actorflow.operators import current_request_key

    ledger = _Ledger.remote()
    n = 12_000

    async def call_service(row: dict[str, Any]) -> list[dict[str, Any]]:
        await ledger.record.remote(row["click"], current_request_key())
        return [{**row, "score": row["click"] * 3 + 1}]

    stream = from_arrow(_clicks(n), parallelism=2, batch_size=200, job_name="chaos-keys").async_map(
        call_service, capacity=30)
    with ChaosMonkey("chaos-keys", every_s=1.0, max_kills=2, first_after_s=1.0, seed=5) as monkey:
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
    assert compare_outputs(_expected_enriched(n), result.to_arrow(), key="click").exact
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills)
    seen = ray.get(ledger.seen.remote())
    assert sorted(seen) == list(range(n))
    assert all(len(keys) == 1 for keys in seen.values()), {c: k for c, k in seen.items() if len(k) > 1}
    keys = [next(iter(k)) for k in seen.values()]
    assert len(set(keys)) == n and all(k.startswith("chaos-keys/async_map/") for k in keys)


@ray.remote(num_cpus=0)
class _Gate:
    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> None:
        await self.opened.wait()

    async def open(self) -> None:
        self.opened.set()


@ray.remote(num_cpus=0)
class _Starts:
    def __init__(self, gate: Any = None) -> None:
        if gate is not None:  # still starting until the gate opens
            ray.get(gate.wait.remote())


def test_the_dead_actor_of_an_attempt_is_named_without_waiting_for_one_still_starting(ray_session):
    # A kill during a deploy: one instance is dead while another one's process still starts.
    # The recovery must not wait for that one to answer (seconds on a busy machine) to learn
    # which actor died.
    from actorflow.cluster.job import _Attempt

    gate = _Gate.remote()
    dead, starting = _Starts.remote(), _Starts.remote(gate)
    ray.get(dead.__ray_ready__.remote())
    ray.kill(dead, no_restart=True)
    attempt = _Attempt.__new__(_Attempt)
    attempt.handles = [starting, dead]
    attempt.names = {starting: "job/op[0/2]", dead: "job/op[1/2]"}
    named: list[str | None] = []
    finder = threading.Thread(target=lambda: named.append(attempt.dead_actor()), daemon=True)
    finder.start()
    finder.join(8.0)  # the probes' own deadline is 10 s
    try:
        assert named == ["job/op[1/2]"]
    finally:
        ray.get(gate.open.remote())
        ray.kill(starting, no_restart=True)
        ray.kill(gate, no_restart=True)


def test_after_a_kill_the_monkey_waits_until_the_next_attempts_instances_have_started(ray_session):
    # The next attempt's actors exist (named) at once, while their processes may take seconds to
    # start. A kill in between would cut the recovery short: the interval counts from their start.
    gate = _Gate.remote()
    starting = _Starts.options(name="chaos-wait/op[0/1]@1", namespace="actorflow").remote(gate)
    monkey = ChaosMonkey("chaos-wait", every_s=1.0, max_kills=1)
    waiter = threading.Thread(target=monkey._await_attempt_after, args=(0,), daemon=True)
    try:
        waiter.start()
        waiter.join(1.5)
        assert waiter.is_alive(), "it went on while the next attempt's instance was still starting"
        ray.get(gate.open.remote())
        waiter.join(10.0)
        assert not waiter.is_alive(), "it did not go on once the instance had started"
    finally:
        monkey._stop.set()
        ray.get(gate.open.remote())
        ray.kill(starting, no_restart=True)
        ray.kill(gate, no_restart=True)
