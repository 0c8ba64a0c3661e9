"""An actor's process keeps the C heap's freed blocks for its next batch, and takes no transparent huge
pages (``actors.upstream.glibc``, ``actors.upstream.linux``)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Eight buffers of 2 MiB, written and freed, ten times over, as a batch's arrays are: the page
# faults of the last ten rounds (the first two settle the heap).
_ROUNDS = """
import resource, sys
import numpy as np
from actorflow.actors.upstream.glibc import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    raise SystemExit("keep_freed_memory() did not take")
def one_round():
    arrays = [np.ones((2 << 20) // 8) for _ in range(8)]
    del arrays
one_round(); one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _in_fresh_process(script: str, mode: str) -> int:
    """What ``script`` prints, run with ``mode`` in a new interpreter (its heap untouched)."""
    out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout)


def test_freed_batch_buffers_are_reused_instead_of_faulting_in_fresh_pages():
    from actorflow.actors.upstream.glibc import keep_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert keep_freed_memory() is False  # mallopt is glibc's: elsewhere the heap is left alone
        return
    default, kept = _in_fresh_process(_ROUNDS, "default"), _in_fresh_process(_ROUNDS, "keep")
    # By default glibc unmaps or trims the freed 16 MiB every round: a fault per 4 KiB page.
    assert default > 10 * 8 * 512 // 2
    assert kept < default // 100


# A 16 MiB array, for which NumPy asks the kernel for huge pages, written: the huge pages the
# process then holds, in KiB.
_HUGE = """
import sys
import numpy as np
from actorflow.actors.upstream.linux import small_pages
if sys.argv[1] == "small" and not small_pages():
    raise SystemExit("small_pages() did not take")
array = np.ones((16 << 20) // 8)
for line in open("/proc/self/smaps_rollup"):
    if line.startswith("AnonHugePages:"):
        print(int(line.split()[1]))
"""


def test_a_batch_actors_arrays_take_no_huge_pages():
    from actorflow.actors.upstream.linux import small_pages

    if platform.system() != "Linux":
        assert small_pages() is False
        return
    assert _in_fresh_process(_HUGE, "small") == 0
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[never]" not in mode:  # where the kernel gives huge pages at all, NumPy's array gets them by default
        assert _in_fresh_process(_HUGE, "default") >= 2048, mode
