"""The guide "Services that push back" runs as written, against the real service it starts, and
its figures are what that service saw."""

from __future__ import annotations

from examples.enrich_service import user_profile
from tests.docs import run_page


def test_the_services_guide_adapts_limits_and_breaks_against_a_real_service(spark):
    ns = run_page("docs/guides/services.md", {"spark": spark}, replace={"af.spark_session()": "spark"})
    service = ns["service"]
    stats = service.stats()

    # Adaptive capacity: every click enriched, right, although the service turned calls away.
    rows = ns["enriched"].collect()
    assert sorted(r.click_id for r in rows) == list(range(2_000))
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    assert stats["rejected_429"] > 0
    [summary] = [o for o in ns["job"].operators if o.services]
    assert 9 <= summary.services["enrich"]["service_concurrency_limit"] <= 15  # close to the service's 12

    # The rate limit: all 120 rows (its busiest second: tests/spark_bridge/test_enrich_service_spark.py).
    assert ns["limited"].count() == 120

    # The breaker: the outage's rows are dead letters or the fallback, and the service saw the
    # calls that opened the breaker and its probes, not one call per row.
    enriched_rows, dead = ns["during_outage"]
    segments = {r.segment for r in enriched_rows.collect()}
    assert segments <= {"unknown"}
    assert enriched_rows.count() + dead.count() == 200
    assert {r.error_type for r in dead.collect()} <= {"TransientServiceError"}
    assert stats["outage_requests"] <= 8 + 4 + 2  # the 8 in flight, 4 more as the first failures freed slots, probes

    # Hedging: every row once; each second call was counted, and some answered first.
    assert ns["hedged"].count() == 400
    [summary] = [o for o in ns["hedge_job"].operators if o.services]
    hedges = summary.services["enrich"]
    assert hedges["service_hedges"] > 0 and hedges["service_hedge_wins"] > 0
    assert hedges["service_calls"] == 400 + hedges["service_hedges"]
    assert 400 <= ns["slow_tail"].stats()["requests"] <= 400 + hedges["service_hedges"]

    # Dead letters sent again: the six rows of user 3, each with the key of its first request.
    again = ns["again"].collect()
    assert sorted(r.click_id for r in again) == [3, 100, 197, 294, 391, 488]
    assert all(r.segment == user_profile(3)["segment"] for r in again)
    calls = ns["shard"].calls_by_key()
    failed_keys = {r.request_key for r in ns["failed"].collect()}
    assert len(failed_keys) == 6 and all(calls[k] == 2 for k in failed_keys)
    assert set(ns["shard"].answered_by_key().values()) == {1}

    # The cache: one call per user for 2,000 rows, as the second service counted them.
    calls = ns["lookups"].calls_by_user()
    assert set(calls) == set(range(97)) and set(calls.values()) == {1}
    cached = ns["cached"].collect()
    assert sorted(r.click_id for r in cached) == list(range(2_000))  # each row its own, not its user's first
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in cached)
    figures = ns["figures"]
    assert (figures["service_calls"], figures["service_cache_hits"] + figures["service_merged"]) == (97, 1_903)
