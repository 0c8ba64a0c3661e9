"""Shared fixtures: one local Ray and one Spark-on-Ray session for the whole run."""

import pytest

from tests._spark_fixtures import ray_session, spark  # noqa: F401


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
