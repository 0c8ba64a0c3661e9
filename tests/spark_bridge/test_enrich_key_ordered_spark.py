"""enrich(ordered="key") from Spark: each user's rows come back in input order, while other users'
rows overtake a slow one; a key the rows do not have is refused before any job."""

from __future__ import annotations

import asyncio

import pytest

import actorflow as af
from actorflow.errors import ConfigurationError

pytestmark = [pytest.mark.spark, pytest.mark.ray]

USERS = 6


async def _slow_for_user_zero(row):
    await asyncio.sleep(0.02 if row["user"] == 0 else 0.001)
    return {"score": row["id"] * 2}


def _clicks(spark, n: int):
    # `seq` numbers each user's rows 0, 1, 2, ... in input order.
    return spark.createDataFrame([(i, i % USERS, i // USERS) for i in range(n)], "id long, user long, seq long")


def test_each_users_rows_keep_their_order_and_the_others_overtake_a_slow_one(spark):
    out = af.enrich(_clicks(spark, 600), _slow_for_user_zero, ordered="key", order_key="user", capacity=20,
                    parallelism=1, progress=False)
    rows = out.collect()
    assert sorted((r.id, r.score) for r in rows) == [(i, i * 2) for i in range(600)]
    for user in range(USERS):
        assert [r.seq for r in rows if r.user == user] == list(range(100)), f"user {user} out of order"
    ids = [r.id for r in rows]
    assert ids != sorted(ids), "no user overtook the slow one"


def test_an_order_key_must_name_a_column_and_come_with_ordered_key(spark):
    clicks = _clicks(spark, 12)
    with pytest.raises(ConfigurationError, match=r"order_key names 'usr', which is not a column of the input; its "
                                                  r"columns are \['id', 'user', 'seq'\]"):
        af.enrich(clicks, _slow_for_user_zero, ordered="key", order_key="usr", progress=False)
    with pytest.raises(ConfigurationError, match="ordered='key' needs an order_key"):
        af.enrich(clicks, _slow_for_user_zero, ordered="key", progress=False)
    with pytest.raises(ConfigurationError, match="order_key is for ordered='key'; ordered is True"):
        af.enrich(clicks, _slow_for_user_zero, order_key="user", progress=False)
