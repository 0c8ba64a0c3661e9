"""Why a job's functions cannot travel to its actors: the object that cannot be pickled, by name.

Ray pickles an actor's arguments with cloudpickle, which takes a function with the globals and
closure variables it refers to, by value. One of them that cannot be pickled (a lock, an open
client, a socket) fails the whole argument, and Ray's own report names the argument, not the
variable. ``explain_unpicklable`` walks from the argument to the innermost object that fails.

>>> import threading
>>> explain_unpicklable({"rows": [1, 2], "guard": threading.Lock()})
"dict object holds ['guard'], a _thread.lock: TypeError: cannot pickle '_thread.lock' object"
>>> explain_unpicklable(len) is None
True
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Iterator

import ray.cloudpickle

__all__ = ["explain_unpicklable"]

_MAX_DEPTH = 6
_OUR_PACKAGES = frozenset({"actorflow"})


def explain_unpicklable(obj: Any) -> str | None:
    """What in ``obj`` cannot be pickled, as a path of names down to it; None if it pickles.

    The path starts at the first object that is not actorflow's own (the user's function, not
    the operator factory around it).
    """
    error = _pickle_error(obj)
    if error is None:
        return None
    steps, error = _innermost(obj, error, _MAX_DEPTH)
    while steps and _is_ours(obj):
        (_, obj), steps = steps[0], steps[1:]
    text = " ".join([_describe(obj), *(label for label, _ in steps)])
    if steps:
        text += f", a {_type_name(steps[-1][1])}"
    return f"{text}: {type(error).__name__}: {error}"


def _pickle_error(obj: Any) -> BaseException | None:
    try:
        ray.cloudpickle.dumps(obj)
    except Exception as error:  # noqa: BLE001 - any failure to pickle is what is looked for
        return error
    return None


def _innermost(obj: Any, error: BaseException, depth: int) -> tuple[list[tuple[str, Any]], BaseException]:
    """The steps from ``obj`` down to the deepest part that fails to pickle, and its error."""
    if depth == 0:
        return [], error
    for label, part in _parts(obj):
        part_error = _pickle_error(part)
        if part_error is not None:
            steps, inner = _innermost(part, part_error, depth - 1)
            return [(label, part), *steps], inner
    return [], error


def _is_ours(obj: Any) -> bool:
    module = obj.__module__ if inspect.isfunction(obj) else type(obj).__module__
    return (module or "").split(".")[0] in _OUR_PACKAGES


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What cloudpickle takes along with ``obj``, each with how ``obj`` refers to it."""
    if isinstance(obj, functools.partial):
        yield "wraps", obj.func
        for i, arg in enumerate(obj.args):
            yield f"argument {i}", arg
        for name, value in obj.keywords.items():
            yield f"argument {name!r}", value
        return
    if inspect.ismethod(obj):
        yield "is a method of", obj.__self__
        return
    if inspect.isfunction(obj):
        try:
            variables = inspect.getclosurevars(obj)
        except (TypeError, ValueError):
            return
        for name, value in variables.nonlocals.items():
            yield f"refers to {name!r}", value
        for name, value in variables.globals.items():
            yield f"refers to global {name!r}", value
        for i, value in enumerate(obj.__defaults__ or ()):
            yield f"has default {i}", value
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"holds [{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"holds [{i}]", value
        return
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict) and not isinstance(obj, type):
        for name, value in attributes.items():
            yield f"has attribute {name!r}", value


def _describe(obj: Any) -> str:
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return f"function {obj.__qualname__}".replace(".<locals>.", ".")
    return f"{_type_name(obj)} object"


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
