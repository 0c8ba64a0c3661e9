"""The built-in aggregations in Arrow: what to ask ``group_by`` for, and the accumulators it gives.

Shared by the Arrow path of tumbling and sliding windows and that of sessions.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from .functions import BuiltinAggregate

__all__ = ["accumulators", "group_aggregations", "input_columns"]


def input_columns(keys: list[str], parts: list[BuiltinAggregate]) -> list[str]:
    """The columns a group-by for ``parts`` reads: the keys, then each aggregated field once."""
    return list(dict.fromkeys([*keys, *(p.field for p in parts if p.field is not None)]))


def group_aggregations(parts: list[BuiltinAggregate], base: list[tuple[str, str]]) -> list[Any]:
    """``group_by(...).aggregate`` specs: ``base`` (column, function) pairs, then what ``parts`` need."""
    specs: list[tuple[str, str, Any]] = [(column, function, None) for column, function in base]
    for p in parts:
        if p.kind in ("sum", "mean"):
            # A group of nulls only sums to null, as Sum's accumulator stays None.
            specs.append((p.field or "", "sum", pc.ScalarAggregateOptions(min_count=1)))
        if p.kind in ("min", "max"):
            specs.append((p.field or "", p.kind, None))
        if p.kind == "mean":
            specs.append((p.field or "", "count", pc.CountOptions(mode="only_valid")))
    unique = {(c, f): o for c, f, o in specs}  # a Sum and a Mean of one column share its sum
    return [(c, f, o) if o is not None else (c, f) for (c, f), o in unique.items()]


def accumulators(cols: dict[str, list[Any]], i: int, parts: list[BuiltinAggregate], count: int) -> list[Any]:
    """The accumulators of group ``i`` of a ``group_by`` result (as Python columns), one per part."""
    accs: list[Any] = []
    for p in parts:
        if p.kind == "count":
            accs.append(count)
        elif p.kind == "sum":
            accs.append(cols[f"{p.field}_sum"][i])
        elif p.kind in ("min", "max"):
            accs.append(cols[f"{p.field}_{p.kind}"][i])
        else:
            accs.append((cols[f"{p.field}_sum"][i], cols[f"{p.field}_count"][i]))
    return accs
