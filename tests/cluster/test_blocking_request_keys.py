"""Blocking functions read the idempotency key of their request in the worker's thread.

The worker's side (``run_calls``) is a plain generator function and runs here as it would in a
Ray task; the actor's side runs on a local event loop, with a stand-in for ``ray.remote`` that
runs ``run_calls`` in place. No Ray is started.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import ray

from actorflow.actors.batch_task_function import RayBatchTaskFunction
from actorflow.actors.task_function import RayTaskFunction, run_calls
from actorflow.operators import ResultFuture, current_request_key, current_request_keys


def lookup(value: Any) -> list[Any]:
    return [(value, current_request_key(), current_request_keys(), threading.current_thread().name)]


def outcomes(chunks: Any) -> dict[int, Any]:
    return {index: payload if ok else repr(payload) for chunk in chunks for index, ok, payload in chunk}


def test_each_call_runs_in_a_worker_thread_with_its_own_keys():
    values = ["a", "b", "c"]
    keys = [("job/enrich/0.1", None), ("job/enrich/#7", None), (None, ["job/score/0", "job/score/1"])]
    results = outcomes(run_calls(lookup, values, keys))
    assert {i: r[0][:3] for i, r in results.items()} == {
        0: ("a", "job/enrich/0.1", None),
        1: ("b", "job/enrich/#7", None),
        2: ("c", None, ["job/score/0", "job/score/1"]),
    }
    assert all(r[0][3].startswith("actorflow-blocking") for r in results.values())


def test_a_worker_thread_keeps_no_key_from_the_call_it_served_before():
    for _ in range(3):  # the pool's threads are reused from call to call
        assert outcomes(run_calls(lookup, ["a"], [("k/1", None)]))[0][0][1] == "k/1"
    results = outcomes(run_calls(lookup, list(range(8))))  # without keys, as the warm-up sends
    assert {r[0][1] for r in results.values()} == {None}
    assert current_request_key() is None


class _InPlace:
    """Stands in for ``ray.remote(run_calls).options(...)``: runs the task here, streams its chunks."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], Any]] = []

    def options(self, **_: Any) -> "_InPlace":
        return self

    def remote(self, fn: Any, values: list[Any], keys: Any = None) -> Any:
        self.calls.append((values, keys))
        chunks = list(run_calls(fn, values, keys))

        async def stream() -> Any:
            for chunk in chunks:
                future = asyncio.get_running_loop().create_future()
                future.set_result(chunk)
                yield future

        return stream()


class _Context:
    name = "job/enrich[0/1]"
    mailbox_executor = None


def run_requests(function: Any, invoke: str, requests: list[tuple[Any, ResultFuture]], monkeypatch: Any) -> None:
    remote = _InPlace()
    monkeypatch.setattr(ray, "put", lambda obj: obj)
    monkeypatch.setattr(ray, "remote", lambda fn: remote)

    async def main() -> None:
        function.open(_Context())
        for value, future in requests:
            getattr(function, invoke)(value, future)
        for _ in range(100):
            if all(future.done for _, future in requests):
                break
            await asyncio.sleep(0)
        function.close()

    asyncio.run(main())


def test_a_blocking_function_reads_the_key_of_each_record(monkeypatch):
    results: dict[str, Any] = {}

    def request(value: str, key: str) -> tuple[str, ResultFuture]:
        return value, ResultFuture(lambda r, e: results.__setitem__(value, (r, e)), key)

    function = RayTaskFunction(lookup, capacity=4, max_tasks=1, linger_ms=0.0)
    run_requests(function, "async_invoke", [request("a", "p/0.1"), request("b", "p/#1")], monkeypatch)
    assert {v: (r[0][:3], e) for v, (r, e) in results.items()} == {
        "a": (("a", "p/0.1", None), None),
        "b": (("b", "p/#1", None), None),
    }


def test_a_blocking_batch_function_reads_the_keys_of_its_batch(monkeypatch):
    seen: list[Any] = []

    def score(values: list[Any]) -> list[list[Any]]:
        seen.append((values, current_request_key(), current_request_keys()))
        return [[v] for v in values]

    outcome: list[Any] = []
    future = ResultFuture(lambda r, e: outcome.append((r, e)), idempotency_keys=["p/0", "p/#1"])
    run_requests(RayBatchTaskFunction(score, capacity=1), "async_invoke_batch", [(["a", "b"], future)], monkeypatch)
    assert seen == [(["a", "b"], None, ["p/0", "p/#1"])]
    assert outcome == [([["a"], ["b"]], None)]
