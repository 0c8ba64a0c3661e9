"""The Concepts pages: their examples run as written (ring 1, no Ray or Spark) and show what the text says."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from actorflow.operators import DeadLetter
from actorflow.operators.elements import MAX_WATERMARK
from actorflow.testing import Record, Watermark, WatermarkStatus
from actorflow.windows import LateReason, LateRecord
from tests.docs import ROOT, run_page

SVG = "{http://www.w3.org/2000/svg}"


def test_architecture_the_chain_of_one_actor_filters_maps_enriches_and_ends_event_time():
    ns = run_page("docs/concepts/architecture.md")
    rows = [({"user_id": 1, "country": "DE", "ts_ms": 7_200_000}, 7_200_000, (0, 0, 0)),
            ({"user_id": 2, "country": "FR", "ts_ms": 7_200_500}, 7_200_500, (0, 0, 1))]
    expected = [
        Record({**row, "hour": row["ts_ms"] // 3_600_000, "segment": "gold" if row["user_id"] % 2 else "silver"}, ts, origin)
        for row, ts, origin in rows if row["country"] == "DE"
    ]
    assert ns["out"] == [*expected, Watermark(7_200_499), Watermark(MAX_WATERMARK)]
    assert ns["out"][0].origin == (0, 0, 0)  # Record's equality compares origins too; say it anyway


def test_semantics_one_outcome_per_record_order_and_copies():
    ns = run_page("docs/concepts/semantics.md")
    # One outcome each: u1 its result, u2 the fallback at its deadline, u404 a dead letter.
    assert ns["outcomes"] == [{"user": "u1", "segment": "gold"}, {"user": "u2", "segment": "unknown"}]
    (dead,) = ns["dead"]
    assert isinstance(dead, DeadLetter)
    assert (dead.value, dead.attempts, dead.error_type) == ("u404", 1, "KeyError")
    # Ordered: nothing leaves before a; unordered: completion order.
    assert ns["orders"] == {"ordered": ([], ["A", "B", "C"]), "unordered": (["C", "B"], ["C", "B", "A"])}
    # The retry got the row as it came, not the first attempt's change to it.
    assert ns["seen"] == [{"user": "u1"}, {"user": "u1"}]
    assert ns["tagged"] == [{"user": "u1", "tagged": True}]


def test_semantics_has_one_departures_table_with_every_corner():
    text = (ROOT / "docs/concepts/semantics.md").read_text(encoding="utf-8")
    assert text.count("| Where | Flink | actorflow | Why |") == 1
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Where")]
    for corner in ("watermark status", "object copies", "ordered queue", "retries at the end", "purged window",
                   "merge results", "reopen a fired session", "largest timestamp", "ContinuousProcessingTimeTrigger",
                   "idleness", "a split that finishes", "savepoints", "rescaling", "the epoch"):
        assert any(corner.lower() in row.lower() for row in rows), corner
    assert all(row.count(" | ") == 3 for row in rows), "every row has Where, Flink, actorflow and Why"


def test_time_watermarks_take_the_minimum_wait_behind_records_and_end_with_the_input():
    ns = run_page("docs/concepts/time.md")
    # Two inputs: the minimum, and an idle input left out.
    assert ns["after_one"] == []
    assert ns["after_both"] == [Watermark(40)]
    assert ns["after_idle"] == [Watermark(40), Watermark(100)]
    # Async I/O: b completed first, yet nothing left while a was in flight.
    assert ns["while_a_in_flight"] == []
    assert ns["after_a"] == [Record("A", 1), Watermark(5), Record("B", 6), WatermarkStatus(idle=True)]
    assert ns["final"] == Watermark(MAX_WATERMARK) == Watermark(2**63 - 1)
    # The window: [0, 10) fired at watermark 9 with the two records in it; the record at 5 came late.
    in_window = [ts for ts in (3, 7) if 0 <= ts < 10]
    assert ns["fired"] == [{"user": "u1", "window_start": 0, "window_end": 10, "result": len(in_window)}]
    (late,) = ns["late"]
    assert isinstance(late, LateRecord)
    assert (late.value, late.timestamp_ms, late.reason, late.windows, late.watermark_ms) == (
        {"user": "u1"}, 5, LateReason.BEHIND_WATERMARK, ((0, 10),), 9)


def test_time_the_watermark_formula_in_the_table_is_the_generator_s():
    from actorflow.operators.watermarks import BoundedOutOfOrdernessWatermarks

    text = (ROOT / "docs/concepts/time.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `([\d_]+)` \| ([\d, ]+) \| (\d+) \|$", text, re.M)
    assert len(table) == 3
    for out_of_orderness, times, watermark in table:
        generator = BoundedOutOfOrdernessWatermarks(int(out_of_orderness))
        for ts in times.split(","):
            generator.on_event(int(ts))
        assert generator.on_periodic_emit() == [Watermark(int(watermark))]


def test_idempotency_a_retry_a_timeout_a_batch_and_a_restore_present_the_same_keys():
    ns = run_page("docs/concepts/idempotency.md")
    key = "clicks/charge/0.3.17"  # prefix / split.piece.row
    assert ns["attempts"] == [(7, key), (7, key)]
    assert ns["payments"].charges == {key: "ch_1"}  # charged once for two attempts
    assert ns["charged"] == [{"user_id": 7, "charge_id": "ch_1"}]
    assert ns["lookup"].keys == [("invoke", "clicks/lookup/1.0.4"), ("timeout", "clicks/lookup/1.0.4")]
    assert ns["batch_keys"] == [["clicks/score/0.0.0", "clicks/score/0.0.1"]]
    assert ns["restored_attempts"] == ["clicks/flaky/0.3.18", "clicks/flaky/0.3.18"]
    assert ns["restored_output"] == ["u3"]


@pytest.mark.parametrize("name", ["rings.svg", "record-path.svg"])
def test_the_diagrams_are_self_contained_svg_with_a_size(name):
    path = ROOT / "docs/assets" / name
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    width, height = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox").split() == ["0", "0", f"{width:g}", f"{height:g}"]
    assert root.find(f"{SVG}title") is not None  # read out by screen readers
    assert not list(root.iter(f"{SVG}script")) and not list(root.iter(f"{SVG}image")) and not list(root.iter(f"{SVG}foreignObject"))
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text and "href" not in text and "@import" not in text
    # The page shows it, with alt text.
    page = (ROOT / "docs/concepts/architecture.md").read_text(encoding="utf-8")
    assert re.search(r"!\[[^\]]+\]\(\.\./assets/" + re.escape(name) + r"\)", page)
