"""Shared fixtures: one local Ray and one Spark-on-Ray session for the whole run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    from spark_bridge.session import ensure_ray

    ensure_ray()
    yield
