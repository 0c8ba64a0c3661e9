"""The getting-started page runs as written, on the shared Spark on Ray, and gives what it says."""

from __future__ import annotations

import collections

from tests.docs import run_page


def test_the_getting_started_page_enriches_and_counts_windows(spark, capsys):
    namespace = run_page("docs/getting-started.md", {})
    assert namespace["spark"] is spark  # the running session, not a second one
    enriched = namespace["enriched"].collect()
    assert sorted((r.click_id, r.segment) for r in enriched) == [
        (i, "gold" if i % 7 % 3 == 0 else "silver") for i in range(500)]
    # Each user's clicks per minute, counted by hand: click i is at 12:(i % 60), user i % 7.
    expected = collections.Counter((i % 7, i % 60) for i in range(500))
    got = {(r.user_id, r.window_start.minute): r.clicks for r in namespace["counts"].collect()}
    assert got == dict(expected)
    job = namespace["job"]
    assert (job.input_rows, job.output_rows) == (500, len(expected))
    assert "segment" in capsys.readouterr().out
