"""The README's Python examples, to run as they are written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(containing: str) -> str:
    """The one ```python block of the README whose code contains ``containing``."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    found = [block for block in blocks if containing in block]
    if len(found) != 1:
        raise AssertionError(f"expected one README example containing {containing!r}, found {len(found)}")
    return found[0]
