"""The Linux kernel's memory management: no transparent huge pages in whole-batch actors, and the
object store's pages dropped from an actor's page table once its data has passed through.

Verified on Linux 6.18 (``prctl`` ``PR_SET_THP_DISABLE`` 41 / ``PR_GET_THP_DISABLE`` 42,
``madvise`` ``MADV_DONTNEED`` 4 on a shared mapping, ``/proc/self/maps``,
``/sys/kernel/mm/transparent_hugepage/enabled``).

**Huge pages** (switch ``ACTORFLOW_NO_HUGE_PAGES``). NumPy asks for transparent huge pages on every
array of 4 MiB or more (``madvise(MADV_HUGEPAGE)``), and with the kernel's ``madvise`` mode each
first touch of such a region faults in a 2 MiB page, zeroed at once: each window instance held
about 50 MiB of them after a run of the benchmark's stage. ``small_pages()`` turns them off for the
process. In alternating runs of that stage (eight each, same session), the busier instance's event
loop used a median of 97 ms of CPU with it and 166 ms without, and the stage ran at a median of
10.0 M events/s against 7.3.

**Store pages** (switch ``ACTORFLOW_NO_STORE_PAGES``). An actor reads its input blocks straight
out of Ray's object store (zero-copy) and writes its output blocks into it. Each page it touches
stays mapped in the process, and Linux counts it in the process's RSS until the process exits,
although the store owns the memory. An actor that streams 10 GB through shows gigabytes of RSS in
the Ray dashboard and in ``ps``. ``StorePages`` counts the bytes that pass through; every
``every_bytes`` it asks the kernel to drop the process's entries for the store's pages
(``madvise(MADV_DONTNEED)``). The store's mapping is a *shared* mapping of a file in
``/dev/shm``: on such a mapping the call frees no data. A page still in use is mapped again from
the same file at its next access, with the same contents; only a page fault is paid. Only
mappings that are shared and named after the store (``plasma``) are touched: on a private mapping
the same call would discard the data.

Every actor process has one ``StorePages``, ``process_pages``: the source reader counts each block
it has read, the operator actor each batch pushed to it and each output block it hands over.

Threading model
    ``passed`` and ``release`` are called from the actor's event-loop thread. The kernel call is
    safe while other threads read or write the same pages.

>>> pages = StorePages(every_bytes=64 << 20)
>>> pages.passed(1 << 20)          # 1 MiB read from a block: nothing yet
False
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
from typing import Any

from . import enabled, failed
from .glibc import libc_function

__all__ = ["StorePages", "THP_MODES", "process_pages", "small_pages", "store_mappings", "thp_mode"]

_log = logging.getLogger(__name__)

# prctl's options (linux/prctl.h).
_PR_SET_THP_DISABLE = 41
_PR_GET_THP_DISABLE = 42
_MADV_DONTNEED = 4

THP_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
#: The modes the kernel offers for transparent huge pages, one of them in brackets.
THP_MODES = ("always", "madvise", "never")


def thp_mode() -> str | None:
    """The kernel's mode for transparent huge pages (``always``, ``madvise``, ``never``), or None
    where it has none to read."""
    try:
        with open(THP_FILE) as modes:
            text = modes.read()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


@functools.cache
def small_pages() -> bool:
    """Turn transparent huge pages off for this process (once); True if the kernel took it. False
    without ``prctl`` or where ``ACTORFLOW_NO_HUGE_PAGES`` is set."""
    if not enabled("huge_pages"):
        return False
    prctl = libc_function("prctl")
    if prctl is None:
        return False
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 and prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1:
        return True
    failed("huge_pages", f"prctl(PR_SET_THP_DISABLE) did not take: errno {ctypes.get_errno()}")
    return False


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
    madvise = libc_function("madvise")
    if madvise is None:
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


class StorePages:
    """Drops this process's entries for the object store's pages every ``every_bytes`` of data
    that passed through it (see the module's docstring). A no-op where the platform lacks
    ``/proc`` or ``madvise``, or ``ACTORFLOW_NO_STORE_PAGES`` is set (read at each release)."""

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
        if self._madvise is None or not enabled("store_pages"):
            return 0
        try:
            with open("/proc/self/maps") as maps:
                mappings = store_mappings(maps.read())
        except OSError as error:
            failed("store_pages", error)
            return 0
        released = 0
        for start, end in mappings:
            if self._madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += 1
            elif ctypes.get_errno() == errno.ENOMEM:  # unmapped meanwhile: nothing to drop
                _log.debug("the object store's mapping %x-%x went before madvise", start, end)
            else:
                failed("store_pages", f"madvise of the object store's mapping failed: errno {ctypes.get_errno()}")
        self.releases += 1
        return released


#: The one counter of this process: readers, channels and outputs all count into it.
process_pages = StorePages()
