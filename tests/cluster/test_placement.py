"""How a job's instances are dealt over the nodes of a cluster, without Ray: each next instance to
the node with room that holds fewest so far. The three-node tests (test_nodes.py) check where
the instances of real jobs run."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from actorflow.cluster.job import deal

UNBOUNDED = math.inf


def test_instances_that_ask_for_nothing_go_round_the_nodes_in_turn():
    assert deal({"b": UNBOUNDED, "a": UNBOUNDED, "c": UNBOUNDED}, 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_node_without_room_gets_none_and_a_full_one_gets_no_more():
    # The head alone offers the resource asked for: everything goes there.
    assert deal({"head": 100, "w1": 0, "w2": 0}, 3) == ["head", "head", "head"]
    # Room for one on a, for three on b: a takes one, b the rest.
    assert deal({"a": 1, "b": 3}, 4) == ["a", "b", "b", "b"]


def test_instances_past_the_room_of_every_node_are_left_to_ray():
    assert deal({"a": 1, "b": 1}, 3) == ["a", "b", None]
    assert deal({"a": 0}, 2) == [None, None]


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.one_of(st.integers(0, 5), st.just(UNBOUNDED)),
                       min_size=1, max_size=6),
       st.integers(0, 30))
def test_no_node_takes_more_than_its_room_and_the_fullest_holds_at_most_one_more_than_any_node_with_room(room, n):
    nodes = deal(room, n)
    assert len(nodes) == n
    held = Counter(node for node in nodes if node is not None)
    assert all(held[node] <= room[node] for node in held)
    # Ray's choice only once every node is full.
    assert (None in nodes) == (n > sum(room.values()))
    # Evenly: a node left with room holds no fewer than one less than any other node.
    for node, space in room.items():
        if held[node] < space:
            assert all(count <= held[node] + 1 for count in held.values())
