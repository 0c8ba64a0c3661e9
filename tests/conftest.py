"""Shared fixtures: one local Ray and one Spark-on-Ray session for the whole run."""

from tests._spark_fixtures import ray_session, spark  # noqa: F401
