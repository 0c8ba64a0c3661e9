"""A finished job as a person reads it: one line of text, or a table in a notebook.

``JobResult.__repr__`` and ``JobResult._repr_html_`` use these, so that a job shows itself in a
notebook cell:

>>> from actorflow.cluster.job import JobResult
>>> figures = [{"name": "clicks/enrich[0/2]", "records_in": 600, "records_out": 600},
...            {"name": "clicks/enrich[1/2]", "records_in": 400, "records_out": 390, "dead_letters": 10}]
>>> JobResult("clicks", [], [], {}, input_rows=1_000, output_rows=990, elapsed_s=2.0, figures=figures)
JobResult('clicks': finished in 2.0 s, 1,000 records in, 990 out, 500 records/s, operators enrich[2], 10 dead letters, no restarts, checkpoints off)

Every text taken from the job (its name, operator names, failures) is escaped in the HTML.
"""

from __future__ import annotations

import datetime
import html
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import JobResult

__all__ = ["OperatorSummary", "job_html", "job_text", "late_reasons", "operator_summaries", "watermark_cause"]

_LATE_REASONS = ("behind_watermark", "past_allowed_lateness", "window_closed")

# An instance's name: <job>/<operator>[<i>/<n>], and @<attempt> after a restart.
_INSTANCE = re.compile(r"^(?P<operator>.+)\[(?P<index>\d+)/(?P<parallelism>\d+)\](?:@\d+)?$")


@dataclass
class OperatorSummary:
    """One operator (a chain of fused operators, or a source) over all of its instances."""

    name: str
    parallelism: int
    records_in: int | None = None  # None for a source, which reads its records
    records_out: int = 0
    dead_letters: int = 0
    retries: int = 0
    timeouts: int = 0
    last_watermark_ms: int | None = None  # the minimum over its instances that had one
    #: Late records of its windows by reason (``operators.windows.LateReason``), where any came.
    late_records: dict[str, int] = field(default_factory=dict)
    #: Per service its async operators call (``af.Service``): the ``service_*`` figures, counters
    #: summed over the instances, the concurrency limit summed, the breaker's worst state, the
    #: service's rate limit.
    services: dict[str, dict[str, float]] = field(default_factory=dict)


_GAUGES_OF_THE_SERVICE = ("service_breaker_state", "service_rate_limit")  # the same for every instance: the max


def operator_summaries(job: str, figures: list[dict[str, Any]]) -> list[OperatorSummary]:
    """The instances' figures summed per operator, in the order of the figures (sources first).

    >>> operator_summaries("j", [{"name": "j/source[0/1]", "rows_sent": 5},
    ...                          {"name": "j/map+enrich[0/1]@2", "records_in": 5, "records_out": 4}])
    [OperatorSummary(name='source', parallelism=1, records_in=None, records_out=5, dead_letters=0, retries=0, timeouts=0, last_watermark_ms=None, late_records={}, services={}), OperatorSummary(name='map+enrich', parallelism=1, records_in=5, records_out=4, dead_letters=0, retries=0, timeouts=0, last_watermark_ms=None, late_records={}, services={})]
    """
    operators: dict[str, OperatorSummary] = {}
    for figure in figures:
        name = str(figure.get("name", ""))
        name = name[len(job) + 1:] if name.startswith(job + "/") else name
        match = _INSTANCE.match(name)
        operator, parallelism = (match["operator"], int(match["parallelism"])) if match else (name, 1)
        summary = operators.setdefault(operator, OperatorSummary(operator, parallelism))
        if "rows_sent" in figure:  # a source actor
            summary.records_out += int(figure["rows_sent"])
            continue
        summary.records_in = (summary.records_in or 0) + int(figure.get("records_in", 0))
        summary.records_out += int(figure.get("records_out", 0))
        summary.dead_letters += int(figure.get("dead_letters", 0))
        summary.retries += int(figure.get("retries", 0))
        summary.timeouts += int(figure.get("timeouts", 0))
        for service, figures_ in (figure.get("services") or {}).items():
            total = summary.services.setdefault(service, {})
            for k, v in figures_.items():
                total[k] = max(total.get(k, 0), v) if k in _GAUGES_OF_THE_SERVICE else total.get(k, 0) + v
        for reason in _LATE_REASONS:
            if figure.get(f"late_{reason}"):
                summary.late_records[reason] = summary.late_records.get(reason, 0) + int(figure[f"late_{reason}"])
        watermark = figure.get("last_watermark_ms", figure.get("watermark_ms"))
        if watermark is not None:
            current = summary.last_watermark_ms
            summary.last_watermark_ms = watermark if current is None else min(current, watermark)
    return list(operators.values())


def job_text(result: "JobResult") -> str:
    """The job in one line, for ``repr()``."""
    operators = result.operators
    parts = [
        f"finished in {result.elapsed_s:.1f} s",
        f"{result.input_rows:,} records in",
        f"{result.output_rows:,} out",
    ]
    if result.elapsed_s > 0:
        parts.append(f"{result.input_rows / result.elapsed_s:,.0f} records/s")
    if operators:
        parts.append("operators " + " ".join(f"{o.name}[{o.parallelism}]" for o in operators))
    dead = sum(o.dead_letters for o in operators)
    if dead:
        parts.append(f"{dead:,} dead letters")
    late = _late_records(result.figures)
    if late:
        parts.append(late)
    watermark = _job_watermark(operators)
    if watermark is not None:
        parts.append(f"last watermark {_format_watermark(watermark)}")
    parts.extend(_service_text(name, figures) for o in operators for name, figures in o.services.items())
    parts.append(_restarts(result.restarts))
    parts.append(f"checkpoints {_checkpoints(result.checkpoints)}")
    return f"JobResult({result.job!r}: {', '.join(parts)})"


_BREAKER_STATES = {0: "closed", 1: "open", 2: "half-open"}


def _service_text(name: str, figures: dict[str, float]) -> str:
    """One service's figures in a few words.

    >>> _service_text("geo", {"service_calls": 1020, "service_overloads": 20, "service_pauses": 20,
    ...                       "service_breaker_opens": 0, "service_breaker_state": 0, "service_concurrency_limit": 11.5})
    'service geo: 1,020 calls, 20 overloads, limit 11.5 in flight, breaker closed'
    """
    parts = [f"{int(figures.get('service_calls', 0)):,} calls", f"{int(figures.get('service_overloads', 0)):,} overloads",
             f"limit {figures.get('service_concurrency_limit', 0):,.1f} in flight",
             f"breaker {_BREAKER_STATES.get(int(figures.get('service_breaker_state', 0)), '?')}"]
    opens = int(figures.get("service_breaker_opens", 0))
    if opens:
        parts[-1] += f" (opened {opens:,} times, {int(figures.get('service_breaker_rejections', 0)):,} records not sent)"
    return f"service {name}: " + ", ".join(parts)


def job_html(result: "JobResult") -> str:
    """The job as two HTML tables: the job's figures, then one row per operator."""
    operators = result.operators
    throughput = f"{result.input_rows / result.elapsed_s:,.0f} records/s" if result.elapsed_s > 0 else "—"
    watermark = _job_watermark(operators)
    state = "finished" if not result.restarts else f"finished after {_restarts(result.restarts)}"
    summary = [
        ("state", _text(state)),
        ("records", _text(f"{result.input_rows:,} in, {result.output_rows:,} out")),
        ("elapsed", _text(f"{result.elapsed_s:.1f} s")),
        ("throughput", _text(throughput)),
        ("last watermark", _watermark_html(watermark)),
        ("dead letters", _text(f"{sum(o.dead_letters for o in operators):,}")),
        *((f"service {name}", _text(_service_text(name, figures)[len(f"service {name}: "):]))
          for o in operators for name, figures in o.services.items()),
        ("late records", _text(_late_records(result.figures) or "0")),
        ("restarts", _text(str(result.restarts)) + _failures_html(result.failures)),
        ("checkpoints", _text(_checkpoints(result.checkpoints))),
    ]
    left = ' style="text-align:left"'
    rows = "".join(f"<tr><th{left}>{_text(name)}</th><td{left}>{value}</td></tr>" for name, value in summary)
    head = "".join(f"<th>{_text(h)}</th>" for h in (
        "operator", "parallelism", "records in", "records out", "dead letters", "retries", "timeouts", "last watermark"))
    body = "".join(
        f"<tr><td{left}><code>{_text(o.name)}</code></td><td>{o.parallelism}</td>"
        f"<td>{'—' if o.records_in is None else f'{o.records_in:,}'}</td><td>{o.records_out:,}</td>"
        f"<td>{o.dead_letters:,}</td><td>{o.retries:,}</td><td>{o.timeouts:,}</td>"
        f"<td>{_watermark_html(o.last_watermark_ms)}</td></tr>"
        for o in operators
    )
    return (
        '<div class="actorflow-job">'
        f"<table><caption{left}>actorflow job <code>{_text(result.job)}</code></caption><tbody>{rows}</tbody></table>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        "</div>"
    )


def _late_records(figures: list[dict[str, Any]]) -> str:
    """The late records of the job's windows by reason, and the record that moved the watermark
    furthest: "12 late records (behind_watermark 12); the watermark reached ...", or ""."""
    reasons = late_reasons(figures)
    if not reasons:
        return ""
    late = f"{sum(reasons.values()):,} late records ({', '.join(f'{r} {n:,}' for r, n in reasons.items())})"
    cause = watermark_cause(figures)
    return f"{late}; {cause}" if cause else late


def late_reasons(figures: list[dict[str, Any]]) -> dict[str, int]:
    """The late records of the job's windows by reason (``operators.windows.LateReason``), in
    the order of the reasons' names; only those that came.

    >>> late_reasons([{"late_behind_watermark": 0, "late_window_closed": 2}, {"late_window_closed": 1}])
    {'window_closed': 3}
    """
    reasons: dict[str, int] = {}
    for figure in figures:
        for reason in _LATE_REASONS:
            if figure.get(f"late_{reason}"):
                reasons[reason] = reasons.get(reason, 0) + int(figure[f"late_{reason}"])
    return dict(sorted(reasons.items()))


def watermark_cause(figures: list[dict[str, Any]]) -> str:
    """The record with the largest event time the job read, which moved the watermark furthest,
    and how far: what makes records late, when one timestamp is absurd (a row dated 9999-12-31).
    From the ``max_timestamp_record`` of the instances that read the source; "" if none has one.

    >>> watermark_cause([{"name": "j/source[0/1]", "max_timestamp_record": {"timestamp_ms": 253402214400000,
    ...     "watermark_ms": 253402214394999, "split": 0, "row": 17, "values": "{'user': 3}"}}])
    "the watermark reached 9999-12-30 23:59:54.999 UTC through the record at split 0 row 17 (event time 9999-12-31 00:00:00.000 UTC): {'user': 3}"
    """
    rows = [f["max_timestamp_record"] for f in figures if f.get("max_timestamp_record")]
    if not rows:
        return ""
    top = max(rows, key=lambda r: r["timestamp_ms"])
    return (f"the watermark reached {_format_watermark(top['watermark_ms'])} through the record at split "
            f"{top['split']} row {top['row']:,} (event time {_format_watermark(top['timestamp_ms'])}): {top['values']}")


def _text(value: str) -> str:
    return html.escape(value, quote=True)


def _job_watermark(operators: list[OperatorSummary]) -> int | None:
    # How far event time got everywhere: the least of the operators' last watermarks.
    marks = [o.last_watermark_ms for o in operators if o.last_watermark_ms is not None]
    return min(marks) if marks else None


def _format_watermark(ms: int) -> str:
    try:
        # In whole milliseconds: a float of seconds loses the last digit by year 9999.
        moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(milliseconds=ms)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


def _watermark_html(ms: int | None) -> str:
    if ms is None:
        return '<span title="no event time">—</span>'
    return f'<span title="{ms} ms">{_text(_format_watermark(ms))}</span>'


def _restarts(n: int) -> str:
    return "no restarts" if n == 0 else f"{n} restart" + ("s" if n != 1 else "")


def _failures_html(failures: list[str]) -> str:
    if not failures:
        return ""
    return "<ol>" + "".join(f"<li>{_text(failure)}</li>" for failure in failures) + "</ol>"


def _checkpoints(figures: dict[str, Any] | None) -> str:
    if figures is None:
        return "off"
    completed, aborted = figures.get("completed") or [], figures.get("aborted") or []
    text = f"{len(completed)} completed"
    if completed:
        text += f" (last #{figures.get('last_completed')}"
        p50 = figures.get("duration_s_p50")
        text += f", median {p50:.2f} s)" if p50 is not None else ")"
    if aborted:
        text += f", {len(aborted)} aborted"
    return text
