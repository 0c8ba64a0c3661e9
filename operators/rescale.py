"""Rescaling an operator's state: the states of its ``p`` old instances, dealt to ``p'`` new ones.

A keyed operator's state moves by key group (``key_groups``): every entry of a window's state
(contents, trigger and window state, merge sets, timers, closed sessions, the Arrow path's panes)
goes to the instance that owns its key's group at the new parallelism, as Flink's key-group
restore does. The records an ``async_wait`` holds in flight go to the owner of their key (the
stage's key of the record's value), or, in an unkeyed stage, are dealt round-robin. An
``async_wait_batch``'s records go the same way; a batch that had left keeps its attempt and its
deadline on each new instance that takes some of its records (there they leave again as one
smaller batch, each record with its own idempotency key), and in an unkeyed stage a batch goes
whole to one instance.

What is not per key is combined so that nothing fires early or late:

- a window's watermark is the least of the old ones (all equal at an aligned checkpoint, where
  every instance saw the same watermarks; the least never declares late a record that one of
  them would have taken);
- an ``async_wait`` queue keeps every record before each watermark it preceded: a record goes
  before the first watermark that followed it in its old queue, and the merged queue holds each
  watermark once, in order. Moving a record ahead of a watermark is always allowed (a watermark
  only promises that nothing older follows it);
- what an instance learned about its service (the adaptive limit, a pause, an open breaker) goes
  to every new instance from the old one it most resembles (the same index, or the last).

Only the states of ``window``, ``async_wait`` and ``async_batch`` operators rescale; a stateless
operator's ``None`` stays ``None``; any other state is refused, naming its kind.

>>> old = [versioned("window", {**_EMPTY_WINDOW, "watermark": 5, "contents": [("a", ("time", 0, 10), "value", 1)]}),
...        versioned("window", {**_EMPTY_WINDOW, "watermark": 5, "contents": [("b", ("time", 0, 10), "value", 2)]})]
>>> [s["contents"] for s in rescale_states(old, 1, 128)]
[[('a', ('time', 0, 10), 'value', 1), ('b', ('time', 0, 10), 'value', 2)]]
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any, Callable

from .errors import StateFormatError
from .key_groups import index_of_key_group, key_group_of
from .state import check_state, versioned

__all__ = ["merge_in_order", "rescale_states"]

_EMPTY_WINDOW: dict[str, Any] = {
    "watermark": -(2**63), "contents": [], "trigger_state": [], "window_state": [], "global_state": [], "merging": [],
    "timers": {"event": [], "processing": [], "watermark": -(2**63)}, "panes": None,
}


def rescale_states(old: list[Any], parallelism: int, max_parallelism: int,
                   key_of: Callable[[Any], Any] | None = None) -> list[Any]:
    """The states of ``parallelism`` new instances of one operator, from those of its old ones
    (``old[i]``: instance ``i``'s, in index order). ``key_of``: the key of a record's value in a
    keyed stage (None: the stage is unkeyed)."""
    if all(s is None for s in old):
        return [None] * parallelism
    kinds = {s.get("format") if isinstance(s, dict) else type(s).__name__ for s in old if s is not None}
    if len(kinds) != 1:
        raise StateFormatError(f"cannot rescale the states of one operator of different kinds: {sorted(map(str, kinds))}")
    [kind] = kinds
    if kind == "window":
        return _windows(old, parallelism, max_parallelism)
    if kind == "async_wait":
        return _async_waits(old, parallelism, max_parallelism, key_of)
    if kind == "async_batch":
        return _async_batches(old, parallelism, max_parallelism, key_of)
    raise StateFormatError(
        f"an operator with state of kind {kind!r} cannot resume at another parallelism (only windows, "
        "async_wait and async_wait_batch can); resume it at its old parallelism")


def _owner(max_parallelism: int, parallelism: int) -> Callable[[Any], int]:
    cache: dict[Any, int] = {}

    def owner(key: Any) -> int:
        try:
            return cache[key]
        except (KeyError, TypeError):
            index = index_of_key_group(key_group_of(key, max_parallelism), max_parallelism, parallelism)
            try:
                cache[key] = index
            except TypeError:
                pass
            return index

    return owner


# ----------------------------------------------------------------------------- windows


def _windows(old: list[Any], parallelism: int, max_parallelism: int) -> list[Any]:
    states = [check_state("window", s) if s is not None else None for s in old]
    present = [s for s in states if s is not None]
    owner = _owner(max_parallelism, parallelism)
    new = [{"watermark": _least(s["watermark"] for s in present),
            "contents": [], "trigger_state": [], "window_state": [], "global_state": [], "merging": [],
            "timers": {"event": [], "processing": [], "watermark": _least(s["timers"]["watermark"] for s in present)},
            "panes": None} for _ in range(parallelism)]
    for s in present:
        for part in ("contents", "trigger_state", "window_state", "global_state", "merging"):
            for entry in s[part]:
                new[owner(entry[0])][part].append(entry)
        for domain in ("event", "processing"):
            for timer in s["timers"][domain]:
                new[owner(timer[1])]["timers"][domain].append(timer)
        closed = s.get("closed_sessions")
        if closed is not None:
            for i in range(parallelism):
                mine = new[i].setdefault("closed_sessions", {"widest_ms": 0, "windows": []})
                mine["widest_ms"] = max(mine["widest_ms"], closed["widest_ms"])
            for key, window in closed["windows"]:
                new[owner(key)]["closed_sessions"]["windows"].append((key, window))
    for i, panes in enumerate(_panes([s.get("panes") for s in present], parallelism, owner)):
        new[i]["panes"] = panes
    for state in new:  # timers in firing order, as the operator keeps them
        for domain in ("event", "processing"):
            state["timers"][domain].sort(key=lambda t: t[0])
    return [versioned("window", state) for state in new]


def _least(watermarks: Any) -> Any:
    """The least of some watermarks; None (none seen yet) is below them all."""
    values = list(watermarks)
    return None if any(v is None for v in values) else min(values)


def _panes(old: list[dict[str, Any] | None], parallelism: int, owner: Callable[[Any], int]) -> list[Any]:
    """The Arrow path's panes, split by the owner of each row's key. Row numbers (which order
    the windows that fire together) stay unique: an old instance's rows follow the ones before."""
    present = [p for p in old if p is not None]
    if not present:
        return [None] * parallelism
    import pyarrow as pa
    import pyarrow.compute as pc

    from .windows.panes import FIRST, START

    tables: list[list[pa.Table]] = [[] for _ in range(parallelism)]
    offset = 0
    for panes in present:
        for data in panes["tables"]:
            table = pa.ipc.open_stream(data).read_all()
            if offset:
                index = table.schema.get_field_index(FIRST)
                table = table.set_column(index, FIRST, pc.add(table.column(FIRST), offset))
            keys = [c for c in table.column_names[: table.schema.get_field_index(START)]]
            columns = [table.column(k).to_pylist() for k in keys]
            targets = pa.array([owner(row[0] if len(row) == 1 else tuple(row)) for row in zip(*columns)], pa.int32())
            for i in range(parallelism):
                part = table.filter(pc.equal(targets, i))
                if part.num_rows:
                    tables[i].append(part)
        offset += panes["rows_seen"]
    out: list[Any] = []
    for parts in tables:
        if not parts:
            out.append(None)
            continue
        earliest = min(pc.min(t.column(START)).as_py() for t in parts)
        out.append({"size_ms": present[0]["size_ms"], "earliest_start": earliest, "rows_seen": offset,
                    "tables": [_ipc(t) for t in parts]})
    return out


def _ipc(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


# ---------------------------------------------------------------------------- async_wait


def merge_in_order(queues: list[list[Any]], mark_of: Callable[[Any], tuple[str, Any]]) -> list[Any]:
    """One queue of the items of ``queues`` in which every record stays in front of each
    watermark it preceded in its own queue, and each watermark appears once, in order.

    ``mark_of(item)``: ``("record", None)``, ``("watermark", ms)``, ``("status", idle)`` or
    ``("end", None)``. A status goes in front of the watermark that followed it; an end, once,
    last. Records keep their queues' order among those bound for the same watermark.

    >>> kinds = lambda i: ("watermark", i) if isinstance(i, int) else ("record", None)
    >>> merge_in_order([["a", 5, "b"], ["c", 5, 7, "d"]], kinds)
    ['a', 'c', 5, 7, 'b', 'd']
    """
    entries: list[tuple[float, int, int, Any]] = []
    marks: dict[tuple[float, int, Any], Any] = {}
    end = None
    for q, items in enumerate(queues):
        following, before = [math.inf] * len(items), math.inf
        for position in range(len(items) - 1, -1, -1):
            following[position] = before
            kind, value = mark_of(items[position])
            if kind == "watermark":
                before = value
        for position, item in enumerate(items):
            kind, value = mark_of(item)
            if kind == "record":
                entries.append((following[position], q, position, item))
            elif kind == "watermark":
                marks.setdefault((value, 1, None), item)
            elif kind == "status":
                marks.setdefault((following[position], 0, value), item)
            else:
                end = item
    heapq.heapify(entries)
    merged: list[Any] = []
    for mark in sorted(marks, key=lambda m: (m[0], m[1])):
        while entries and entries[0][0] <= mark[0]:
            merged.append(heapq.heappop(entries)[3])
        merged.append(marks[mark])
    while entries:
        merged.append(heapq.heappop(entries)[3])
    if end is not None:
        merged.append(end)
    return merged


def _async_item_mark(item: tuple[Any, ...]) -> tuple[str, Any]:
    return (item[0], item[1]) if item[0] in ("watermark", "status") else ("record", None)


def _deal_queues(states: list[Any], parallelism: int, target: Callable[[int, tuple[Any, ...]], int],
                 ) -> list[list[list[tuple[Any, ...]]]]:
    """Per new instance, per old one: the old queue with only the records that ``target(old
    index, record item)`` sends to the new one, and every watermark and status."""
    queues: list[list[list[tuple[Any, ...]]]] = [[] for _ in range(parallelism)]
    for o, s in enumerate(states):
        if s is None:
            continue
        mine: list[list[tuple[Any, ...]]] = [[] for _ in range(parallelism)]
        for item in s["items"]:
            if item[0] == "record":
                mine[target(o, item)].append(item)
            else:
                for queue in mine:
                    queue.append(item)
        for i in range(parallelism):
            queues[i].append(mine[i])
    return queues


def _async_waits(old: list[Any], parallelism: int, max_parallelism: int, key_of: Callable[[Any], Any] | None) -> list[Any]:
    states = [check_state("async_wait", s) if s is not None else None for s in old]
    owner = _owner(max_parallelism, parallelism)
    turn = itertools.count()
    queues = _deal_queues(states, parallelism, lambda _, item: owner(key_of(item[1])) if key_of is not None
                          else next(turn) % parallelism)
    sequence = max(s.get("sequence", 0) for s in states if s is not None)
    out = []
    for i in range(parallelism):
        body: dict[str, Any] = {"items": merge_in_order(queues[i], _async_item_mark), "sequence": sequence}
        service = _service_of(states, i)
        if service is not None:
            body["service"] = service
        out.append(versioned("async_wait", body))
    return out


def _async_batches(old: list[Any], parallelism: int, max_parallelism: int,
                   key_of: Callable[[Any], Any] | None) -> list[Any]:
    states = [check_state("async_batch", s) if s is not None else None for s in old]
    owner = _owner(max_parallelism, parallelism)
    # Batch numbers are an old instance's own: each old instance's are shifted past the last's.
    shift, base = [], 0
    for s in states:
        shift.append(base)
        base += 1 + max((b[0] for b in s["batches"]), default=-1) if s is not None else 0
    unkeyed_turn = itertools.count()
    batch_home: dict[int, int] = {}

    def target(o: int, item: tuple[Any, ...]) -> int:
        if key_of is not None:
            return owner(key_of(item[1]))
        if item[3] is None:  # in the buffer: no batch yet
            return next(unkeyed_turn) % parallelism
        batch = shift[o] + item[3]
        if batch not in batch_home:
            batch_home[batch] = next(unkeyed_turn) % parallelism
        return batch_home[batch]

    queues = _deal_queues(states, parallelism, target)
    olds = [(o, s) for o, s in enumerate(states) if s is not None]
    # The records' batch numbers, shifted (records keep the rest of their fields).
    shifted_queues = [
        [[(*item[:3], None if item[3] is None else shift[o] + item[3], *item[4:]) if item[0] == "record" else item
          for item in queue]
         for (o, _), queue in zip(olds, queues[i])]
        for i in range(parallelism)]
    batches = {shift[o] + b[0]: (shift[o] + b[0], *b[1:]) for o, s in olds for b in s["batches"]}
    flushes = [s["flush_remaining_ms"] for _, s in olds if s["flush_remaining_ms"] is not None]
    sequence = max(s.get("sequence", 0) for _, s in olds)
    out = []
    for i in range(parallelism):
        items = merge_in_order(shifted_queues[i], _async_item_mark)
        mine = sorted({item[3] for item in items if item[0] == "record" and item[3] is not None})
        has_buffer = any(item[0] == "record" and item[3] is None for item in items)
        out.append(versioned("async_batch", {
            "items": items, "batches": [batches[b] for b in mine], "sequence": sequence,
            "flush_remaining_ms": min(flushes) if flushes and has_buffer else None}))
    return out


def _service_of(states: list[Any], index: int) -> Any:
    for s in (states[min(index, len(states) - 1)], *states):
        if s is not None and s.get("service") is not None:
            return s["service"]
    return None
