"""Key groups: the unit in which keyed state is kept, routed and moved when a job rescales.

As in Flink, a job has a fixed ``max_parallelism``: every key belongs to one of that many key
groups, ``key_group_of(key)``, for the job's whole life, and an instance of a keyed stage of
parallelism ``p`` owns a contiguous range of them (``key_group_range``). A job resumed at another
parallelism hands each range's state to its new owner, whole; so ``max_parallelism`` is the
largest parallelism a keyed stage can ever have, and cannot change between runs.

A key's group comes from a stable hash of its value (CRC-32 of a canonical encoding: type tag,
then the value's text or bytes), mixed by MurmurHash3's finaliser: Python's ``hash()`` of a
``str`` changes from process to process (``PYTHONHASHSEED``), and every process must agree.
Keys that are equal in Python (``1``, ``1.0``, ``True``, ``Decimal(1)``) hash alike.

>>> key_group_range(0, 128, 3), key_group_range(2, 128, 3)
(range(0, 43), range(86, 128))
>>> all(index_of_key_group(g, 128, 3) == 1 for g in key_group_range(1, 128, 3))
True
"""

from __future__ import annotations

import datetime as _dt
import zlib
from decimal import Decimal
from typing import Any

from .errors import ConfigurationError, describe_value

__all__ = [
    "DEFAULT_MAX_PARALLELISM", "UPPER_MAX_PARALLELISM", "check_max_parallelism", "index_of_key_group",
    "key_group_of", "key_group_range", "stable_hash",
]

#: A job's key groups unless it says otherwise (Flink's least default).
DEFAULT_MAX_PARALLELISM = 128
UPPER_MAX_PARALLELISM = 1 << 15


def _encode(key: Any, out: list[bytes]) -> None:
    if key is None:
        out.append(b"n;")
    elif isinstance(key, int):  # bool too: True == 1 keys one window, so it must route alike
        out.append(b"i%d;" % key)
    elif isinstance(key, float):
        if key.is_integer():
            out.append(b"i%d;" % int(key))  # 2.0 == 2
        else:
            out.append(b"f" + repr(key).encode() + b";")
    elif isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(data))
        out.append(data)
    elif isinstance(key, bytes):
        out.append(b"y%d:" % len(key))
        out.append(key)
    elif isinstance(key, Decimal):
        if key.is_finite() and key == key.to_integral_value():
            out.append(b"i%d;" % int(key))
        elif float(key) == key:  # Decimal("2.5") == 2.5
            _encode(float(key), out)
        else:
            out.append(b"d" + str(key.normalize()).encode() + b";")
    elif isinstance(key, (_dt.datetime, _dt.date, _dt.time)):
        out.append(b"t" + key.isoformat().encode() + b";")
    elif isinstance(key, _dt.timedelta):
        out.append(b"D%d;" % (key // _dt.timedelta(microseconds=1)))
    elif isinstance(key, tuple):
        out.append(b"(%d:" % len(key))
        for part in key:
            _encode(part, out)
        out.append(b")")
    else:
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key {describe_value(key)} of type {type(key).__name__} is unhashable; a key must be hashable") from None
        raise TypeError(
            f"key {describe_value(key)} of type {type(key).__name__} has no stable encoding; a key must be None, bool, "
            "int, float, str, bytes, Decimal, a date or time, or a tuple of them"
        )


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that every process agrees on; ``TypeError`` for keys it cannot encode."""
    out: list[bytes] = []
    _encode(key, out)
    return zlib.crc32(b"".join(out))


def _mix(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every bit of ``h`` moves the low bits, which pick the group."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def key_group_of(key: Any, max_parallelism: int) -> int:
    """The key group of ``key`` among ``max_parallelism``; ``TypeError`` for a key without a
    stable encoding."""
    return _mix(stable_hash(key)) % max_parallelism


def index_of_key_group(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The instance of ``parallelism`` that owns ``key_group``."""
    return key_group * parallelism // max_parallelism


def key_group_range(index: int, max_parallelism: int, parallelism: int) -> range:
    """The key groups that instance ``index`` of ``parallelism`` owns: a contiguous range, the
    ranges of all instances covering ``range(max_parallelism)`` once."""
    return range(-(-index * max_parallelism // parallelism), -(-(index + 1) * max_parallelism // parallelism))


def check_max_parallelism(max_parallelism: Any, parallelism: int | None = None, *, what: str = "a keyed stage") -> int:
    """``max_parallelism`` if it is an int in [1, 32768] and at least ``parallelism``; a
    ``ConfigurationError`` that names both otherwise."""
    if not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool) or not 1 <= max_parallelism <= UPPER_MAX_PARALLELISM:
        raise ConfigurationError(f"max_parallelism must be an int in [1, {UPPER_MAX_PARALLELISM}], got {max_parallelism!r}")
    if parallelism is not None and parallelism > max_parallelism:
        raise ConfigurationError(
            f"{what} has parallelism {parallelism}, more than the job's max_parallelism {max_parallelism}: keyed "
            f"state is kept in {max_parallelism} key groups, so no more instances can own any; raise max_parallelism "
            "(it cannot change once a job has checkpoints)")
    return max_parallelism
