"""Session-scoped fixtures for the Ray and Spark rings of the tests.

Starting Ray takes seconds and Spark on Ray many more, so a test run shares one of each.
Import them into ``conftest.py``::

    from tests._spark_fixtures import ray_session, spark  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from actorflow.spark_bridge.session import ensure_ray, spark_session, stop_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ray_session", "spark"]


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray for the whole run; shut down at the end only if this fixture started it."""
    import os

    import ray

    started_here = not ray.is_initialized()
    # Workers push their metrics to the node's exporter every 10 s by default; the metrics tests
    # would wait that long for each value they check.
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
    ensure_ray(num_cpus=None)
    yield
    if started_here:
        ray.shutdown()


@pytest.fixture(scope="session")
def spark(ray_session: None) -> Iterator[SparkSession]:
    """One Spark-on-Ray session (1 executor, 1 core, 1g) for the whole run."""
    session = spark_session(
        "actorflow-tests", num_executors=1, executor_cores=1, executor_memory="1g"
    )
    yield session
    stop_spark()
