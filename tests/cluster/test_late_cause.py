"""A finished job's late records say why: the reasons, and the record that moved the watermark
furthest (one row dated 9999-12-31 makes every later record late)."""

from __future__ import annotations

from actorflow.cluster.job import JobResult
from actorflow.cluster.job_report import late_reasons, watermark_cause

YEAR_9999_MS = 253_402_214_400_000  # 9999-12-31T00:00:00Z


def _row(split: int, row: int, timestamp_ms: int, values: str) -> dict:
    return {"timestamp_ms": timestamp_ms, "watermark_ms": timestamp_ms - 5_001, "split": split, "row": row,
            "values": values}


def _absurd_job() -> JobResult:
    # Two splits read by the window stage itself; split 1 met a row dated 9999-12-31.
    figures = [
        {"name": "clicks/window[0/2]", "records_in": 10_000, "records_out": 40, "late_past_allowed_lateness": 2_800,
         "max_timestamp_record": _row(0, 9_999, 1_760_000_600_000, "{'click_id': 9999}")},
        {"name": "clicks/window[1/2]", "records_in": 10_000, "records_out": 2, "late_past_allowed_lateness": 2_800,
         "late_behind_watermark": 3,
         "max_timestamp_record": _row(1, 4_017, YEAR_9999_MS, "{'click_id': 14017, 'ts': 9999-12-31 00:00:00+00:00}")},
    ]
    return JobResult("clicks", [], [], {}, input_rows=20_000, output_rows=42, elapsed_s=2.0, figures=figures)


CAUSE = ("the watermark reached 9999-12-30 23:59:54.999 UTC through the record at split 1 row 4,017 "
         "(event time 9999-12-31 00:00:00.000 UTC): {'click_id': 14017, 'ts': 9999-12-31 00:00:00+00:00}")


def test_the_cause_is_the_record_with_the_largest_event_time_of_every_split():
    assert watermark_cause(_absurd_job().figures) == CAUSE


def test_repr_names_the_reasons_and_the_record_that_moved_the_watermark():
    assert f"5,603 late records (behind_watermark 3, past_allowed_lateness 5,600); {CAUSE}, " in repr(_absurd_job())


def test_the_html_says_it_in_the_late_records_row():
    markup = _absurd_job()._repr_html_()
    assert "5,603 late records (behind_watermark 3, past_allowed_lateness 5,600); the watermark reached 9999-12-30" in markup
    assert "{&#x27;click_id&#x27;: 14017" in markup  # the record's values, escaped


def test_without_late_records_no_cause_is_said():
    job = _absurd_job()
    for figure in job.figures:
        figure.pop("late_past_allowed_lateness"), figure.pop("late_behind_watermark", None)
    assert "watermark reached" not in repr(job) and late_reasons(job.figures) == {}


def test_a_job_without_event_time_has_no_cause():
    assert watermark_cause([{"name": "j/source[0/1]", "rows_sent": 5, "max_timestamp_record": None}]) == ""
