"""The docs site builds in strict mode, and its pages render in a real browser as a reader sees them.

The browser is Debian's Chromium, driven through its ChromeDriver by selenium, against the built site
served on 127.0.0.1. Each page's screenshot is kept in ``build/screenshots/``.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs import ROOT

pytestmark = pytest.mark.processes

SCREENSHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site, built by ``mkdocs build --strict`` as ``make docs`` builds it; its output kept for the test."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, check=False)
    return site, done


def test_the_site_builds_in_strict_mode_without_a_warning(built_site):
    site, done = built_site
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    for page in ("index.html", "getting-started/index.html", "guides/windows/index.html",
                 "reference/api/index.html", "reference/cli/index.html", "reference/errors/index.html",
                 "reference/metrics/index.html", "performance/index.html"):
        assert (site / page).is_file(), page
    # The generated reference holds what the code defines.
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    assert "enrich_stream" in api and "TumblingEventTimeWindows" in api
    cli = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    assert "checkpoints" in cli and "--side-outputs" in cli
    errors = (site / "reference/errors/index.html").read_text(encoding="utf-8")
    assert "UnfinishedRunError" in errors and "AsyncTimeoutError" in errors


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def served(built_site):
    site, done = built_site
    assert done.returncode == 0, done.stdout + done.stderr
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("the browser test needs Debian's chromium and chromium-driver: `make test` installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    # No sandbox as root; no background networking, which this machine's closed network refuses.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic", "--window-size=1280,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(60)
    yield chrome
    chrome.quit()


def _open(browser, url: str, name: str) -> None:
    browser.get(url)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _navigation(browser) -> list[str]:
    return [a.get_attribute("textContent").strip()
            for a in browser.find_elements("css selector", "nav.md-nav--primary a.md-nav__link")]


def _images(browser, ending: str) -> list[tuple[str, int, bool]]:
    """Each image whose source ends so: its source, its natural width (0 unless it loaded), complete."""
    return [(img.get_attribute("src"), int(browser.execute_script("return arguments[0].naturalWidth", img)),
             bool(browser.execute_script("return arguments[0].complete", img)))
            for img in browser.find_elements("css selector", "article img") if img.get_attribute("src").endswith(ending)]


def test_the_getting_started_page_renders_with_its_navigation_and_the_diagram(served, browser):
    _open(browser, f"{served}/getting-started/", "getting-started")
    assert "Getting started" in browser.title
    links = _navigation(browser)
    for section in ("Getting started", "Windows", "Streams", "Architecture", "Python API", "Performance"):
        assert section in links, (section, links)
    diagrams = _images(browser, ".svg")
    assert diagrams and all(width > 0 and complete for _, width, complete in diagrams), diagrams
    assert browser.find_elements("css selector", "article pre code"), "no code block on the page"


def test_the_windows_page_renders_its_guide(served, browser):
    _open(browser, f"{served}/guides/windows/", "windows")
    heading = browser.find_element("css selector", "article h1").text
    assert heading.startswith("Windows"), heading
    assert "Windows" in _navigation(browser)
    assert len(browser.find_elements("css selector", "article pre code")) >= 2


def test_the_performance_page_shows_each_benchmarks_plot_as_an_image(served, browser):
    _open(browser, f"{served}/performance/", "performance")
    plots = _images(browser, ".png")
    assert plots, "no plot on the performance page"
    assert all(width > 0 and complete for _, width, complete in plots), plots
    assert browser.find_elements("css selector", "article table"), "no table of figures"


def test_the_architecture_page_shows_its_diagrams(served, browser):
    _open(browser, f"{served}/concepts/architecture/", "architecture")
    diagrams = _images(browser, ".svg")
    assert len(diagrams) >= 2 and all(width > 0 and complete for _, width, complete in diagrams), diagrams
