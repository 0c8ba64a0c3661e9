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

    # The rate limit: 120 rows, at most 40 calls (and the burst) in any second.
    assert ns["limited"].count() == 120

    # The breaker: the outage's rows are dead letters or the fallback, and the service saw the
    # calls that opened the breaker and its probes, not one call per row.
    enriched_rows, dead = ns["during_outage"]
    segments = {r.segment for r in enriched_rows.collect()}
    assert segments <= {"unknown"}
    assert enriched_rows.count() + dead.count() == 200
    assert {r.error_type for r in dead.collect()} <= {"TransientServiceError"}
    [summary] = [o for o in ns["af"].last_job().operators if o.services]
    figures = summary.services["enrich"]
    # At most the 8 in flight, the 4 that started as the first 4 failures freed their slots, and
    # the probes.
    assert stats["outage_requests"] == figures["service_calls"] <= 8 + 4 + figures["service_probes"]
    assert figures["service_breaker_rejections"] == enriched_rows.count()
