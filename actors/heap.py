"""Memory for an actor that works on whole batches: the C heap keeps what a batch freed for the
next to reuse, and the process takes no transparent huge pages.

An operator actor allocates the same large buffers batch after batch: numpy arrays of a batch's
event times and window starts, row lists of hundreds of KB. glibc's ``malloc`` serves a block
above ``M_MMAP_THRESHOLD`` (128 KiB at first) with a fresh ``mmap`` and unmaps it when it is
freed, and gives the top of its heap back to the kernel once more than ``M_TRIM_THRESHOLD`` is
free there. Either way, the next batch's buffers are fresh pages, and each first touch of a page
is a page fault, in which the kernel zeroes the page. On a virtual machine that returns its free
pages to the host (free page reporting), that fault also waits for the host: measured here, the
window stage's event loop spent from 12 to 160 ms of system time per million rows (blocks of
500,000 rows in batches of 262,144), varying run to run, with about 7,600 faults per instance.

``keep_freed_memory()`` raises both thresholds, so that freed blocks stay in the heap and the
next batch reuses them: about 3,000 faults per instance, and 0 to 30 ms of system time. The cost
is memory the process keeps once it has used it: at most ``TRIM_THRESHOLD`` of freed heap, and
blocks above ``MMAP_THRESHOLD`` are still returned at once.

Only glibc has ``mallopt``; elsewhere nothing changes. The actors that work on whole columns
of a batch at a time call it (through ``for_whole_batches()``) as they start: a window stage's,
and one that pre-aggregates for a keyed window stage after it. Measured on the window benchmark's
stage (2,000,000 events, batches of 262,144 rows), the event loop's CPU per instance was 73-118
ms with it and 105-222 ms without. An actor of per-record calls (``enrich()``) leaves it: its CPU
per record was 15.9-18.3 µs with the setting against 13.0-15.7 µs without, in alternating runs
(why is not known); with both settings it was 12.8 µs against 12.4 (medians of six alternating
runs of 500,000 rows each), no gain either.

Transparent huge pages cost the same way, in larger steps. NumPy asks for them on every array of
4 MiB or more (``madvise(MADV_HUGEPAGE)``), and with the kernel's ``madvise`` mode each first
touch of such a region faults in a 2 MiB page, zeroed at once: each window instance held about
50 MiB of them after a run of the benchmark's stage. ``small_pages()`` turns them off for the
process (``PR_SET_THP_DISABLE``). In alternating runs of that stage (eight each, same session),
the busier instance's event loop used a median of 97 ms of CPU with it and 166 ms without
(outliers of 160-236 ms gone), and the stage ran at a median of 10.0 M events/s against 7.3.

``for_whole_batches()`` applies both, once per process.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from typing import Any

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "for_whole_batches", "keep_freed_memory", "small_pages"]

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# prctl's options (linux/prctl.h).
_PR_SET_THP_DISABLE = 41
_PR_GET_THP_DISABLE = 42

#: Blocks above this still get an mmap of their own, returned when freed: 32 MiB, glibc's maximum
#: for the dynamic threshold on 64-bit systems.
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top kept for reuse, at most.
TRIM_THRESHOLD = 256 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set the thresholds in this process (once); True if the C library took them."""
    mallopt = _c_function("mallopt") if platform.libc_ver()[0] == "glibc" else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Setting either turns off glibc's own adjustment of both: set both.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


@functools.cache
def small_pages() -> bool:
    """Turn transparent huge pages off for this process (once); True if the kernel took it."""
    prctl = _c_function("prctl")
    if prctl is None:
        return False
    prctl.restype = ctypes.c_int
    return prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 and prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1


def for_whole_batches() -> None:
    """The settings of an actor that works on whole columns of a batch at a time."""
    keep_freed_memory()
    small_pages()


def _c_function(name: str) -> Any:
    """The C library's function ``name`` on Linux, or None."""
    if platform.system() != "Linux":
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
