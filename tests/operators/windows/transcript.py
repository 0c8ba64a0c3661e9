"""A compact transcript language for window-operator tests.

Steps: ``"k1:3@20"`` is the record ``{"k": "k1", "v": 3}`` at event time 20 (``"k1:3"`` without
one), ``"wm 999"`` a watermark, ``"pt 100"`` moves processing time, ``"end"`` ends the input.
Output: a window row becomes ``"k1 [0,3000) 5 @2999"`` (key, window, result, timestamp), a
watermark ``"wm 999"``, any other record ``"<value> @<timestamp>"``.
"""

from __future__ import annotations

from typing import Any, Iterable

from actorflow.operators import OperatorHarness, Record, Watermark


def record(step: str) -> tuple[dict[str, Any], int | None]:
    body, _, ts = step.partition("@")
    key, _, value = body.partition(":")
    return {"k": key, "v": int(value) if value else 1}, (int(ts) if ts else None)


def feed(h: OperatorHarness, steps: Iterable[str]) -> None:
    for step in steps:
        if step.startswith("wm "):
            h.process_watermark(int(step[3:]))
        elif step.startswith("pt "):
            h.set_processing_time(int(step[3:]))
        elif step == "end":
            h.end_input()
        else:
            value, ts = record(step)
            h.process_element(value, ts)


def compact(elements: Iterable[Any]) -> list[str]:
    out = []
    for e in elements:
        if isinstance(e, Watermark):
            out.append(f"wm {e.timestamp_ms}")
        elif isinstance(e, Record):
            v = e.value
            if isinstance(v, dict) and "window_start" in v:
                result = v["result"] if "result" in v else v.get("v")
                window = "global" if v["window_start"] is None else f"[{v['window_start']},{v['window_end']})"
                out.append(f"{v.get('k', v.get('key'))} {window} {result} @{e.timestamp_ms}")
            else:
                out.append(f"{v} @{e.timestamp_ms}")
    return out


def run(op: Any, steps: Iterable[str], *, start_ms: int = 0) -> tuple[OperatorHarness, list[str]]:
    h = OperatorHarness(op, start_ms=start_ms)
    feed(h, steps)
    return h, compact(h.output)
