"""glibc's ``malloc``: keep what a batch freed for the next batch to reuse.

Verified on glibc 2.36 (``mallopt`` with ``M_MMAP_THRESHOLD`` -3 and ``M_TRIM_THRESHOLD`` -1, from
``malloc.h``). Switch: ``ACTORFLOW_NO_MALLOPT``.

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
blocks above ``MMAP_THRESHOLD`` are still returned at once. Measured on the window benchmark's
stage (2,000,000 events, batches of 262,144 rows), the event loop's CPU per instance was 73-118
ms with it and 105-222 ms without. An actor of per-record calls (``enrich()``) leaves it: no gain
was measured there.

Only glibc has ``mallopt``; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from typing import Any

from . import enabled, failed

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory", "libc_function"]

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks above this still get an mmap of their own, returned when freed: 32 MiB, glibc's maximum
#: for the dynamic threshold on 64-bit systems.
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top kept for reuse, at most.
TRIM_THRESHOLD = 256 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set the thresholds in this process (once); True if the C library took them. False where
    the C library is not glibc, or ``ACTORFLOW_NO_MALLOPT`` is set."""
    if not enabled("mallopt") or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = libc_function("mallopt")
    if mallopt is None:
        failed("mallopt", "glibc has no mallopt symbol")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Setting either turns off glibc's own adjustment of both: set both.
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return True
    failed("mallopt", "mallopt refused the thresholds")
    return False


def libc_function(name: str) -> Any:
    """The C library's function ``name`` on Linux (with errno kept), or None."""
    if platform.system() != "Linux":
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
