"""Edges of the Ray shell: per-record outcomes of blocking batches, background failures, progress."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from actorflow.cluster import from_arrow
from actorflow.operators.errors import ConfigurationError, JobFailedError
from tests.waiting import find_actor, poll

pytestmark = pytest.mark.ray


def test_a_slow_call_in_a_blocking_batch_times_out_alone(ray_session):
    # Every task carries 25 calls; two of them hang far past the deadline. Only those two may
    # get the fallback: the other rows of their tasks finish in time and keep their results, and
    # the rows queued behind the tasks do not wait for the hung calls' slots. (The deadline has
    # room for a worker process that starts under the first calls on a busy machine.)
    slow = {7, 42}

    def lookup(row):
        time.sleep(8.0 if row["user"] in slow else 0.01)
        return [{**row, "how": "called"}]

    # Warm as many Ray workers for blocking calls as the job below keeps busy at once: the two
    # whose tasks hold a hung call, and two for the tasks of the rows behind them. The deadline is
    # about the calls, and a worker process that starts on a loaded machine could take most of it.
    def hold(row):
        time.sleep(1.0)  # four tasks of one call each, at once: four workers
        return [row]

    from_arrow([pa.table({"user": [-1, -2, -3, -4]})], parallelism=1).async_map(
        hold, capacity=4, max_tasks=4).execute(progress=False)
    n = 100
    table = (
        from_arrow([pa.table({"user": list(range(n))})], parallelism=1, job_name="blocking-slow")
        .async_map(lookup, capacity=50, timeout_ms=3_000, fallback=lambda row: [{**row, "how": "fallback"}])
        .execute(progress=False)
        .to_arrow()
    )
    how = dict(zip(table.column("user").to_pylist(), table.column("how").to_pylist()))
    assert sorted(how) == list(range(n))
    assert {u for u, h in how.items() if h == "fallback"} == slow


def test_a_hung_blocking_call_frees_its_task_slot_after_the_timeout(ray_session):
    # One task slot (max_tasks=1), and the first task's only call hangs: the rows behind it must
    # still run once that call has timed out, instead of waiting for the hung thread. The hung
    # call keeps its worker process busy, so the next task starts a new one, and that start counts
    # toward the next row's deadline: 8 s leaves room for it on a loaded machine.
    def lookup(row):
        time.sleep(90.0 if row["user"] == 0 else 0.001)
        return [row]

    start = time.monotonic()
    table = (
        from_arrow([pa.table({"user": list(range(20))})], parallelism=1, batch_size=1, job_name="blocking-hung")
        .async_map(lookup, capacity=1, max_tasks=1, timeout_ms=8_000, fallback=lambda row: [{**row, "user": -1}])
        .execute(progress=False)
        .to_arrow()
    )
    assert table.column("user").to_pylist() == [-1] + list(range(1, 20))
    assert time.monotonic() - start < 60  # well before the hung call would have returned



def test_progress_counts_records_with_an_outcome_and_shows_a_stuck_request(ray_session):
    import asyncio
    import threading

    import ray

    async def one_hangs(row):
        if row["user"] == 0:
            await asyncio.sleep(6.0)
        return [row]

    stream = from_arrow([pa.table({"user": list(range(50))})], parallelism=1, job_name="progress").async_map(
        one_hangs, capacity=10, ordered=False)
    thread = threading.Thread(target=lambda: stream.execute(progress=False), daemon=True)
    thread.start()
    actor = poll(lambda: find_actor("progress/async_map[0/1]"))
    # Every record has been read and 49 are done; the bar must not say 100 %, and it must show
    # the one request in flight getting older.
    first = poll(lambda: (p := ray.get(actor.record_progress.remote()))["done"] == 49 and p)
    assert first["in_flight"] == 1 and first["oldest_ms"] is not None
    time.sleep(1.0)
    later = ray.get(actor.record_progress.remote())
    assert later["done"] == 49 and later["oldest_ms"] >= first["oldest_ms"] + 900
    thread.join(60)



def test_a_failing_background_sender_fails_the_job_with_its_cause(ray_session):
    # Run the operator actor's class in this process, with a downstream whose push raises: the
    # failure must reach wait() with its cause, instead of a full outbox that waits forever.
    import asyncio

    from actorflow.actors.operator_actor import ChainSpec, OperatorActor
    from actorflow.actors.source_actor import BlockReader
    from actorflow.operators import ActorflowError, MapOperator

    class _Push:
        def remote(self, *args):
            raise RuntimeError("the receiver is gone")

    class _BrokenDownstream:
        push = _Push()

    async def scenario():
        spec = ChainSpec(job="broken", name="map", index=0, parallelism=1, num_inputs=1,
                         operator_factories=[lambda: MapOperator(lambda v: v, "map")])
        actor = OperatorActor(spec)
        table = pa.table({"user": list(range(10_000))})
        await actor.connect([_BrokenDownstream()], reader=BlockReader([table], batch_size=100))
        await actor.start()
        return await asyncio.wait_for(actor.wait(), timeout=30)

    with pytest.raises(ActorflowError, match=r"broken/map\[0/1\]: sending output downstream failed: "
                                             r"RuntimeError: the receiver is gone"):
        asyncio.run(scenario())


def test_a_source_reader_that_dies_mid_job_fails_it_as_a_job_failure(ray_session):
    import threading

    import ray

    async def slow(row):
        import asyncio

        await asyncio.sleep(0.01)
        return [row]

    # A source actor (parallelism 1) feeds a wider stage; it dies while the job runs and the
    # progress bar polls.
    stream = from_arrow([pa.table({"user": list(range(20_000))})], parallelism=1, batch_size=100,
                        job_name="reader-dies").async_map(slow, capacity=2, parallelism=2)
    outcome: list[BaseException] = []

    def run():
        try:
            stream.execute(progress=True)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    reader = poll(lambda: find_actor("reader-dies/source[0/1]"))
    poll(lambda: ray.get(reader.progress.remote()) > 0)
    ray.kill(reader)
    thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], JobFailedError), outcome
    assert "job 'reader-dies' failed: an actor died" in str(outcome[0])


def test_a_function_from_a_module_the_workers_cannot_import_fails_the_job_saying_what_to_do(
        ray_session, tmp_path, monkeypatch):
    # A module found through a directory the driver put on its sys.path: the driver imports it,
    # a local Ray's workers cannot. Its functions are pickled by reference, so the actors fail
    # to unpickle their own constructor's arguments.
    import importlib

    import ray.cloudpickle

    name = "actorflow_driver_only_lookup"
    (tmp_path / f"{name}.py").write_text("async def lookup(row):\n    return [{**row, 'y': 1}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    stream = from_arrow([pa.table({"a": [1, 2, 3]})], parallelism=1).async_map(module.lookup)
    with pytest.raises(JobFailedError) as failed:
        stream.execute(progress=False)
    message = str(failed.value)
    assert f"cannot import module {name!r}" in message
    assert f"ray.cloudpickle.register_pickle_by_value({name})" in message
    # What the message says to do works.
    ray.cloudpickle.register_pickle_by_value(module)
    try:
        table = stream.execute(progress=False).to_arrow()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert table.sort_by("a").to_pylist() == [{"a": a, "y": 1} for a in (1, 2, 3)]


_GUARD = threading.Lock()


@pytest.mark.parametrize("checkpoints", [None, 60_000], ids=["plain", "checkpointed"])
def test_a_function_that_cannot_be_pickled_fails_the_job_naming_it_and_leaves_no_actor(ray_session, tmp_path, checkpoints):
    import ray
    from ray.util.state import list_actors

    def stamp(row):
        with _GUARD:  # a global that cannot be pickled, taken along with the function
            return {**row, "stamped": True}

    # Stages are made from the last to the first: the map's two instances exist when the
    # first stage's actor cannot be sent.
    job = f"unpicklable-function-{'plain' if checkpoints is None else 'checkpointed'}"
    stream = (
        from_arrow([pa.table({"a": [1, 2, 3]})], parallelism=1, job_name=job)
        .map(stamp, name="stamp")
        .rebalance(2)
        .map(lambda row: row, name="after")
    )
    with pytest.raises(ConfigurationError) as failed:
        stream.execute(progress=False, checkpoint_interval_ms=checkpoints, checkpoint_dir=str(tmp_path))
    message = str(failed.value)
    assert message.startswith("operator 'stamp' cannot be sent to its actors: function ")
    assert "stamp refers to global '_GUARD', a _thread.lock: TypeError: cannot pickle '_thread.lock' object" in message

    def alive() -> list[str]:
        return [a.name for a in list_actors(address=ray.get_runtime_context().gcs_address,
                                            filters=[("state", "=", "ALIVE")], limit=10_000)
                if a.name.startswith(f"{job}/")]

    poll(lambda: not alive(), timeout_s=30)  # the stage after it was made, then killed


def test_an_async_generator_is_rejected_by_async_map_which_would_take_it_for_a_blocking_function(ray_session):
    async def streaming(value):
        yield [value]

    stream = from_arrow([pa.table({"a": [1]})], parallelism=1)
    with pytest.raises(ConfigurationError, match=r"streaming at 0x\w+> is an async generator"):
        stream.async_map(streaming)
