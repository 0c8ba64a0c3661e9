"""Live metrics of an operator instance, exported through ``ray.util.metrics``.

Names fit Prometheus (``actorflow_records_in_total`` ...); Ray's metrics agent exports them with
its ``ray_`` prefix (``ray_actorflow_records_in_total``). Tags say which job, operator and
subtask. Every counter is published at zero when the instance starts, so that a dashboard
shows the series before the first event; the actor refreshes them about once a second, never
per record.
"""

from __future__ import annotations

from typing import Any

from ray.util import metrics as ray_metrics

__all__ = ["OperatorMetricsExporter"]

_TAG_KEYS = ("job", "operator", "subtask")
_COUNTERS = {
    "records_in": "Records that entered the operator instance",
    "records_out": "Records that left the operator instance",
    "retries": "Async request attempts that were retried",
    "timeouts": "Async requests that ran past their deadline",
    "dead_letters": "Records routed to the dead-letter output",
    "batches_in": "Arrow batches received",
    "late_records_dropped": "Records too late for every window, dropped without a side output",
    "late_behind_watermark": "Late records whose windows ended before the watermark, without allowed lateness",
    "late_past_allowed_lateness": "Late records whose windows ended longer ago than the allowed lateness",
    "late_window_closed": "Late records that would open again a session already emitted and cleaned up",
    "backpressured_ms": "Milliseconds the instance waited because downstream took no more output",
    "service_calls": "Calls that left for an async operator's service",
    "service_overloads": "Overload answers (429, 503) of the service",
    "service_pauses": "Overload answers with a Retry-After, which paused every call to the service",
    "service_quota_granted": "Call times the service's rate quota leased to the instance",
    "service_quota_unused": "Leased call times that passed unused (dropped, never used late)",
    "service_breaker_opens": "Times the service's circuit breaker opened",
    "service_breaker_rejections": "Attempts ended without a call because the breaker was open",
    "service_probes": "Calls let through while the breaker was half-open",
    "service_cache_hits": "Records answered from the lookup cache, without a call",
    "service_merged": "Records that waited for a call in flight for the same key instead of calling",
    "service_hedges": "Second calls started for slow calls (Hedge)",
    "service_hedge_wins": "Second calls that answered before the first",
}
_GAUGES = {
    "in_flight_requests": "Async requests in flight",
    "async_queue_depth": "Elements in the async queue, watermarks included",
    "input_queue_depth": "Batches waiting in the input gate",
    "mailbox_depth": "Mails waiting in the mailbox",
    "outbox_depth": "Batches waiting to be sent downstream",
    "watermark_ms": "The operator's current event-time watermark",
    "watermark_lag_ms": "Wall-clock time minus the current watermark",
    "restarts": "Times this operator instance was restarted",
    "oldest_mail_age_ms": "How long the mail that has waited longest in the mailbox has waited",
    "suspended_backpressure": "1 while the input waits because downstream takes no more output",
    "suspended_async_queue_full": "1 while the input waits because an async operator's queue is full",
    "suspended_barrier_alignment": "1 while some input channels wait for a checkpoint barrier on the others",
    "suspended_finishing": "1 while the ended input waits for the last requests and timers",
    "service_concurrency_limit": "Calls the service may have in flight from the instance now (adaptive with capacity='auto')",
    "service_breaker_state": "The service's circuit breaker: 0 closed, 1 open, 2 half-open",
    "service_rate_limit": "The service's rate limit, in calls per second for all the instances (0: none)",
}

_registry: dict[str, Any] = {}


def _metric(kind: str, name: str, description: str) -> Any:
    # One metric object per name per process: Ray warns on re-registration.
    key = f"{kind}:{name}"
    if key not in _registry:
        cls = ray_metrics.Counter if kind == "counter" else ray_metrics.Gauge
        _registry[key] = cls(f"actorflow_{name}" + ("_total" if kind == "counter" else ""), description, tag_keys=_TAG_KEYS)
    return _registry[key]


class OperatorMetricsExporter:
    """Turns absolute figures into Ray counter increments and gauge values."""

    def __init__(self, job: str, operator: str, subtask: str) -> None:
        self._tags = {"job": job, "operator": operator, "subtask": subtask}
        self._last: dict[str, float] = {}
        for name, description in _COUNTERS.items():
            # Counter.inc() refuses 0; recording it makes the series exist from the start.
            _metric("counter", name, description)._record(0.0, tags=self._tags)

    def export(self, figures: dict[str, float]) -> None:
        for name, description in _COUNTERS.items():
            value = figures.get(name, 0)
            delta = value - self._last.get(name, 0)
            if delta > 0:
                _metric("counter", name, description).inc(delta, tags=self._tags)
            self._last[name] = value
        for name, description in _GAUGES.items():
            if name in figures and figures[name] is not None:
                _metric("gauge", name, description).set(float(figures[name]), tags=self._tags)
