"""A finished job as a notebook shows it: its HTML tables and its one-line repr, without Ray."""

from __future__ import annotations

import doctest
from html.parser import HTMLParser

from actorflow.cluster import job_report
from actorflow.cluster.job import JobResult


class _Tables(HTMLParser):
    """The text of every table cell, as a list of rows per table."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _tables(markup: str) -> list[list[list[str]]]:
    parser = _Tables()
    parser.feed(markup)
    return parser.tables


def _windowed_job() -> JobResult:
    # A source actor, an async stage of two instances (the second restarted: @2), a window stage.
    figures = [
        {"name": "clicks/source[0/1]", "rows_sent": 3_000},
        {"name": "clicks/enrich[0/2]@2", "records_in": 1_500, "records_out": 1_490, "dead_letters": 10,
         "retries": 7, "timeouts": 1, "watermark_ms": None, "last_watermark_ms": 1_760_000_059_000},
        {"name": "clicks/enrich[1/2]@2", "records_in": 1_500, "records_out": 1_500, "dead_letters": 0,
         "retries": 3, "timeouts": 0, "watermark_ms": None, "last_watermark_ms": 1_760_000_058_500},
        {"name": "clicks/window[0/1]@2", "records_in": 2_990, "records_out": 12, "watermark_ms": None,
         "last_watermark_ms": 1_760_000_058_000, "late_behind_watermark": 5, "late_window_closed": 2,
         "late_past_allowed_lateness": 0},
    ]
    checkpoints = {"completed": [1, 2, 3], "aborted": [(4, "it ran past its timeout")], "last_completed": 3,
                   "duration_s_p50": 0.125, "duration_s_max": 0.5, "size_bytes_last": 2048}
    return JobResult("clicks", [], [], {}, input_rows=3_000, output_rows=12, elapsed_s=4.0, figures=figures,
                     restarts=2, failures=["clicks/enrich[0/2]: RayActorError: died", "clicks/window[0/1]@1: killed"],
                     checkpoints=checkpoints)


def test_the_html_shows_the_job_and_each_operator_with_its_parallelism():
    summary, operators = _tables(_windowed_job()._repr_html_())
    assert summary == [
        ["state", "finished after 2 restarts"],
        ["records", "3,000 in, 12 out"],
        ["elapsed", "4.0 s"],
        ["throughput", "750 records/s"],          # input records over the whole run
        ["last watermark", "2025-10-09 08:54:18.000 UTC"],  # the least of the operators'
        ["dead letters", "10"],
        ["late records", "7 late records (behind_watermark 5, window_closed 2)"],  # by reason, as the windows said
        ["restarts", "2clicks/enrich[0/2]: RayActorError: diedclicks/window[0/1]@1: killed"],
        ["checkpoints", "3 completed (last #3, median 0.12 s), 1 aborted"],
    ]
    assert operators == [
        ["operator", "parallelism", "records in", "records out", "dead letters", "retries", "timeouts", "last watermark"],
        ["source", "1", "—", "3,000", "0", "0", "0", "—"],
        ["enrich", "2", "3,000", "2,990", "10", "10", "1", "2025-10-09 08:54:18.500 UTC"],  # min over instances
        ["window", "1", "2,990", "12", "0", "0", "0", "2025-10-09 08:54:18.000 UTC"],
    ]


def test_the_html_escapes_every_text_from_the_job():
    result = JobResult(
        "a<b>", [], [], {}, input_rows=1, output_rows=1, elapsed_s=0.0,
        figures=[{"name": "a<b>/<script>alert(1)</script>[0/1]", "records_in": 1, "records_out": 1}],
        restarts=1, failures=['x/op[0/1]: ValueError: "<img src=x onerror=alert(1)>" & more'],
    )
    markup = result._repr_html_()
    assert "<script>" not in markup and "<img" not in markup and "<b>" not in markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "&quot;&lt;img src=x onerror=alert(1)&gt;&quot; &amp; more" in markup
    summary, operators = _tables(markup)
    assert ["throughput", "—"] in summary  # no division by a zero elapsed time
    assert operators[1][0] == "<script>alert(1)</script>"


def test_repr_is_one_line_without_the_object_refs():
    text = repr(_windowed_job())
    assert text == (
        "JobResult('clicks': finished in 4.0 s, 3,000 records in, 12 out, 750 records/s, "
        "operators source[1] enrich[2] window[1], 10 dead letters, 7 late records (behind_watermark 5, window_closed 2), "
        "last watermark 2025-10-09 08:54:18.000 UTC, "
        "2 restarts, checkpoints 3 completed (last #3, median 0.12 s), 1 aborted)"
    )


def test_the_module_examples_hold():
    result = doctest.testmod(job_report)
    assert result.attempted >= 2 and result.failed == 0
