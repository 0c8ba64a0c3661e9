"""Calls between an actor's own methods, without Ray's tracing shims.

Ray wraps every method of a class it makes into an actor, private ones included, in a function
that looks for a tracing context: a Python frame and a check on every call, and one more frame
each time a wrapped coroutine resumes. Through Ray that is how a remote call is traced. Between
an actor's own methods it only costs: an operator actor calls some of them once per record.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["bind_private_methods"]


def bind_private_methods(actor: Any) -> None:
    """Bind each private method of ``actor``'s class (``_name``, not ``__name__``) to the instance
    as the function it was before Ray wrapped it; a method Ray did not wrap is left as it is.

    Remote calls go through the class, so they keep their shims; only private methods, which no
    caller reaches through Ray, are bound here.
    """
    for name, member in inspect.getmembers(type(actor), inspect.isfunction):
        if name.startswith("_") and not name.startswith("__"):
            original = getattr(member, "__wrapped__", None)
            if original is not None:
                setattr(actor, name, original.__get__(actor))
