"""Memory for an actor that works on whole batches: the C heap keeps what a batch freed for the
next to reuse (``actors.upstream.glibc``), and the process takes no transparent huge pages
(``actors.upstream.linux``).

The actors that work on whole columns of a batch at a time call ``for_whole_batches()`` as they
start: a window stage's, and one that pre-aggregates for a keyed window stage after it.
"""

from __future__ import annotations

from .upstream.glibc import MMAP_THRESHOLD, TRIM_THRESHOLD, keep_freed_memory
from .upstream.linux import small_pages

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "for_whole_batches", "keep_freed_memory", "small_pages"]


def for_whole_batches() -> None:
    """The settings of an actor that works on whole columns of a batch at a time (each behind its
    switch: ``ACTORFLOW_NO_MALLOPT``, ``ACTORFLOW_NO_HUGE_PAGES``), once per process."""
    keep_freed_memory()
    small_pages()
