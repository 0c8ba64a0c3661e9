"""A griffe extension: a docstring's doctest examples (``>>>`` lines and the output after them) render as
Python console blocks. ``tests/docs_site/test_docstrings.py`` runs each of them as a doctest."""

from __future__ import annotations

import griffe


def fenced(text: str) -> str:
    """``text`` with each run of doctest lines (a ``>>>`` line, then up to a blank line) in a ```pycon fence.

    >>> print(fenced("Adds.\\n\\n>>> 1 + 1\\n2\\n\\nDone."))
    Adds.
    <BLANKLINE>
    ```pycon
    >>> 1 + 1
    2
    ```
    <BLANKLINE>
    Done.
    """
    out: list[str] = []
    inside = fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("```"):
            fence = not fence
        if not fence and not inside and stripped.startswith(">>>"):
            out.append("```pycon")
            inside = True
        elif inside and not stripped:
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: object) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fenced(obj.docstring.value)
