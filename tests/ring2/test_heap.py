"""An actor's process keeps the C heap's freed blocks for its next batch (``actors.heap``)."""

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
from actors.heap import keep_freed_memory
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


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout)


def test_freed_batch_buffers_are_reused_instead_of_faulting_in_fresh_pages():
    from actors.heap import keep_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert keep_freed_memory() is False  # mallopt is glibc's: elsewhere the heap is left alone
        return
    default, kept = _faults("default"), _faults("keep")
    # By default glibc unmaps or trims the freed 16 MiB every round: a fault per 4 KiB page.
    assert default > 10 * 8 * 512 // 2
    assert kept < default // 100
