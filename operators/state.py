"""The versioned state format: what an operator's snapshot holds, and which snapshots a release restores.

A job that runs for weeks must be restorable by the next release, so an operator's state is
documented plain data (dicts, lists, tuples, str, int, float, bool, None, bytes) with a format
version, never a pickle of actorflow's own classes: a class renamed or changed in a later
release cannot break an old checkpoint, and a change of *this* structure has to raise
``STATE_FORMAT_VERSION`` and say what it does with the old one. A restore checks the version
first and refuses another one with ``StateFormatError`` naming both.

User values (record values, keys, accumulators, the values of user trigger and window state)
are the user's objects and stay as they are inside the structure; the host pickles the
checkpoint (Ray and the checkpoint storage need bytes), which is the only serializer that takes
any user object. Pickle of a *plain* structure is stable across releases; ``is_plain`` checks it.

Format version 3, per operator kind (``"format"`` names the kind; a stateless operator's state
is ``None``)::

    async_wait  {"format": "async_wait", "version": 3, "sequence": n,
                 "items": [("record", value, timestamp_ms, attempt, remaining_ms, retry_in_ms, origin, key)
                           | ("watermark", timestamp_ms) | ("status", idle), ...],  # in emission order
                 "service": {"limit": calls, "slow_start": bool, "known_max": calls, "paused_ms": ms,
                             "open_ms": ms | None}}   # only with a Service (operators.service)
    async_batch {"format": "async_batch", "version": 3, "sequence": n, "flush_remaining_ms": ms | None,
                 "items": [("record", value, timestamp_ms, batch, origin, key) | ("watermark", timestamp_ms)
                           | ("status", idle), ...],
                 "batches": [(batch, attempt, remaining_ms), ...]}
    window      {"format": "window", "version": 3, "watermark": ms,
                 "contents": [(key, window, "value", value) | (key, window, "elements", [value, ...])
                              | (key, window, "timestamped", [(value, timestamp_ms), ...]), ...],
                 "trigger_state" | "window_state": [(key, window, {name: value}), ...],
                 "global_state": [(key, {name: value}), ...],
                 "merging": [(key, [(window, state_window), ...]), ...],
                 "timers": {"event" | "processing": [(timestamp_ms, key, window), ...], "watermark": ms},
                 "panes": None | {"size_ms", "earliest_start", "rows_seen", "tables": [Arrow IPC stream bytes]},
                 "closed_sessions": {"widest_ms": ms, "windows": [(key, window), ...]}}   # optional

An operator instance's own part of a checkpoint (the host's: the task, the input in front of
the barriers, the output they overtook, the side outputs) is plain data too, since version 3::

    instance    {"format": "instance", "version": 3,
                 "chain": [operator state | None, ...],                 # as above, in chain order
                 "rows": [(value, timestamp_ms), ...], "row_origins": [origin, ...] | None,  # a batch half fed
                 "valve": {"watermarks": [ms, ...], "idle": [bool, ...], "ended": [bool, ...],
                           "aligned": [bool, ...], "current_watermark_ms": ms, "is_idle": bool},  # a list per input
                 "ended": [channel, ...], "watermark": ms, "records_in": n, "finishing": bool,
                 "input" | "output": [[item, ...], ...],                # per channel, in order
                 "reader": {"position": (piece, row), "rows_read": n,
                            "watermarks": {"max_timestamp_ms": ms | None, "emitted_ms": ms,
                                           "max_record": (timestamp_ms, split, row, values_text) | None} | None} | None,
                 "side_outputs": {tag: [("value", value) | ("dead_letter", value, timestamp_ms, attempts,
                                                           error_type, error, operator)
                                        | ("late", value, timestamp_ms, reason, [(start_ms, end_ms), ...],
                                           watermark_ms), ...]}}
    item        ("records", {"table": Arrow IPC stream bytes, "timestamps": [ms | None, ...] | None,
                             "origins": [origin, ...] | (split, piece, first_row | [row, ...]) | None})
                | ("partials", Arrow IPC stream bytes, rows) | ("watermark", ms) | ("status", idle)
                | ("barrier", checkpoint_id) | ("end",)

``"reader"`` is the chained source's (``BlockReader.state``). In formats 1 and 2 its
``"watermarks"`` is the generator object itself; a restore takes either.

A window is ``("time", start_ms, end_ms)`` or ``("global",)``; ``origin`` is a tuple of ints or
None, ``key`` (of a request) a str. Times are ints of milliseconds; ``remaining_ms`` counts from
the snapshot, so a restore on another machine's clock keeps each element's deadline.

An async_wait state's ``"service"`` is optional within version 3: a state without it restores
with the gate's defaults, and a release that ignores it restores the records and forgets only
the learned limit, a pause and an open breaker, which the service will ask for again.

Version 2 added the ``("status", idle)`` items (a watermark status queued behind the records
before it) and the window's ``"closed_sessions"`` (sessions already emitted and cleaned up, which a
late record must not open again). A state of version 1 holds neither, and restores as it is: its
statuses had left already, and it remembers no closed session. A release that restores version 1
only refuses version 2, which it would misread.

Version 3 changed no operator's state: it made the instance's part plain, which versions 1 and 2
wrote as pickles of actorflow's classes (the ``StatusWatermarkValve`` itself, channel items,
``DeadLetter`` and ``LateRecord``) with no ``"format"`` or ``"version"`` of its own. Such an
instance state restores as it is, as long as those classes unpickle; its chain's states are
checked as usual. A release that restores versions 1 and 2 only refuses version 3: its
operators' states name a version it does not know.

Checkpoints written before the package was renamed to ``actorflow`` are pickles of classes of
the top-level packages ``operators``, ``actors``, ``cluster`` and ``spark_bridge``. Unpickling
one would import those names, which may be a user's own packages: ``refuse_pre_rename`` reads
the pickle's opcodes without running them and refuses such a checkpoint with a one-line error.
"""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

from .errors import StateFormatError

__all__ = [
    "RESTORED_VERSIONS",
    "STATE_FORMAT_VERSION",
    "check_state",
    "is_plain",
    "load_checkpoint",
    "plain_window",
    "refuse_pre_rename",
    "table_bytes",
    "table_of",
    "versioned",
    "window_of",
]

#: The state format this release writes. Raise it with any change of the structures above, and
#: say in this module what a restore does with the previous version.
STATE_FORMAT_VERSION = 3
#: The versions this release restores.
RESTORED_VERSIONS = (1, 2, 3)
_RESTORED = ", ".join(str(v) for v in RESTORED_VERSIONS[:-1]) + f" and {RESTORED_VERSIONS[-1]}"

#: The top-level packages of actorflow before the rename; a checkpoint referring to them is refused.
PRE_RENAME_PACKAGES = frozenset({"operators", "actors", "cluster", "spark_bridge"})

_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None))


def versioned(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the format's kind and version, as a snapshot holds it.

    >>> versioned("window", {"watermark": 5})
    {'format': 'window', 'version': 3, 'watermark': 5}
    """
    return {"format": kind, "version": STATE_FORMAT_VERSION, **body}


def check_state(kind: str, state: Any) -> dict[str, Any]:
    """``state`` if it is a ``kind`` operator's state of a format version this release restores;
    else ``StateFormatError`` naming what was expected and what was got (nothing is restored).

    >>> check_state("window", {"format": "window", "version": 4})
    Traceback (most recent call last):
    ...
    actorflow.operators.errors.StateFormatError: window operator state has format version 4, but this actorflow restores state format versions 1, 2 and 3 only
    """
    if not isinstance(state, dict) or "version" not in state:
        raise StateFormatError(
            f"{kind} operator state has no format version (a {type(state).__name__}, written before the versioned "
            f"state format); this actorflow restores state format versions {_RESTORED} only"
        )
    if state["version"] not in RESTORED_VERSIONS:
        raise StateFormatError(
            f"{kind} operator state has format version {state['version']!r}, but this actorflow restores "
            f"state format versions {_RESTORED} only"
        )
    if state.get("format") != kind:
        raise StateFormatError(f"the state of a {kind} operator was expected, got the state of a {state.get('format')!r} operator")
    return state


def plain_window(window: Any) -> tuple[Any, ...]:
    """A window as plain data: ``("time", start_ms, end_ms)`` or ``("global",)``."""
    from .windows.assigners import GlobalWindow, TimeWindow  # windows import this module

    if isinstance(window, TimeWindow):
        return ("time", window.start_ms, window.end_ms)
    if isinstance(window, GlobalWindow):
        return ("global",)
    raise StateFormatError(f"a window must be a TimeWindow or the GlobalWindow, got {type(window).__name__}")


def window_of(plain: Any) -> Any:
    """The window that ``plain_window`` wrote."""
    from .windows.assigners import GlobalWindow, TimeWindow

    if plain[0] == "time":
        return TimeWindow(plain[1], plain[2])
    if plain[0] == "global":
        return GlobalWindow()
    raise StateFormatError(f"a window in a snapshot is ('time', start_ms, end_ms) or ('global',), got {plain!r}")


def table_bytes(table: Any) -> bytes:
    """A ``pyarrow.Table`` as one Arrow IPC stream: how a snapshot holds a table.

    >>> import pyarrow as pa
    >>> table_of(table_bytes(pa.table({"v": [1, 2]}))).to_pydict()
    {'v': [1, 2]}
    """
    import pyarrow as pa  # only a state with tables needs it

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def table_of(data: bytes) -> Any:
    """The table that ``table_bytes`` wrote."""
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()


def is_plain(value: Any, path: str = "state") -> str | None:
    """None if ``value`` is plain data all the way down; else the path to the first part that is not.

    A subclass of a plain type is not plain (an enum's member is a str or an int, but its pickle
    names its class).

    >>> is_plain({"a": [1, ("x", b"y", None)]}), is_plain({"a": [object()]})
    (None, "state['a'][0]: object")
    """
    if type(value) in _PLAIN_SCALARS:
        return None
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        for i, item in enumerate(value):
            found = is_plain(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if type(value) is dict:
        for k, item in value.items():
            found = is_plain(k, f"{path} key {k!r}") or is_plain(item, f"{path}[{k!r}]")
            if found is not None:
                return found
        return None
    return f"{path}: {type(value).__name__}"


# Opcodes that put a module and a name on the stack, or name one in their argument.
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GETS = {"GET", "BINGET", "LONG_BINGET"}


def pickled_modules(data: bytes) -> set[str]:
    """The modules whose classes or functions a pickle refers to, read from its opcodes (nothing is
    imported or run)."""
    modules: set[str] = set()
    pushed: list[Any] = []  # what each opcode put on the stack, as far as a module name goes
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("GLOBAL", "INST"):
            modules.add(str(arg).split(" ", 1)[0])
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            if len(pushed) >= 2 and isinstance(pushed[-2], str):
                modules.add(pushed[-2])
            pushed.append(None)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _MEMO_PUTS:
            memo[int(arg or 0)] = pushed[-1] if pushed else None
        elif name in _MEMO_GETS:
            pushed.append(memo.get(int(arg or 0)))
        elif name in _STRINGS:
            pushed.append(arg if isinstance(arg, str) else None)
        elif name not in ("FRAME", "PROTO"):
            pushed.append(None)
    return modules


def refuse_pre_rename(data: bytes, what: str = "checkpoint") -> None:
    """Refuse, in one line, a pickle of an actorflow from before the package rename (it refers to
    top-level ``operators``, ``actors``, ``cluster`` or ``spark_bridge``), without unpickling it:
    unpickling would import those names, which may be the user's own packages."""
    try:
        modules = pickled_modules(data)
    except Exception:  # noqa: BLE001 - not a whole pickle: what reads it reports that, this looks for old names only
        return
    old = sorted(m for m in modules if m.split(".", 1)[0] in PRE_RENAME_PACKAGES)
    if old:
        raise StateFormatError(
            f"{what} was written by an actorflow from before the package rename (it refers to module {old[0]!r}, "
            f"now actorflow.{old[0]}) and cannot be restored by this release; start the job without it"
        )


def load_checkpoint(data: bytes, what: str = "checkpoint") -> Any:
    """Unpickle a checkpoint after ``refuse_pre_rename``; the operators check their versions when
    they restore."""
    refuse_pre_rename(data, what)
    return pickle.loads(data)
