"""The chaos monkey's thread: an error that ends it is warned with its cause and raised by the block."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.processes  # a driver of its own


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_an_error_that_ends_the_monkeys_thread_is_raised_by_the_block():
    shown = _python("""
        import time
        from actorflow.cluster.chaos import ChaosMonkey
        monkey = ChaosMonkey("clicks", every_s=0.05, max_kills=1)
        monkey.kills = None  # len(None): the loop itself breaks, outside any kill
        try:
            with monkey:
                time.sleep(0.5)
        except TypeError as error:
            print("raised", error)
    """)
    assert shown.returncode == 0, shown.stderr
    assert "raised object of type 'NoneType' has no len()" in shown.stdout
    assert "chaos on job 'clicks' stopped: TypeError" in shown.stderr
