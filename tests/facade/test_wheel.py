"""actorflow as a user meets it: a wheel installed into a fresh environment, and the editable install,
each driving a job from a project that has packages of its own named ``operators`` and ``cluster``.

The fresh environment holds the wheel alone; the dependencies (Ray, Spark, pyarrow) come from this
run's environment through a ``.pth`` line, which makes no package of actorflow's importable (the
editable install's finder is a ``.pth`` of its own, which Python reads only in a site directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).resolve().parent / "shadowing_project"

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    (found,) = out.glob("actorflow-*.whl")
    return found


@pytest.fixture(scope="module")
def fresh_python(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run_job(python: Path, tmp_path: Path) -> dict:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    # No RAY_ADDRESS: the job starts its own local Ray (ensure_ray asks for "local"), and Ray's state API
    # would take the variable over the address it is given, failing where other Rays run beside it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PYSPARK_", "PYTHONPATH"))}
    env.update(PATH=os.pathsep.join([str(python.parent), env.get("PATH", "")]))
    done = subprocess.run([str(python), "job.py"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def _expected_windows() -> list[tuple[str, int, int]]:
    totals: dict[tuple[str, int], list[int]] = {}
    for i in range(60):
        totals.setdefault((f"u{i % 3}", i // 10), []).append(i)
    return sorted((user, len(values), sum(values)) for (user, _), values in totals.items())


def _check(shown: dict) -> None:
    users = "the user's operators/the user's cluster"
    assert shown["doubled_ok"] is True
    assert shown["actor_imports"] == [users], "an actor imported another package as the user's operators or cluster"
    assert shown["driver_imports"] == ["the user's operators", "the user's cluster"]
    assert [tuple(w) for w in shown["windows"]] == _expected_windows()


def test_the_wheel_holds_one_import_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"actorflow", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    for ring in ("operators", "actors", "cluster", "spark_bridge"):
        assert f"actorflow/{ring}/__init__.py" in names
    assert "actorflow/spark_bridge/log4j2.properties" in names
    assert not [n for n in names if n.startswith(("actorflow/examples", "actorflow/tests", "actorflow/benchmarks"))]


def test_the_console_command_and_module_run_from_the_wheel(fresh_python):
    for command in ([str(fresh_python.parent / "actorflow"), "--help"], [str(fresh_python), "-m", "actorflow", "--help"]):
        shown = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "checkpoints" in shown.stdout and "run" in shown.stdout


def test_a_wheel_install_runs_enrich_and_windows_beside_the_users_operators_and_cluster(fresh_python, tmp_path):
    shown = _run_job(fresh_python, tmp_path)
    assert shown["actorflow_from"].startswith(str(fresh_python.parent.parent)), shown["actorflow_from"]
    _check(shown)


def test_an_editable_install_runs_them_beside_the_users_operators_and_cluster(tmp_path):
    shown = _run_job(Path(sys.executable), tmp_path)
    assert shown["actorflow_from"] == str(ROOT / "actorflow" / "__init__.py")
    _check(shown)
