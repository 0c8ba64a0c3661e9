"""How a source's blocks are split over its readers: every row once, in order, in even shares."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorflow.cluster.job_graph import SourceNode


def _blocks(rows: list[int]) -> list[pa.Table]:
    start = 0
    tables = []
    for n in rows:
        tables.append(pa.table({"id": pa.array(range(start, start + n), pa.int64())}))
        start += n
    return tables


def _ids(split: list) -> list[int]:
    ids: list[int] = []
    for piece in split:
        table, first, length = piece if isinstance(piece, tuple) else (piece, 0, piece.num_rows)
        ids += table.column("id").to_pylist()[first:first + length]
    return ids


def _split(rows: list[int], parallelism: int, interleave: bool = False) -> list[list]:
    return SourceNode(_blocks(rows), rows, parallelism, batch_size=1000).split(interleave=interleave)


def test_two_blocks_of_nearly_equal_size_go_to_two_readers():
    # A Spark DataFrame of 1,000,000 rows in two range partitions came as blocks of 499,553 and
    # 500,447 rows: both went to the first reader, and the second had nothing to do.
    splits = _split([499_553, 500_447], 2)
    assert [len(_ids(s)) for s in splits] == [500_000, 500_000]


def test_one_block_is_shared_by_every_reader():
    splits = _split([10_000], 4)
    assert [_ids(s) for s in splits] == [list(range(k * 2_500, (k + 1) * 2_500)) for k in range(4)]


def test_a_whole_block_is_passed_as_it_is_and_only_a_cut_one_as_a_piece():
    blocks = _blocks([100, 100, 100, 100])
    splits = SourceNode(blocks, [100] * 4, 2).split()
    assert splits == [blocks[:2], blocks[2:]]


def test_an_empty_input_gives_every_reader_nothing_to_read_but_keeps_its_blocks():
    splits = _split([0, 0], 3)
    assert [sum(len(_ids([p])) for p in s) for s in splits] == [0, 0, 0]
    assert sum(len(s) for s in splits) == 2


@given(rows=st.lists(st.integers(0, 3_000), min_size=1, max_size=12), parallelism=st.integers(1, 6))
def test_contiguous_splits_hold_every_row_once_in_order_and_differ_by_at_most_one_row(rows, parallelism):
    splits = _split(rows, parallelism)
    assert len(splits) == parallelism
    ids = [_ids(s) for s in splits]
    assert [i for split in ids for i in split] == list(range(sum(rows)))
    sizes = [len(split) for split in ids]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_interleaved_splits_deal_batches_round_robin(parallelism):
    splits = _split([2_500, 1_500], parallelism, interleave=True)
    dealt = sorted(i for s in splits for i in _ids(s))
    assert dealt == list(range(4_000))
    assert [len(s) for s in splits] == [len(range(k, 5, parallelism)) for k in range(parallelism)]
