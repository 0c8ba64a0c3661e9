"""Drop an actor's page-table entries for Ray's object store once its data has passed through.

An actor reads its input blocks straight out of the object store (zero-copy) and writes its
output blocks into it. Each page it touches stays mapped in the process, and Linux counts it in
the process's resident set size (RSS) until the process exits, although the store owns the
memory and frees or reuses it by itself. An actor that streams 10 GB through shows gigabytes of
RSS in the Ray dashboard and in ``ps``, and its memory seems to follow the input's size.

``StorePages`` counts the bytes that pass through; every ``every_bytes`` it asks the kernel to
drop the process's entries for the store's pages (``madvise(MADV_DONTNEED)``). The store's
mapping is a *shared* mapping of a file in ``/dev/shm``: on such a mapping the call frees no
data. A page that is still in use (a block being read, an object being written) is mapped again
from the same file at its next access, with the same contents; only a page fault is paid. The
process's RSS then counts its own memory and the store's pages it touched lately, not all it
ever touched.

Only mappings that are shared and named after the store (``plasma``) are touched: on a private
mapping the same call would discard the data.

Every actor process has one, ``process_pages``: the source reader counts each block it has
read, the operator actor each batch pushed to it and each output block it hands over.

Threading model
    ``passed`` and ``release`` are called from the actor's event-loop thread. The kernel call is
    safe while other threads read or write the same pages.

>>> pages = StorePages(every_bytes=64 << 20)
>>> pages.passed(1 << 20)          # 1 MiB read from a block: nothing yet
False
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

_log = logging.getLogger(__name__)

__all__ = ["StorePages", "process_pages", "store_mappings"]

_MADV_DONTNEED = 4  # Linux


def store_mappings(maps_text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the object store's shared mappings in ``/proc/<pid>/maps`` text.

    >>> store_mappings("7f00-7f80 rw-s 00000000 00:1a 42  /dev/shm/plasmaAbC\\n"
    ...                "7f80-7f90 rw-p 00000000 00:00 0 \\n")
    [(32512, 32640)]
    """
    found = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "plasma" not in fields[5].rsplit("/", 1)[-1]:
            continue
        if fields[1][3:4] != "s":  # a private mapping: dropping its pages would lose data
            continue
        start, _, end = fields[0].partition("-")
        found.append((int(start, 16), int(end, 16)))
    return found


def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


class StorePages:
    """Drops this process's entries for the object store's pages every ``every_bytes`` of data
    that passed through it (see the module's docstring). A no-op where the platform lacks
    ``/proc`` or ``madvise``."""

    def __init__(self, every_bytes: int = 64 << 20) -> None:
        if every_bytes <= 0:
            raise ValueError(f"every_bytes must be > 0, got {every_bytes}")
        self._every_bytes = every_bytes
        self._bytes = 0
        self._madvise = _madvise()
        self.releases = 0

    def passed(self, nbytes: int) -> bool:
        """Count ``nbytes`` of store data read or written; release once enough passed. True if
        it released."""
        self._bytes += nbytes
        if self._bytes < self._every_bytes:
            return False
        self.release()
        return True

    def release(self) -> int:
        """Drop the entries now; returns how many store mappings were released."""
        self._bytes = 0
        if self._madvise is None:
            return 0
        try:
            with open("/proc/self/maps") as maps:
                mappings = store_mappings(maps.read())
        except OSError:
            return 0
        released = 0
        for start, end in mappings:
            if self._madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += 1
            else:  # unmapped meanwhile: nothing to drop
                _log.debug("madvise of the object store's mapping %x-%x failed: errno %d",
                           start, end, ctypes.get_errno())
        self.releases += 1
        return released


#: The one counter of this process: readers, channels and outputs all count into it.
process_pages = StorePages()
