"""enrich() that knows its service, against a real HTTP service on 127.0.0.1: adaptive capacity
under 429s with Retry-After, a rate limit for all the instances, and a circuit breaker during an
outage. Each row gets exactly one outcome, and last_job() counts what the service saw."""

from __future__ import annotations

import pytest

from examples.enrich_service import EnrichmentService, http_session, lookup_user, user_profile
from actorflow.operators.service import CircuitBreaker, Hedge, LookupCache, Service
from actorflow.spark_bridge import enrich, last_job


def _clicks(spark, n):
    from pyspark.sql import functions as F

    return spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 97)


def _lookup(url):
    async def segment(row):
        user = await lookup_user(http_session(), url, row["user_id"])
        return {"segment": user["segment"]}

    return segment


def _service_figures(name="enrich"):
    [summary] = [o for o in last_job().operators if o.services]
    return summary.services[name]


def test_capacity_auto_takes_what_the_service_can_and_sends_every_429_again(spark):
    with EnrichmentService(latency_ms_median=10, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0,
                           capacity=12, retry_after_s=0.05) as service:
        out, dead = enrich(_clicks(spark, 1_500), _lookup(service.url), capacity="auto", parallelism=2,
                           on_error="dead_letter", timeout_ms=60_000, progress=False)
        rows = out.collect()
        stats = service.stats()
    assert dead.count() == 0
    assert sorted(r.click_id for r in rows) == list(range(1_500))  # each row once
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    figures = _service_figures()
    # What the operator counted is what the service saw: every call, and every 429 among them.
    assert stats["rejected_429"] > 0  # it did run into the service's capacity
    assert figures["service_overloads"] == stats["rejected_429"]
    assert figures["service_calls"] == stats["requests"] == 1_500 + stats["rejected_429"]
    assert figures["service_pauses"] == stats["rejected_429"]  # each 429 said Retry-After
    assert 2 <= figures["service_concurrency_limit"] <= 2 * 256


def test_a_rate_limit_holds_for_all_the_instances_together(spark):
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as service:
        out = enrich(_clicks(spark, 120), _lookup(service.url), service=Service(rate_limit=40), parallelism=2,
                     timeout_ms=60_000, progress=False)
        assert out.count() == 120
        busiest = service.busiest_second()
        arrivals = service.arrival_times()
    # Never more than the quota in any second, for the two instances together, but for a call
    # that left up to 20 ms after its time (and the network's jitter): within 5 %.
    assert busiest <= 40 * 1.05
    spread_s = arrivals[-1] - arrivals[0]
    assert spread_s >= (120 - 40) / 40  # and so the 120 calls took about 3 s
    figures = _service_figures()
    assert figures["service_rate_limit"] == 40
    assert figures["service_calls"] == 120
    assert figures["service_quota_granted"] - figures["service_quota_unused"] >= 120


def test_the_breaker_stops_calling_a_service_that_is_down_and_the_rows_become_dead_letters(spark):
    breaker = CircuitBreaker(failures=4, window_s=10, open_s=0.5, when_open="fail")
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as service:
        service.set_outage(True)
        out, dead = enrich(_clicks(spark, 400), _lookup(service.url), service=Service(breaker=breaker, overload_retries=0),
                           capacity=8, parallelism=1, on_error="dead_letter", timeout_ms=60_000, progress=False)
        letters = dead.collect()
        stats = service.stats()
    assert out.count() == 0
    assert sorted(r.click_id for r in letters) == list(range(400))  # every row, once
    kinds = {r.error_type for r in letters}
    assert kinds == {"TransientServiceError", "CircuitOpenError"}
    not_sent = [r for r in letters if r.error_type == "CircuitOpenError"]
    assert all("circuit breaker of enrich is open" in r.error for r in not_sent)
    figures = _service_figures()
    # The service saw the failures that opened the breaker and the probes after it: the other
    # rows never reached it.
    assert stats["outage_requests"] == stats["requests"] == figures["service_calls"]
    # At most the 8 in flight, the 3 that started as the first 3 failures freed their slots, and
    # the probes.
    assert figures["service_calls"] <= 8 + 3 + figures["service_probes"]
    assert figures["service_breaker_rejections"] == len(not_sent)
    assert figures["service_breaker_opens"] >= 1


def test_a_lookup_cache_calls_the_service_once_per_user(spark):
    cache = LookupCache(key="user_id", ttl_s=600)
    with EnrichmentService(latency_ms_median=5, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0) as service:
        out = enrich(_clicks(spark, 2_000), _lookup(service.url), service=Service(cache=cache), capacity=20,
                     parallelism=2, timeout_ms=60_000, progress=False)
        rows = out.collect()
        calls = service.calls_by_user()
    assert sorted(r.click_id for r in rows) == list(range(2_000))
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    # 97 users, two instances, each with a cache of its own: at most one call per user each.
    assert set(calls) == set(range(97)) and max(calls.values()) <= 2
    figures = _service_figures()
    assert figures["service_calls"] == sum(calls.values())
    assert figures["service_calls"] + figures["service_cache_hits"] + figures["service_merged"] == 2_000


def test_hedged_calls_against_a_slow_tail_give_each_row_one_outcome(spark):
    with EnrichmentService(latency_ms_median=5, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0,
                           tail_rate=0.05, tail_ms=3_000) as service:
        out = enrich(_clicks(spark, 600), _lookup(service.url), service=Service(hedge=Hedge(after_ms=150)),
                     capacity=50, parallelism=2, timeout_ms=60_000, progress=False)
        rows = out.collect()
        stats = service.stats()
    assert sorted(r.click_id for r in rows) == list(range(600))
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    figures = _service_figures()
    # About 5 % of the calls were slow; each got a second call, and most of those answered first.
    assert stats["tails"] > 0 and figures["service_hedges"] >= stats["tails"] // 2
    assert figures["service_hedge_wins"] > 0
    assert figures["service_calls"] == 600 + figures["service_hedges"]
    assert 600 <= stats["requests"] <= figures["service_calls"]


def test_a_breaker_that_answers_with_the_fallback_needs_one(spark):
    from actorflow.operators import ConfigurationError

    with pytest.raises(ConfigurationError, match="when_open='fallback'"):
        enrich(_clicks(spark, 3), _lookup("http://127.0.0.1:9"),
               service=Service(breaker=CircuitBreaker(when_open="fallback")), progress=False)


def test_two_operators_keep_the_limits_of_their_two_services_apart(ray_session):
    import pyarrow as pa

    from actorflow.cluster import from_arrow

    def call(url, column):
        async def fn(row):
            user = await lookup_user(http_session(), url, row["id"] % 50)
            return [{**row, column: user["segment"]}]

        return fn

    with EnrichmentService(latency_ms_median=5, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0, capacity=5) as a, \
            EnrichmentService(latency_ms_median=5, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0, capacity=3) as b:
        stream = (from_arrow([pa.table({"id": list(range(400))})], parallelism=1, job_name="two-services")
                  .async_map(call(a.url, "a"), service=Service(capacity=5), capacity=50, name="first")
                  .async_map(call(b.url, "b"), service=Service(capacity=3), capacity=50, name="second"))
        out = stream.execute(progress=False).to_arrow().to_pylist()
        stats_a, stats_b = a.stats(), b.stats()
    assert sorted(r["id"] for r in out) == list(range(400))
    assert all(r["a"] == r["b"] == user_profile(r["id"] % 50)["segment"] for r in out)
    # Each gate held its own service's limit: neither service turned a call away.
    assert (stats_a["requests"], stats_a["rejected_429"]) == (400, 0)
    assert (stats_b["requests"], stats_b["rejected_429"]) == (400, 0)
