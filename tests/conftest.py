"""Shared fixtures: one local Ray and one Spark-on-Ray session for the whole run."""

import time

import pytest

from tests._spark_fixtures import ray_session, spark  # noqa: F401


def pytest_addoption(parser):
    parser.addoption("--fast-limit-s", type=float, default=None,
                     help="fail the run when it takes longer than this many seconds (the fast tier's budget)")


def pytest_collection_modifyitems(items):
    # A test that uses the shared Ray or Spark carries its marker, whatever its file says, so
    # that `-m "not spark and not ray"` leaves out every test that starts them. The names are the
    # fixtures' closure: a test of `spark` has `ray_session` too.
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        if "ray_session" in names:
            item.add_marker(pytest.mark.ray)
        # A test that starts processes of its own and uses neither shared session can run in a
        # pytest of its own, beside the one that holds the shared Ray and Spark (see `make test`).
        if item.get_closest_marker("processes") and "ray_session" not in names:
            item.add_marker(pytest.mark.beside)


def pytest_sessionstart(session):
    session.config._actorflow_started = time.monotonic()


def pytest_sessionfinish(session, exitstatus):
    limit = session.config.getoption("--fast-limit-s")
    if limit is None or hasattr(session.config, "workerinput"):  # judged once, by the controller
        return
    took = time.monotonic() - session.config._actorflow_started
    if took > limit:
        session.config._actorflow_over_limit = (took, limit)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    over = getattr(config, "_actorflow_over_limit", None)
    if over is not None:
        terminalreporter.write_line(
            f"the fast tier took {over[0]:.0f} s, over its budget of {over[1]:.0f} s: move slow tests out of it "
            "(mark them ray, spark or processes) or make them faster", red=True)
