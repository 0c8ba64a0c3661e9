"""Calls between an actor's own methods, without Ray's tracing shims: now ``actors.upstream.ray``.

Kept for ``actors.operator_actor``, which imports ``bind_private_methods`` from here.
"""

from __future__ import annotations

from .upstream.ray import bind_private_methods

__all__ = ["bind_private_methods"]
