"""``explain_unpicklable``: the path from a job's function to the object that cannot be pickled."""

from __future__ import annotations

import doctest
import functools
import socket
import threading

from actorflow.cluster import pickling
from actorflow.cluster.pickling import explain_unpicklable
from actorflow.operators.async_function import AsyncFunction

LOCK = threading.Lock()


def test_the_module_examples_hold():
    result = doctest.testmod(pickling)
    assert result.attempted > 0 and result.failed == 0


def test_a_function_that_pickles_has_nothing_to_explain():
    def plus_one(row):
        return [{**row, "x": row["id"] + 1}]

    assert explain_unpicklable(plus_one) is None
    assert explain_unpicklable(functools.partial(plus_one)) is None


def test_a_closure_variable_is_named_with_its_type():
    with socket.socket() as sock:
        def send(row):
            sock.send(b"x")
            return [row]

        why = explain_unpicklable(send)
    assert why is not None
    assert why.startswith("function test_a_closure_variable_is_named_with_its_type.send refers to 'sock', a socket.socket: ")


def test_an_attribute_of_a_user_async_function_is_named():
    class Lookup(AsyncFunction):
        def __init__(self):
            self.guard = LOCK

        def async_invoke(self, value, result_future):
            result_future.complete([value])

    why = explain_unpicklable(Lookup())
    assert why is not None
    assert "Lookup object has attribute 'guard', a _thread.lock: TypeError: cannot pickle '_thread.lock' object" in why


def test_the_path_goes_through_wrappers_to_the_innermost_culprit():
    def uses_lock(row):
        with LOCK:
            return [row]

    def outer(row):
        return uses_lock(row)

    why = explain_unpicklable(functools.partial(outer))
    assert why is not None
    # The partial and the closure are on the way; the global of the inner function is the end.
    assert "wraps" in why and "refers to 'uses_lock' refers to global 'LOCK', a _thread.lock" in why


def test_actorflows_own_wrappers_are_left_out_of_the_path():
    def lookup(row):
        with LOCK:
            return [row]

    def factory():  # as an operator factory of actorflow's would
        return lookup

    factory.__module__ = "actorflow.cluster.datastream"
    why = explain_unpicklable(factory)
    assert why is not None
    assert why.startswith("function test_actorflows_own_wrappers_are_left_out_of_the_path.lookup refers to global 'LOCK'")
