"""The object store's pages dropped from an actor's page table: now ``actors.upstream.linux``.

Kept for the modules that import ``process_pages`` from here.
"""

from __future__ import annotations

from .upstream.linux import StorePages, process_pages, store_mappings

__all__ = ["StorePages", "process_pages", "store_mappings"]
