"""How many examples a property test draws: as its decorator says, or a fifth of that in the fast tier.

``make test-fast`` sets ``ACTORFLOW_HYPOTHESIS=fast``; ``make test`` draws the full count.
"""

from __future__ import annotations

import os

FAST = os.environ.get("ACTORFLOW_HYPOTHESIS") == "fast"


def examples(count: int) -> int:
    """``count`` in the whole suite; in the fast tier a fifth of it, and at least 10."""
    return max(10, count // 5) if FAST else count
