"""An instance's state when its stage resumes at another parallelism: built from the states of
every old instance of the stage (``operators.rescale`` deals the operators' states).

What the instance held besides its operators moves as records do:

- the input in front of the barriers and a batch half fed go, record by record, to the instance
  that owns their key now (a keyed stage), or stay with the new instance ``old % new`` (unkeyed);
  watermarks and statuses go to every new instance, each record in front of every watermark it
  preceded (``merge_in_order``);
- the output that the barrier overtook, and the side outputs, go with the old instance's
  records to the new instance ``old % new``; output for a next stage whose parallelism changed
  is dealt to its new instances when it is put back (``reroute_output``);
- the input watermarks are the least the old instances had; counts (records in) are summed
  into the first new instance.

A stage that reads its source itself (a chained source, whose position is per split) keeps its
parallelism: a resume that changes it is refused, naming the stage.
"""

from __future__ import annotations

from typing import Any

from actorflow.operators.channel_items import EndOfInput, PartialAggregates, Records
from actorflow.operators.elements import CheckpointBarrier, Watermark, WatermarkStatus
from actorflow.operators.errors import StateFormatError
from actorflow.operators.rescale import merge_in_order, rescale_states

from .arrow_rows import RowBatch
from .keys import KeyRouter

__all__ = ["rescaled_instance", "reroute_output"]


def rescaled_instance(olds: list[dict[str, Any]], index: int, parallelism: int, *, stage: str, num_inputs: int,
                      key: KeyRouter | None, max_parallelism: int) -> dict[str, Any]:
    """Instance ``index`` of ``parallelism``'s state, from the restored states of the stage's
    old instances (``olds[i]``: old instance ``i``'s). ``key``: the stage's key, for a keyed one;
    ``num_inputs``: its input channels now (the previous stage's parallelism)."""
    if any(s.get("reader") is not None for s in olds):
        raise StateFormatError(
            f"stage {stage!r} reads its source itself, at parallelism {len(olds)}: a chained source keeps its "
            f"parallelism across a resume, and {parallelism} was asked; resume it at {len(olds)}, or put a "
            "rebalance or key_by between the source and what should change")
    n_ops = {len(s["chain"]) for s in olds}
    if len(n_ops) != 1:
        raise StateFormatError(f"the old instances of stage {stage!r} hold different chains: {sorted(n_ops)} operators")
    # The chain's first operator takes the stage's keyed records: what it holds in flight goes to
    # the owner of its key. Later operators hold what the ones before them emitted, unkeyed.
    chain = [rescale_states([s["chain"][k] for s in olds], parallelism, max_parallelism,
                            key.key if key is not None and k == 0 else None)[index] for k in range(n_ops.pop())]
    mine = [o for o in range(len(olds)) if o % parallelism == index]  # whose unkeyed records and output go here

    def owned(batch: RowBatch, old: int) -> RowBatch | None:
        if key is None:
            return batch if old in mine else None
        part = key.split(batch, parallelism)[index]
        return part if part.num_rows else None

    # Input channel c is the previous stage's instance c: where that stage changed parallelism
    # too, the old channels fold onto the new ones.
    inputs: list[list[Any]] = [[] for _ in range(num_inputs)]
    for c in range(max(len(s["input"]) for s in olds)):
        kept = [[k for k in (_keep(item, old, owned) for item in _channel(s["input"], c)) if k is not None]
                for old, s in enumerate(olds)]
        inputs[c % num_inputs] = merge_in_order([inputs[c % num_inputs], *kept], _mark)
    rows, origins = _rows(olds, index, parallelism, key, mine)
    valves = [s["valve"] for s in olds]
    state = {
        **olds[0],
        "chain": chain,
        "rows": rows,
        "row_origins": origins,
        "valve": _valve(valves, num_inputs),
        "ended": sorted(set.intersection(*(set(s["ended"]) for s in olds))) if len(valves[0]["watermarks"]) == num_inputs
        else ([] if not all(all(v["ended"]) for v in valves) else list(range(num_inputs))),
        "watermark": min(s["watermark"] for s in olds),
        "records_in": sum(s["records_in"] for s in olds) if index == 0 else 0,
        "finishing": all(s["finishing"] for s in olds),
        "input": inputs,
        "output": _outputs([s["output"] for o, s in enumerate(olds) if o in mine]),
        "reader": None,
        "side_outputs": _sides([s["side_outputs"] for o, s in enumerate(olds) if o in mine]),
    }
    return state


def reroute_output(output: list[list[Any]], channels: int, partitioner: Any) -> list[list[Any]]:
    """Output that the barrier overtook, for ``channels`` next instances instead of
    ``len(output)``: records dealt by ``partitioner`` (its key, or round-robin), watermarks and
    statuses to every channel, each record in front of every watermark it preceded."""
    if len(output) == channels:
        return output
    merged = merge_in_order(output, _mark)
    out: list[list[Any]] = [[] for _ in range(channels)]
    for item in merged:
        if isinstance(item, Records):
            for target, part in enumerate(_split(item.batch, channels, partitioner)):
                if part is not None and part.num_rows:
                    out[target].append(Records(part))
        elif isinstance(item, PartialAggregates):
            for target, part in enumerate(_split(RowBatch(item.table, None), channels, partitioner)):
                if part is not None and part.num_rows:
                    # The input rows the partials stand for count where most of them went.
                    out[target].append(PartialAggregates(part.table, item.rows if target == 0 else 0))
        elif not isinstance(item, CheckpointBarrier):
            for channel in out:
                channel.append(item)
    return out


def _split(batch: RowBatch, channels: int, partitioner: Any) -> list[RowBatch | None]:
    router = partitioner.router
    if router is not None:
        return list(router.split(batch, channels))
    return [batch] + [None] * (channels - 1) if channels else []  # rebalance: any instance may take it


def _mark(item: Any) -> tuple[str, Any]:
    if isinstance(item, Watermark):
        return ("watermark", item.timestamp_ms)
    if isinstance(item, WatermarkStatus):
        return ("status", item.idle)
    if isinstance(item, EndOfInput):
        return ("end", None)
    return ("record", None)


def _channel(channels: list[list[Any]], c: int) -> list[Any]:
    return channels[c] if c < len(channels) else []


def _keep(item: Any, old: int, owned: Any) -> Any:
    """What of ``item`` (old instance ``old``'s input) this instance takes; None: nothing."""
    if isinstance(item, Records):
        part = owned(item.batch, old)
        return None if part is None else Records(part)
    if isinstance(item, PartialAggregates):
        part = owned(RowBatch(item.table, None), old)
        return None if part is None else PartialAggregates(part.table, item.rows)
    if isinstance(item, CheckpointBarrier):
        return None  # of a checkpoint the restore aborted
    return item


def _rows(olds: list[dict[str, Any]], index: int, parallelism: int, key: KeyRouter | None,
          mine: list[int]) -> tuple[list[Any], list[Any] | None]:
    rows: list[Any] = []
    origins: list[Any] = []
    known = True  # every row taken has its origin
    for old, s in enumerate(olds):
        for position, row in enumerate(s["rows"]):
            value, ts = row
            if (key is None and old in mine) or (key is not None and key.target(value, parallelism, ts) == index):
                rows.append(row)
                if s["row_origins"] is None:
                    known = False
                else:
                    origins.append(s["row_origins"][position])
    return rows, origins if rows and known else None


def _valve(valves: list[dict[str, Any]], num_inputs: int) -> dict[str, Any]:
    """The least of the old valves: per input, the least watermark, idle only if idle in all.
    For another number of inputs, every input starts at the least watermark of all."""
    n = len(valves[0]["watermarks"])
    if any(len(v["watermarks"]) != n for v in valves):
        raise StateFormatError(f"the old instances of a stage had different numbers of inputs: {[len(v['watermarks']) for v in valves]}")
    if n != num_inputs:
        least = min(min(v["watermarks"]) for v in valves)
        ended = all(all(v["ended"]) for v in valves)
        return {"watermarks": [least] * num_inputs, "idle": [False] * num_inputs, "ended": [ended] * num_inputs,
                "aligned": [True] * num_inputs, "current_watermark_ms": min(v["current_watermark_ms"] for v in valves),
                "is_idle": False}
    return {
        "watermarks": [min(v["watermarks"][i] for v in valves) for i in range(n)],
        "idle": [all(v["idle"][i] for v in valves) for i in range(n)],
        "ended": [all(v["ended"][i] for v in valves) for i in range(n)],
        "aligned": [all(v["aligned"][i] for v in valves) for i in range(n)],
        "current_watermark_ms": min(v["current_watermark_ms"] for v in valves),
        "is_idle": all(v["is_idle"] for v in valves),
    }


def _outputs(outputs: list[list[list[Any]]]) -> list[list[Any]]:
    if not outputs:
        return []
    channels = max(len(o) for o in outputs)
    return [merge_in_order([_channel(o, c) for o in outputs], _mark) for c in range(channels)]


def _sides(sides: list[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for side in sides:
        for tag, values in side.items():
            out.setdefault(tag, []).extend(values)
    return out

