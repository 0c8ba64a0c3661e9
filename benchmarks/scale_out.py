"""Scale-out: throughput at parallelism 1, 2, 4 and 8 on one node and over three, the recovery from
the death of a node against the death of an actor, and the time to resume at another parallelism.

The cluster is three Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head and two
workers, each with its own raylet and object store), started by the benchmark. On a larger
machine, or with ``--address`` on a real cluster, the same code runs unchanged.

- **Throughput.** The enrichment that ``enrich()`` runs (``async_map`` of a call to the real HTTP
  service of ``examples/enrich_service.py``, 5 ms median latency, ``capacity=16`` per instance),
  and keyed windows (``key_by(user).window(5 s).count()``, the source read at the same
  parallelism and routed by key from there), each at parallelism 1, 2, 4 and 8:
  with every instance on the head node (``actor_resources``), and spread over the three nodes;
  records per second of the run phase (``JobResult.phases_s["run"]``: from every actor deployed
  to every actor drained), since the actors' start grows with their number. Efficiency per added
  instance: throughput at p ÷ (p × throughput at 1), per placement. A machine with 2 cores runs
  out of cores at 2 whatever the nodes: the curve is flat past 2 there, and falls as more
  processes share the two cores.
- **Recovery.** A checkpointed enrichment at parallelism 4, spread, under one kill: of a whole
  worker node (``ChaosMonkey(nodes=True)``), or of one actor; the seconds from the failure seen
  to the next attempt deployed (``JobResult.recoveries_s``), and the output compared row by row
  with the expected (lost, duplicated, unexpected). A killed node is replaced before the next run.
- **Rescale.** A keyed windowed job stops on a bad row at parallelism 2, leaving checkpoints, and
  resumes at 2 (the baseline), 3, 1 and 4; then, with 10, 100 and 1,000 times the keys and the
  window length (an open window for each key, so larger checkpoints), at 2 and 3: each
  resume's seconds against the checkpoint's size, and whether its output equals an uninterrupted
  run (``rescale_exact``).

    python -m benchmarks.scale_out [--quick] [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

import pyarrow as pa

from benchmarks.report import emit
from examples.enrich_service import EnrichmentService, http_session, lookup_user

PARALLELISMS = (1, 2, 4, 8)
USERS = 200


def _clicks(n: int, parts: int = 16, users: int = USERS) -> list[pa.Table]:
    table = pa.table({"click": list(range(n)), "user": [i % users for i in range(n)], "ts": [i * 10 for i in range(n)]})
    size = -(-n // parts)
    return [table.slice(i, size) for i in range(0, n, size)]


def _lookup(url: str) -> Any:
    async def call(row: dict[str, Any]) -> list[dict[str, Any]]:
        user = await lookup_user(http_session(), url, int(row["user"]))
        return [{"click": row["click"], "user": row["user"], "segment": user["segment"]}]

    return call


def _enrichment(job: str, n: int, parallelism: int, url: str) -> Any:
    from actorflow.cluster import from_arrow

    return from_arrow(_clicks(n), parallelism=min(parallelism, 4), batch_size=250, job_name=job).rebalance(
        parallelism).async_map(_lookup(url), capacity=16, parallelism=parallelism, ordered=False)


def _windows(job: str, n: int, parallelism: int, check: Any = None, source_parallelism: int = 2, users: int = USERS,
             window_ms: int = 5_000) -> Any:
    from actorflow.cluster import from_arrow
    from actorflow.operators.windows import TumblingEventTimeWindows

    stream = from_arrow(_clicks(n, users=users), parallelism=source_parallelism, batch_size=250, timestamp_column="ts",
                        job_name=job)
    if check is not None:
        stream = stream.map(check)
    return stream.key_by("user", parallelism=parallelism).window(TumblingEventTimeWindows.of(window_ms)).count()


def _run(stream: Any, on_head: bool, **options: Any) -> tuple[float, Any]:
    from actorflow.cluster.job import run_job

    started = time.perf_counter()
    if on_head:
        result = run_job(stream.graph, job_name=stream.job_name, progress=False, actor_resources={"head": 0.001})
    else:
        result = stream.execute(progress=False, **options)
    return time.perf_counter() - started, result


def throughput(n_enrich: int, n_windows: int, url: str) -> dict[str, Any]:
    figures: dict[str, Any] = {"enrich": {}, "windows": {}}
    for placement in ("one_node", "three_nodes"):
        for kind, n in (("enrich", n_enrich), ("windows", n_windows)):
            rates = {}
            for p in PARALLELISMS:
                job = f"bench-{kind}-{placement}-{p}"
                # Windows read the source at their own parallelism (each instance routes its split by
                # key over the others), so that every p runs the same plan.
                stream = _enrichment(job, n, p, url) if kind == "enrich" else _windows(job, n, p, source_parallelism=p)
                _, result = _run(stream, placement == "one_node")
                rows = result.to_arrow().num_rows
                expected = n if kind == "enrich" else len({(i % USERS, i * 10 // 5_000) for i in range(n)})
                if rows != expected:
                    raise AssertionError(f"{job}: {rows} rows out, expected {expected}")
                # The run phase only: the actors' start grows with their number, and is not throughput.
                rates[p] = round(n / result.phases_s["run"], 1)
                print(f"  {kind}, {placement.replace('_', ' ')}, parallelism {p}: {rates[p]:,.0f} records/s", flush=True)
            figures[kind][placement] = {
                "records_per_s": rates,
                "efficiency": {p: round(rates[p] / (p * rates[1]), 3) for p in PARALLELISMS},
            }
    return figures


def recovery(n: int, url: str, runs: int, cluster: Any) -> dict[str, Any]:
    from actorflow.cluster.chaos import ChaosMonkey, compare_outputs

    expected = pa.table({"click": list(range(n)), "user": [i % USERS for i in range(n)]})
    out: dict[str, Any] = {"node": [], "actor": [], "lost": 0, "duplicated": 0, "unexpected": 0, "node_kills": 0,
                           "actor_kills": 0}
    for run in range(runs):
        for kind in ("node", "actor"):
            job = f"bench-recover-{kind}-{run}"
            with tempfile.TemporaryDirectory(prefix="actorflow-scale-out-") as directory:
                with ChaosMonkey(job, every_s=2.0, max_kills=1, first_after_s=1.5, nodes=kind == "node", seed=run) as monkey:
                    result = _enrichment(job, n, 4, url).execute(progress=False, checkpoint_interval_ms=300,
                                                                 checkpoint_dir=directory)
            report = compare_outputs(expected, result.to_arrow().select(["click", "user"]), key="click")
            out["lost"] += report.lost
            out["duplicated"] += report.duplicated
            out["unexpected"] += report.unexpected
            out["node_kills"] += len(monkey.node_kills)
            out["actor_kills"] += len(monkey.kills) - len(monkey.node_kills)
            out[kind].extend(result.recoveries_s)
            if result.restarts != len(monkey.kills):
                raise AssertionError(f"{job}: {len(monkey.kills)} kill(s) but {result.restarts} restart(s): a kill "
                                     "landed after the job's end, and measured nothing")
            print(f"  {kind} kill {run + 1}: {len(monkey.kills)} kill(s), recovered in "
                  f"{[round(s, 2) for s in result.recoveries_s]} s; lost {report.lost}, duplicated {report.duplicated}",
                  flush=True)
            if kind == "node" and cluster is not None:
                _replace_dead_nodes(cluster)
    return out


def _replace_dead_nodes(cluster: Any) -> None:
    import ray

    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    for node in list(cluster.worker_nodes):
        if node.node_id not in alive:
            cluster.remove_node(node, allow_graceful=False)
            cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()


#: The rescale's state sizes: keys and window length grown together by each factor, so that each
#: key holds an open window when the job stops, and the checkpoint grows with the factor.
STATE_FACTORS = (1, 10, 100, 1_000)


def rescale(n: int) -> dict[str, Any]:
    from actorflow.cluster.checkpoints.storage import CheckpointStorage
    from actorflow.operators import JobFailedError

    breaks_at = int(n * 0.75)

    def checked(row: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.00005)
        if row["click"] == breaks_at:
            raise ValueError(f"bad row {row['click']}")
        return row

    cases = []
    # Every parallelism at the smallest state; at each larger one, 2 -> 2 (the baseline) and 2 -> 3.
    for factor in STATE_FACTORS:
        users, window_ms = USERS * factor, 5_000 * factor
        expected = Counter((i % users, i * 10 // window_ms * window_ms) for i in range(n))
        for after in (2, 3, 1, 4) if factor == 1 else (2, 3):
            job = f"bench-rescale-{factor}-{after}"
            with tempfile.TemporaryDirectory(prefix="actorflow-rescale-") as directory:
                try:
                    _windows(job, n, 2, checked, users=users, window_ms=window_ms).execute(
                        progress=False, checkpoint_interval_ms=200, checkpoint_dir=directory, max_restarts=0)
                except JobFailedError:
                    pass
                latest = CheckpointStorage(directory, job=job).latest()
                if latest is None:
                    raise AssertionError(f"{job}: the first run left no checkpoint")
                seconds, result = _run(_windows(job, n, after, lambda row: row, users=users, window_ms=window_ms), False,
                                       resume_from=f"{directory}/{job}")
            got = Counter({(r["user"], r["window_start"]): r["count"] for r in result.to_arrow().to_pylist()})
            exact = got == expected and result.to_arrow().num_rows == len(expected)
            cases.append({"from": 2, "to": after, "keys": users, "resume_s": round(seconds, 2),
                          "checkpoint_bytes": latest.size_bytes, "exact": exact})
            print(f"  {users:,} keys, resume 2 -> {after}: {seconds:.2f} s from a checkpoint of "
                  f"{latest.size_bytes:,} bytes; {'equal to' if exact else 'DIFFERENT from'} an uninterrupted run",
                  flush=True)
    for case in cases:
        base = next(c for c in cases if c["keys"] == case["keys"] and c["to"] == 2)
        case["vs_same_parallelism"] = round(case["resume_s"] / base["resume_s"], 2)
    return {"cases": cases, "exact": all(c["exact"] for c in cases)}


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rows and one kill of each kind")
    parser.add_argument("--address", default=None, help="a running Ray cluster of three nodes or more, with a 'head' resource on one")
    args = parser.parse_args()
    import ray

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"head": 1},
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                               "health_check_initial_delay_ms": 0}})
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
    else:
        ray.init(address=args.address)
    n_enrich, n_windows = (6_000, 40_000) if args.quick else (20_000, 200_000)
    try:
        with EnrichmentService(latency_ms_median=5, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0) as svc:
            print(f"{len(ray.nodes())} Ray nodes, {ray.cluster_resources().get('CPU', 0):g} CPUs in all", flush=True)
            scaling = throughput(n_enrich, n_windows, svc.url)
            # Long enough (about 10 s) for the kill to land while the job runs.
            recovered = recovery(40_000, svc.url, 1 if args.quick else 3, cluster)
        rescaled = rescale(n_windows // 2)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    emit("scale_out", {
        "benchmark": "scale_out", "quick": args.quick,
        "efficiency": {kind: {placement: figures["efficiency"] for placement, figures in per.items()}
                       for kind, per in scaling.items()},
        "throughput": scaling,
        "node_kills": recovered["node_kills"], "actor_kills": recovered["actor_kills"],
        "lost": recovered["lost"], "duplicated": recovered["duplicated"], "unexpected": recovered["unexpected"],
        "recovery_node_s_p50": _p50(recovered["node"]), "recovery_actor_s_p50": _p50(recovered["actor"]),
        "recovery_node_s": [round(s, 3) for s in recovered["node"]],
        "recovery_actor_s": [round(s, 3) for s in recovered["actor"]],
        "rescale_exact": rescaled["exact"], "rescale": rescaled["cases"],
    })


if __name__ == "__main__":
    main()
