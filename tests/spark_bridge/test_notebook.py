"""examples/enrichment.ipynb, run headless in a kernel of its own, and its outputs checked for real.

The kernel is this interpreter (a kernelspec written to a temporary ``JUPYTER_PATH``, never
installed for the user), with this virtualenv's ``bin/`` first on ``PATH``. The notebook starts a
local Ray and Spark on Ray of its own beside this process's: the kernel gets ``RAY_ADDRESS=local``,
so that ``ray.init()`` starts a new cluster even where ``ray start`` left a cluster's address in
``/tmp/ray`` (which it would join otherwise), and none of this process's Spark gateway variables.
Its Ray and Spark must differ from this process's, which must still work afterwards, and every
process the kernel started must be gone once the notebook has stopped what it started and the
kernel has shut down.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import psutil
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.ray, pytest.mark.processes, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "enrichment.ipynb"
KERNEL = "actorflow-notebook-test"
WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernelspec of this interpreter, found through ``JUPYTER_PATH``, and the kernel's environment."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "actorflow tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    env = {k: v for k, v in os.environ.items()
           # This process's Ray and Spark gateway, and a backend that would keep plots out of the notebook.
           if not k.startswith(("RAY_ADDRESS", "PYSPARK_GATEWAY", "MPLBACKEND"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        RAY_ADDRESS="local",
        IPYTHONDIR=str(tmp_path / "ipython"),  # no profile or startup file of the user's
    )
    return env


def _execute(notebook, env, on_cell=None):
    """Run every cell in a new kernel; ``on_cell(index, kernel_pid)`` after each. Returns the
    notebook, with its widgets' last states in its metadata, as Jupyter saves them."""
    client = nbclient.NotebookClient(notebook, kernel_name=KERNEL, timeout=300,
                                     resources={"metadata": {"path": str(ROOT)}})
    with client.setup_kernel(env=env):
        pid = client.km.provisioner.pid
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
            if on_cell is not None:
                on_cell(index, pid)
        client.set_widgets_metadata()
    return notebook


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _data(cell, mime):
    return [o.data[mime] for o in cell.outputs if o.output_type in ("display_data", "execute_result") and mime in o.data]


def _cell(notebook, needle):
    found = [c for c in notebook.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"{len(found)} code cells hold {needle!r}"
    return found[0]


def _probe(source):
    return nbformat.v4.new_code_cell(source, metadata={"probe": True})


def test_the_notebook_enriches_shows_the_job_plots_and_lists_dead_letters(spark, kernel):
    import ray

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    start = next(i for i, c in enumerate(notebook.cells) if "spark_session(" in c.source)
    # Probes of the kernel's own runtime, after the cell that starts it.
    notebook.cells.insert(start + 1, _probe(
        "import sys\nprint('PROBE', sys.executable, ray.get_runtime_context().gcs_address, spark.sparkContext.applicationId)"))
    started: dict[int, float] = {}  # pid -> create time, of every process the kernel started
    left_running: list[str] = []  # after the last cell, before the kernel shuts down

    def watch(index, pid):
        for child in psutil.Process(pid).children(recursive=True):
            try:
                started.setdefault(child.pid, child.create_time())
            except psutil.NoSuchProcess:
                pass
        if index == len(notebook.cells) - 1:
            # The notebook stopped Ray and the service itself. What may stay until the kernel
            # exits: Spark's driver JVM (pyspark keeps its gateway for the life of the process)
            # and multiprocessing's resource tracker.
            deadline = time.monotonic() + 30
            while True:
                left_running[:] = [c for c in _commands(psutil.Process(pid).children(recursive=True))
                                   if "pyspark-shell" not in c and "resource_tracker" not in c]
                if not left_running or time.monotonic() > deadline:
                    break
                time.sleep(0.5)

    _execute(notebook, kernel, watch)

    executable, gcs, app = _text(notebook.cells[start + 1]).split()[1:]
    assert executable == sys.executable
    assert gcs != ray.get_runtime_context().gcs_address  # a Ray of its own
    assert app != spark.sparkContext.applicationId

    match = re.search(r"^([\d,]+) clicks, (\d+) by unknown users", _text(_cell(notebook, "CLICKS = ")), re.M)
    assert match, _text(_cell(notebook, "CLICKS = "))
    clicks, unknown = int(match[1].replace(",", "")), int(match[2])
    assert (clicks, unknown) == (5_000, 5)

    enrich_cell = _cell(notebook, "await enrich_async(")
    match = re.search(r"^([\d,]+) enriched, ([\d,]+) dead letters, of ([\d,]+) clicks", _text(enrich_cell), re.M)
    assert match, _text(enrich_cell)
    enriched, dead, total = (int(g.replace(",", "")) for g in match.groups())
    assert (enriched + dead, dead, total) == (clicks, unknown, clicks)
    bars = _data(enrich_cell, WIDGET)
    assert len(bars) == 1, "no notebook progress bar (tqdm's widget) in the enrich cell"
    # The bar as the saved notebook keeps it: complete and closed, not at its last update before the end.
    label, bar, numbers = _widget_children(notebook, bars[0]["model_id"])
    assert (bar["value"], bar["max"], bar["bar_style"]) == (clicks, clicks, "success"), bar
    assert label["value"].replace("\u2007", " ") == "notebook-clicks · done: 100%", label
    assert re.fullmatch(r" 5000/5000 \[00:\d\d<00:00, [\d.]+rec/s\]", numbers["value"].replace("\u2007", " ")
                        .replace("&lt;", "<")), numbers

    html = _data(_last_job_cell(notebook), "text/html")
    assert len(html) == 1 and "notebook-clicks" in html[0]
    assert re.search(r"<code>enrich</code></td><td>2</td><td>5,000</td><td>4,995</td><td>5</td>", html[0]), html[0]

    pngs = _data(_cell(notebook, "plt.show()"), "image/png")
    assert len(pngs) == 1
    png = base64.b64decode(pngs[0])
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width >= 400 and height >= 250, (width, height)

    letters = _data(_cell(notebook, 'dead.orderBy("click_id")'), "text/html")
    assert len(letters) == 1
    body = letters[0].split("<tbody>")[1].split("</tbody>")[0]
    assert body.count("<tr") == unknown and body.count("NotFoundError") == unknown

    # Everything the notebook started has stopped: Ray's processes, Spark's JVMs, the service.
    assert not left_running, [c[:300] for c in left_running]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _alive(started):
        time.sleep(0.5)
    assert started and not _alive(started), [psutil.Process(p).cmdline()[:3] for p in _alive(started)]

    # This process's Ray and Spark are untouched.
    assert spark.range(5).count() == 5
    assert ray.get(ray.put("still here")) == "still here"


def _widget_children(notebook, model_id):
    """The states of the widgets inside the widget ``model_id`` (tqdm's: label, bar, numbers)."""
    states = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    return [states[child.removeprefix("IPY_MODEL_")]["state"] for child in states[model_id]["state"]["children"]]


def _last_job_cell(notebook):
    found = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip() == "last_job()"]
    assert len(found) == 1
    return found[0]


def _commands(processes) -> list[str]:
    commands = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                commands.append(" ".join(process.cmdline()))
        except psutil.NoSuchProcess:
            pass
    return commands


def _alive(started: dict[int, float]) -> list[int]:
    alive = []
    for pid, created in started.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_without_ipywidgets_the_bar_falls_back_to_text(kernel, tmp_path):
    # A kernel where ipywidgets cannot be imported: tqdm.auto, and so the job's bar, is tqdm's text bar.
    shadow = tmp_path / "shadow" / "ipywidgets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('ipywidgets is not installed here')\n")
    env = {**kernel, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent), kernel.get("PYTHONPATH")]))}
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(
            "try:\n    import ipywidgets\nexcept ImportError as error:\n    print('no ipywidgets:', error)"),
        nbformat.v4.new_code_cell(
            "import tqdm.notebook\nfrom actorflow.cluster import progress\n"
            "from actorflow.spark_bridge import enrich_async, last_job\n"
            "print('widget bar:', issubclass(progress.tqdm, tqdm.notebook.tqdm_notebook))"),
        nbformat.v4.new_code_cell(  # the bar as a job makes it
            "bar = progress.JobProgress()\nbar.name('no-widgets'); bar.phase('run'); bar.set_total(3)\n"
            "bar.advance(3); bar.close()"),
    ])
    _execute(notebook, env)
    assert _text(notebook.cells[0]) == "no ipywidgets: ipywidgets is not installed here\n"
    assert _text(notebook.cells[1]) == "widget bar: False\n"
    bar = notebook.cells[2].outputs
    assert not [o for o in bar if WIDGET in o.get("data", {})]
    assert "no-widgets · done: 100%" in "".join(o.get("text", "") for o in bar if o.output_type == "stream"), bar
