"""A few rows dated 9999-12-31 among thousands carry the watermark to year 9999 and make the rows
after them late: the warning and ``last_job()`` say so, with the reasons and the row that did it."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest

from actorflow.operators.windows import TumblingEventTimeWindows
from actorflow.spark_bridge import from_spark, last_job

pytestmark = [pytest.mark.spark, pytest.mark.ray]

BASE_S = 1_760_000_000
ROWS = 4_000
ABSURD = (1_250, 2_100, 2_101, 3_333)  # the rows dated 9999-12-31; the first moves the watermark


def test_the_late_accounting_names_the_row_that_moved_the_watermark(spark):
    utc = dt.timezone.utc
    far = dt.datetime(9999, 12, 31, tzinfo=utc)
    rows = [(i, ["DE", "FR", "US"][i % 3], far if i in ABSURD else dt.datetime.fromtimestamp(BASE_S + i, utc))
            for i in range(ROWS)]
    df = spark.createDataFrame(rows, "click_id long, country string, ts timestamp").coalesce(1)
    counts = (
        # One split, so that its rows are the input's; a watermark follows each batch of 100.
        from_spark(df, timestamp_column="ts", out_of_orderness_ms=5_000, parallelism=1, batch_size=100)
        .key_by("country")
        .window(TumblingEventTimeWindows.of(60_000))
        .allowed_lateness(30_000)
        .count()
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts.to_spark(progress=False)
    late = [str(w.message) for w in caught if "late records were dropped" in str(w.message)]
    # Every row after the first absurd one's batch is late, except the absurd ones, in year 9999's window.
    dropped = ROWS - 1_300 - 3
    cause = ("the watermark reached 9999-12-30 23:59:54.999 UTC through the record at split 0 row 1,250 "
             "(event time 9999-12-31 00:00:00.000 UTC): {'click_id': 1250, 'country': 'US', 'ts': 9999-12-31 00:00:00+00:00}")
    assert late and late[0].startswith(
        f"{dropped:,} late records were dropped by windows without a late-data side output "
        f"(late records by reason: past_allowed_lateness {dropped:,}); {cause}"), late
    assert late[0].endswith("; call side_output_late_data(tag) on the window to keep them"), late
    assert f"{dropped:,} late records (past_allowed_lateness {dropped:,}); {cause}" in repr(last_job())
