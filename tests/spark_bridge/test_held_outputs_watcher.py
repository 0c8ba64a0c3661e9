"""The watcher that frees a result's Ray blocks once Spark has read them outlives a round that fails."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

from actorflow.spark_bridge.arrow_io import _Held, _HeldOutputs
from tests.waiting import poll


def _read_result(refs):
    """A held result whose cache Spark has filled: the watcher frees it on its next round."""
    builder = SimpleNamespace(isCachedColumnBuffersLoaded=lambda: True)
    return _Held(spark=None, manager=None, jdf=None, builder=builder, refs=refs, on_read=None)


def test_a_round_that_fails_is_warned_once_and_the_watcher_frees_the_blocks_on_the_next(caplog):
    outputs = _HeldOutputs()
    outputs.POLL_S = 0.01
    outputs._held = {0: _read_result(["block-0"]), 1: _read_result(["block-1"])}
    release = outputs.release
    failures = iter([OSError("no thread can start now"), OSError("no thread can start now")])

    def release_failing_twice(key):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        release(key)

    outputs.release = release_failing_twice
    with caplog.at_level(logging.WARNING, logger="actorflow.spark_bridge.arrow_io"):
        outputs._watcher = threading.Thread(target=outputs._watch, daemon=True)
        outputs._watcher.start()
        poll(lambda: not outputs._held or None, timeout_s=10)
        poll(lambda: outputs._watcher is None or None, timeout_s=10)  # nothing held: it ends

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["freeing the Ray blocks of results that Spark has read failed (OSError: no thread can "
                        "start now); they stay held, and the watcher tries again every 0.01 s"]
