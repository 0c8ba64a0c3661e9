"""How ``on_read`` decides that Spark runs no job: a signal it cannot read never counts as idle."""

from __future__ import annotations

from types import SimpleNamespace

from actorflow.spark_bridge.arrow_io import wait_for_spark_jobs


class _Tracker:
    """A status tracker whose first ``failures`` reads raise, as py4j may on a busy driver."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def getActiveJobsIds(self) -> list[int]:  # noqa: N802 - Spark's name
        if self.failures:
            self.failures -= 1
            raise RuntimeError("An error occurred while calling o42.getActiveJobIds")
        return []


def _session(tracker: _Tracker, stopped: bool):
    # The scheduler and the SQL store are out of reach: the tracker is the only signal left.
    context = SimpleNamespace(isStopped=lambda: stopped)
    return SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker, _jsc=SimpleNamespace(sc=lambda: context)))


def test_a_failing_read_of_a_running_session_counts_as_busy():
    tracker = _Tracker(failures=20)
    assert wait_for_spark_jobs(_session(tracker, stopped=False), timeout_s=30, poll_s=0.001, quiet_s=0.01)
    assert tracker.failures == 0, "took Spark for idle while its state could not be read"


def test_a_failing_read_of_a_stopped_session_ends_the_wait():
    tracker = _Tracker(failures=1_000)
    assert wait_for_spark_jobs(_session(tracker, stopped=True), timeout_s=30, poll_s=0.001, quiet_s=0.01)
    assert tracker.failures == 999


def test_a_session_that_cannot_be_read_ends_the_wait_at_its_timeout():
    tracker = _Tracker(failures=10**9)
    assert not wait_for_spark_jobs(_session(tracker, stopped=False), timeout_s=0.2, poll_s=0.001, quiet_s=0.01)
