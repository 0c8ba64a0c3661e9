"""Several Ray nodes: a job's instances spread over them, channels and blocks cross them, and the
death of a whole worker node (its raylet, its actors, its object store) is recovered exactly once.

The cluster is three Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head and two
workers, each with its own raylet and object store), in this pytest's own process; it shares
nothing with the session's Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
import ray
from ray.cluster_utils import Cluster

from actorflow.cluster import from_arrow
from actorflow.cluster.chaos import ChaosMonkey, compare_outputs
from actorflow.cluster.job import run_job
from actorflow.operators import ConfigurationError
from actorflow.operators.windows import TumblingEventTimeWindows

pytestmark = pytest.mark.processes

USERS = 50


@pytest.fixture(scope="module")
def three_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"slot": 2, "head": 1},
        # A dead node is noticed within about two seconds.
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           "health_check_initial_delay_ms": 0},
    })
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"slot": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    _until_the_scheduler_sees(3)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _until_the_scheduler_sees(nodes: int) -> None:
    """Wait until tasks spread over ``nodes`` nodes: the GCS lists a node that joined a moment
    before the raylets' view of the cluster holds it, and until then Ray places every actor on
    the driver's node, SPREAD or not."""

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    deadline = time.monotonic() + 60
    while len(set(ray.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(3 * nodes)]))) < nodes:
        assert time.monotonic() < deadline, f"Ray did not place tasks on {nodes} nodes within 60 s"
        time.sleep(0.5)


def _clicks(n: int) -> list[pa.Table]:
    table = pa.table({"click": list(range(n)), "user": [i % USERS for i in range(n)], "ts": [i * 10 for i in range(n)]})
    return [table.slice(i, 2_000) for i in range(0, n, 2_000)]


async def _enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.002)
    return [{**row, "score": row["click"] * 3 + 1, "node": ray.get_runtime_context().get_node_id()}]


def _enrichment(job: str, n: int, parallelism: int = 4) -> Any:
    return from_arrow(_clicks(n), parallelism=2, batch_size=200, job_name=job).rebalance(parallelism).async_map(
        _enrich, capacity=10, parallelism=parallelism)


def _windows(job: str, n: int) -> Any:
    return (from_arrow(_clicks(n), parallelism=2, batch_size=200, timestamp_column="ts", job_name=job)
            .async_map(_enrich, capacity=10)
            .key_by("user", parallelism=3)
            .window(TumblingEventTimeWindows.of(5_000))
            .count())


def _counts(table: pa.Table) -> Counter:
    return Counter({(r["user"], r["window_start"]): r["count"] for r in table.to_pylist()})


def _expected_counts(n: int) -> Counter:
    return Counter((i % USERS, (i * 10) // 5_000 * 5_000) for i in range(n))


def _rows(table: pa.Table) -> list[tuple[int, int, int]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("click", "user", "score"))))


def test_instances_spread_over_the_nodes_and_give_the_rows_of_a_single_node_run(three_nodes):
    n = 12_000
    spread = _enrichment("spread", n).execute(progress=False).to_arrow()
    on_head = run_job(_enrichment("on-head", n).graph, progress=False, actor_resources={"head": 0.01}).to_arrow()
    assert len(set(spread.column("node").to_pylist())) == 3  # four instances: one node or two each
    assert len(set(on_head.column("node").to_pylist())) == 1
    assert _rows(spread) == _rows(on_head) == [(i, i % USERS, i * 3 + 1) for i in range(n)]
    # Keyed windows: records cross nodes by key, and each window is counted once, whole.
    windows = _windows("spread-windows", n).execute(progress=False).to_arrow()
    single = run_job(_windows("head-windows", n).graph, progress=False, actor_resources={"head": 0.01}).to_arrow()
    assert _counts(windows) == _counts(single) == _expected_counts(n)


@pytest.mark.parametrize("moment", [None, "snapshot", "queue_full"])
def test_a_job_recovers_exactly_once_from_the_death_of_a_node(three_nodes, tmp_path, moment):
    n = 60_000
    job = f"node-kill-{moment or 'any'}"
    expected = pa.table({"click": list(range(n)), "user": [i % USERS for i in range(n)],
                         "score": [i * 3 + 1 for i in range(n)]})
    with ChaosMonkey(job, every_s=2.0, max_kills=1, first_after_s=1.0, nodes=True, moment=moment, seed=1) as monkey:
        # Eight instances over three nodes: some on the one a kill may take (not the driver's,
        # nor the head's), wherever the driver's process attached.
        result = _enrichment(job, n, parallelism=6).execute(progress=False, checkpoint_interval_ms=200,
                                                             checkpoint_dir=str(tmp_path))
    actual = result.to_arrow().select(["click", "user", "score"])
    report = compare_outputs(expected, actual, key="click")
    report.kills, report.node_kills, report.restarts = monkey.kills, monkey.node_kills, result.restarts
    assert report.exact, report.lines()
    assert len(monkey.node_kills) == 1 and result.restarts == 1, (monkey.node_kills, result.failures, monkey.failed_strikes)
    assert report.summary()["node_kills"] == 1 and "killed node" in "\n".join(report.lines())
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(alive) == 2  # the node is gone for good; the job finished on the other two
    # For the next test: the dead node's place taken by a new one.
    for node in list(three_nodes.worker_nodes):
        if node.node_id not in alive:
            three_nodes.remove_node(node, allow_graceful=False)
    three_nodes.add_node(num_cpus=2, resources={"slot": 2})
    three_nodes.wait_for_nodes()
    _until_the_scheduler_sees(3)


def test_too_few_nodes_left_for_the_job_s_resources_is_an_error_naming_them(three_nodes):
    # Each node offers two slots: six instances that each want one fit, eight do not.
    stream = _enrichment("too-big", 4_000, parallelism=6)
    with pytest.raises(ConfigurationError, match=r"needs 8 instances of 1 slot each, and the 3 live node\(s\) of "
                                                 r"the cluster have room for 6 \(.*slot 2.*\)"):
        run_job(stream.graph, progress=False, actor_resources={"slot": 1})


def test_the_service_calls_of_instances_killed_on_any_node_are_counted_once(three_nodes, tmp_path):
    from actorflow.operators.service import Service
    from examples.enrich_service import EnrichmentService, http_session, lookup_user

    def segment_from(url: str) -> Any:
        async def segment(row: dict[str, Any]) -> list[dict[str, Any]]:
            user = await lookup_user(http_session(), url, row["click"] % USERS)
            return [{**row, "segment": user["segment"]}]

        return segment

    n = 600
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        segment = segment_from(svc.url)
        stream = from_arrow(_clicks(n), parallelism=2, batch_size=50, job_name="node-counts").rebalance(4).async_map(
            segment, service=Service(rate_limit=150), capacity=20, timeout_ms=60_000, parallelism=4)
        with ChaosMonkey("node-counts", every_s=1.0, max_kills=2, first_after_s=1.0, seed=2) as monkey:
            result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
        stats = svc.stats()
    assert sorted(r["click"] for r in result.to_arrow().to_pylist()) == list(range(n))
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    figures = [f for o in result.operators for f in o.services.values()][0]
    # The killed instances' counters are read on each machine once (nodes on one machine share
    # its files): every call the service received, and at most the 20 in flight per kill more.
    assert stats["requests"] <= figures["service_calls"] <= stats["requests"] + 20 * len(monkey.kills)
