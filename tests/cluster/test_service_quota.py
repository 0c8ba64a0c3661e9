"""A service's rate quota and pauses on Ray: one quota actor per job and service, shared by every
instance and by every operator that names the service, against a real HTTP service."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
import ray

from actorflow.cluster import from_arrow
from actorflow.cluster.chaos import ChaosMonkey
from actorflow.operators import ConfigurationError
from actorflow.operators.service import Service
from examples.enrich_service import EnrichmentService, http_session, lookup_user, user_profile

pytestmark = pytest.mark.ray


def _call(url, column):
    async def fn(row):
        user = await lookup_user(http_session(), url, row["id"] % 50)
        return [{**row, column: user["segment"]}]

    return fn


def _tables(n, parts):
    return [pa.table({"id": list(range(i, n, parts))}) for i in range(parts)]


def test_two_operators_that_name_one_service_share_its_quota(ray_session):
    quota = Service(name="profiles", rate_limit=40)
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        stream = (from_arrow(_tables(60, 2), parallelism=2, job_name="shared-quota")
                  .async_map(_call(svc.url, "a"), service=quota, capacity=20, name="first")
                  .async_map(_call(svc.url, "b"), service=quota, capacity=20, name="second"))
        result = stream.execute(progress=False)
        out = result.to_arrow().to_pylist()
        busiest, arrivals = svc.busiest_second(), svc.arrival_times()
    assert sorted(r["id"] for r in out) == list(range(60))
    assert all(r["a"] == r["b"] == user_profile(r["id"] % 50)["segment"] for r in out)
    # 120 calls, 40 a second for the two operators' four instances together: 3 s at least.
    assert len(arrivals) == 120
    assert busiest <= 40 * 1.05  # the quota, but for a call that left up to 20 ms late
    assert arrivals[-1] - arrivals[0] >= (120 - 40) / 40
    services = {name: figures for o in result.operators for name, figures in o.services.items()}
    assert services["profiles"]["service_rate_limit"] == 40
    assert not [name for name in ray.util.list_named_actors(all_namespaces=True) if "shared-quota" in str(name)]


def test_one_service_with_two_rate_limits_does_not_start(ray_session):
    stream = (from_arrow(_tables(4, 1), parallelism=1, job_name="two-rates")
              .async_map(_call("http://127.0.0.1:9", "a"), service=Service(name="profiles", rate_limit=40))
              .async_map(_call("http://127.0.0.1:9", "b"), service=Service(name="profiles", rate_limit=10)))
    with pytest.raises(ConfigurationError, match=r"'profiles' is called with two rate limits, 40 calls/s and 10 calls/s"):
        stream.execute(progress=False)


def test_a_retry_after_answered_to_one_instance_pauses_them_all(ray_session):
    n = 1_500
    with EnrichmentService(latency_ms_median=5, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        def refuse_one() -> None:
            while len(svc.arrival_times()) < 200:  # every instance is calling by then
                time.sleep(0.005)
            svc.refuse_next(1, retry_after_s=1.0)

        thread = threading.Thread(target=refuse_one, daemon=True)
        thread.start()
        stream = from_arrow(_tables(n, 4), parallelism=4, job_name="shared-pause").async_map(
            _call(svc.url, "segment"), service=Service(capacity=4), capacity=8, timeout_ms=60_000)
        result = stream.execute(progress=False)
        thread.join()
        out = result.to_arrow().to_pylist()
        [refused] = svc.refusal_times()
        arrivals = svc.arrival_times()
    assert sorted(r["id"] for r in out) == list(range(n))  # the refused row was sent again: each once
    # One instance was told to wait a second; the pause reached the others through the quota
    # actor (two hops: within 0.3 s even on a busy machine, where the calls on their way until
    # then still arrive). Without it the other three would send hundreds of calls meanwhile.
    during = [round(t - refused, 3) for t in arrivals if refused + 0.3 < t < refused + 0.95]
    assert during == []
    assert any(t >= refused + 0.95 for t in arrivals)  # and they all went on after it
    figures = [figures for o in result.operators for figures in o.services.values()][0]
    assert figures["service_pauses"] == 1  # one instance got the answer
    assert figures["service_calls"] == n + 1


def test_service_counts_stay_exact_across_kills_and_the_quota_holds_after_each_restore(ray_session, tmp_path):
    n = 500
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        stream = from_arrow(_tables(n, 4), parallelism=2, job_name="chaos-quota").async_map(
            _call(svc.url, "segment"), service=Service(rate_limit=100), capacity=20, timeout_ms=60_000)
        with ChaosMonkey("chaos-quota", every_s=1.2, max_kills=2, first_after_s=1.0, seed=5) as monkey:
            result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
        stats, busiest = svc.stats(), svc.busiest_second()
    out = result.to_arrow().to_pylist()
    assert sorted(r["id"] for r in out) == list(range(n))  # each row once
    assert len(monkey.kills) >= 1 and result.restarts == len(monkey.kills), (monkey.kills, result.failures)
    # The restarted instances leased from the same quota: no second over it, before or after.
    assert busiest <= 100 * 1.05
    figures = [f for o in result.operators for f in o.services.values()][0]
    # Every call the service received is counted, those of the killed instances too (their
    # counters outlive them), although the kills made some rows call again. A call counts as it
    # starts: one that a killed instance started but had not sent yet is counted too (at most
    # its 20 in flight per kill).
    assert stats["requests"] <= figures["service_calls"] <= stats["requests"] + 20 * len(monkey.kills)
    assert stats["requests"] >= n


def test_a_quota_actor_killed_for_good_fails_its_attempt_and_the_restart_starts_it_anew(ray_session, tmp_path):
    n = 1_500
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        def kill_the_quota() -> None:
            while len(svc.arrival_times()) < 100:
                time.sleep(0.01)
            ray.kill(ray.get_actor("quota-gone/service:async_map", namespace="actorflow"), no_restart=True)

        thread = threading.Thread(target=kill_the_quota, daemon=True)
        thread.start()
        stream = from_arrow(_tables(n, 2), parallelism=2, job_name="quota-gone").async_map(
            _call(svc.url, "segment"), service=Service(rate_limit=200), capacity=20, timeout_ms=120_000)
        result = stream.execute(progress=False, checkpoint_interval_ms=300, checkpoint_dir=str(tmp_path))
        thread.join()
        busiest = svc.busiest_second()
    assert sorted(r["id"] for r in result.to_arrow().to_pylist()) == list(range(n))
    assert result.restarts >= 1
    assert any("quota actor of service 'async_map' is gone" in f for f in result.failures), result.failures
    assert busiest <= 200 * 1.05
