"""The runnable examples of the internals pages and of the contributing page, as they are written."""

from __future__ import annotations

import ast
import os
import platform
from importlib import metadata

from tests.docs import ROOT, blocks, run_page

STORE_PAGES = "docs/internals/store-pages.md"


def _text_blocks(page: str) -> list[str]:
    return [block.code for block in blocks(page) if block.language == "text"]


def test_store_pages_counts_bytes_and_chooses_only_the_stores_shared_mappings(capsys, monkeypatch):
    monkeypatch.delenv("ACTORFLOW_NO_STORE_PAGES", raising=False)
    namespace = run_page("docs/internals/store-pages.md")
    # 40 MiB is under the 64 MiB threshold; 40 + 30 passes it once, and the count starts again.
    assert (namespace["first"], namespace["second"], namespace["pages"].releases) == (False, True, 1)
    assert namespace["pages"].passed(63 << 20) is False
    # Only the first line is a shared mapping named like the store (0x7f00-0x7f80).
    assert namespace["chosen"] == [(int("7f00", 16), int("7f80", 16))]
    assert capsys.readouterr().out == "".join(_text_blocks(STORE_PAGES))


def test_console_filters_drop_the_noise_line_of_a_child_and_pass_the_rest(capfd, monkeypatch):
    monkeypatch.delenv("ACTORFLOW_NO_CONSOLE_FILTER", raising=False)
    namespace = run_page("docs/internals/console-filters.md")
    assert namespace["child"].returncode == 0
    assert not namespace["copier"].is_alive()
    err = capfd.readouterr().err
    assert err.splitlines() == ["a real problem"]
    assert _text_blocks("docs/internals/console-filters.md")[0].strip() == "a real problem"


def test_workarounds_page_lists_each_workaround_with_the_installed_version(capsys, monkeypatch):
    from actorflow.actors.upstream import WORKAROUNDS

    monkeypatch.setenv("ACTORFLOW_NO_MALLOPT", "1")  # one switched off, to see it read
    namespace = run_page("docs/internals/workarounds.md")
    checked = namespace["checked"]
    assert set(checked) == set(WORKAROUNDS) and len(checked) == 10
    installed = {
        "ray": metadata.version("ray"),
        "py4j": metadata.version("py4j"),
        "cpython": "{}.{}".format(*platform.python_version_tuple()[:2]),
        "glibc": platform.libc_ver()[1],
        "linux": ".".join(platform.release().split(".")[:2]),
    }
    for name, (switch, upstream, version, verified, on) in checked.items():
        assert switch == f"ACTORFLOW_NO_{name.upper()}"
        assert version == installed[upstream], name
        assert verified == (version in WORKAROUNDS[name].verified)
        assert on == (os.environ.get(switch, "") in ("", "0")), name
    assert checked["mallopt"][4] is False and checked["store_pages"][4] is True
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [w.switch for w in WORKAROUNDS.values()]


def _fences(page: str) -> list[tuple[str, bool]]:
    """Each fenced block's language, and whether it runs: a plain scan of the page's lines."""
    found, inside, before = [], False, ""
    for line in (ROOT / page).read_text().splitlines():
        if line.startswith("```"):
            if not inside:
                language = line[3:].strip()
                found.append((language, language in ("python", "bash") and before != "<!-- illustration -->"))
            inside = not inside
        elif line.strip():
            before = line.strip()
    return found


def test_contributing_lists_which_blocks_of_a_page_run():
    namespace = run_page("docs/contributing.md")
    assert namespace["shown"] == _fences(STORE_PAGES)
    assert namespace["shown"] == ast.literal_eval(_text_blocks("docs/contributing.md")[0])
