"""An actor drops its entries for the object store's pages without losing a byte of their data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from actorflow.actors.upstream.linux import StorePages, store_mappings

MAPS = """\
55d0c0000000-55d0c0021000 r-xp 00000000 08:01 1234   /usr/bin/python3.11
7f1a00000000-7f1b00000000 rw-s 00000000 00:1a 42     /dev/shm/plasmaAbC123
7f1b00000000-7f1b00100000 rw-p 00000000 00:1a 43     /tmp/ray/plasma_fallback
7f1c00000000-7f1c00100000 rw-s 00000000 00:1a 44     /dev/shm/other-segment
7f1d00000000-7f1d00100000 rw-p 00000000 00:00 0
7f1e00000000-7f1e00100000 rw-s 00000000 00:1a 45     /tmp/ray/session/plasmaXYZ (deleted)
"""


def test_only_shared_mappings_of_the_store_are_chosen():
    assert store_mappings(MAPS) == [
        (0x7F1A00000000, 0x7F1B00000000),
        (0x7F1E00000000, 0x7F1E00100000),
    ]


def test_private_and_unnamed_mappings_are_never_chosen():
    assert store_mappings("7f00-7f80 rw-p 00000000 00:1a 42 /dev/shm/plasmaAbC\n7f80-7f90 rw-s 0 00:00 0\n") == []


def test_passed_releases_once_enough_bytes_passed():
    pages = StorePages(every_bytes=100)
    assert [pages.passed(40), pages.passed(40), pages.passed(40), pages.passed(10)] == [False, False, True, False]
    assert pages.releases == 1


def test_every_bytes_must_be_positive():
    with pytest.raises(ValueError, match="every_bytes must be > 0, got 0"):
        StorePages(every_bytes=0)


def _rss_shmem_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    raise AssertionError("no RssShmem in /proc/self/status")


def _in_fresh_actor(actor_class, method: str, values: np.ndarray) -> dict:
    """What ``method`` of a new actor reports on a block of ``values`` put in the object store
    (by reference, so that the actor reads it from the store)."""
    ref = ray.put(pa.table({"v": values}))
    actor = actor_class.remote()
    try:
        return ray.get(getattr(actor, method).remote([ref]))
    finally:
        ray.kill(actor)


@ray.remote(num_cpus=0)
class _Reader:
    def read_release_read(self, refs: list) -> dict:
        [ref] = refs
        table = ray.get(ref)
        first_sum = pc.sum(table["v"]).as_py()  # every page of the block is read
        before = _rss_shmem_kib()
        released = StorePages().release()
        after = _rss_shmem_kib()
        second_sum = pc.sum(table["v"]).as_py()  # the same block, read again after the release
        return {"before": before, "after": after, "again": _rss_shmem_kib(), "released": released,
                "sums": (first_sum, second_sum)}


@pytest.mark.ray
def test_an_actor_releases_the_store_pages_it_read_and_reads_them_again_intact(ray_session):
    values = np.arange(25_000_000, dtype=np.int64)  # 200 MB in the object store
    seen = _in_fresh_actor(_Reader, "read_release_read", values)
    expected = int(values.sum())
    assert seen["sums"] == (expected, expected)
    assert seen["released"] >= 1
    block_kib = values.nbytes // 1024
    assert seen["before"] >= 0.9 * block_kib, seen
    assert seen["after"] < 0.1 * block_kib, seen  # the entries went, the data stayed in the store
    assert seen["again"] >= 0.9 * block_kib, seen  # reading maps the same pages again


@ray.remote(num_cpus=0)
class _Converter:
    def conform(self, refs: list) -> dict:
        from actorflow.spark_bridge.arrow_io import _conform_to_ipc

        [ref] = refs
        table = ray.get(ref)
        blob, rows = _conform_to_ipc(table.schema, False, table)  # what the conversion task runs
        return {"rows": rows, "blob": len(blob), "shmem": _rss_shmem_kib()}


@pytest.mark.ray
def test_the_conversion_task_for_spark_leaves_no_store_pages_in_its_worker(ray_session):
    values = np.arange(12_500_000, dtype=np.int64)  # 100 MB: over the release threshold, read and written
    seen = _in_fresh_actor(_Converter, "conform", values)
    assert seen["rows"] == len(values) and seen["blob"] >= values.nbytes
    assert seen["shmem"] < 0.1 * values.nbytes // 1024, seen
