"""The console filter drops Ray's "no Cluster ID" lines, from children's stderr and Ray's log echo, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actorflow.actors.upstream import ray as console

NOISE_LINE = (
    "[2026-11-27 17:08:50,035 I 27616 27672] gcs_client.cc:92: GcsClient has no Cluster ID set, "
    "and won't fetch from GCS."
)


def test_a_child_started_inside_writes_through_the_filter_and_this_process_gets_its_stderr_back(capfd):
    child = f"import sys; print({NOISE_LINE!r}, file=sys.stderr); print('a real problem', file=sys.stderr)"
    with console.stderr_of_children_filtered() as copier:
        process = subprocess.Popen([sys.executable, "-c", child])
    print("this process, after the block", file=sys.stderr, flush=True)
    assert process.wait(30) == 0
    assert copier is not None
    copier.join(10)
    assert not copier.is_alive(), "the copier ends when the last child holding the pipe ends"
    err = capfd.readouterr().err
    assert "a real problem" in err and "this process, after the block" in err
    assert "GcsClient" not in err


def test_a_child_that_outlives_the_block_keeps_its_filter():
    # The child writes after the block has ended: its lines still pass the filter, in order.
    child = (
        "import sys, time; time.sleep(0.5); "
        f"[print(l, file=sys.stderr, flush=True) for l in ('first', {NOISE_LINE!r}, 'second', 'no newline at the end')]"
    )
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    try:
        with console.stderr_of_children_filtered() as copier:
            process = subprocess.Popen([sys.executable, "-c", child])
    finally:
        os.dup2(saved, 2)
        os.close(write_end)
    process.wait(30)
    copier.join(10)
    with os.fdopen(read_end, "rb") as seen:
        assert seen.read().decode().splitlines() == ["first", "second", "no newline at the end"]


@pytest.fixture
def echo_handlers():
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    before = list(dispatcher.handlers)
    yield dispatcher
    dispatcher.handlers = before


def test_rays_log_echo_passes_every_line_but_the_noise_and_is_filtered_once(echo_handlers):
    batches: list[dict] = []
    echo_handlers.remove_handler("ray_print_logs")
    echo_handlers.add_handler("ray_print_logs", batches.append)

    console.filter_log_echo()
    console.filter_log_echo()
    echo_handlers.emit({"pid": 7, "is_err": True, "lines": ["one", f"(raylet) {NOISE_LINE}", "two"]})
    echo_handlers.emit({"pid": 8, "is_err": True, "lines": [NOISE_LINE]})

    assert batches == [{"pid": 7, "is_err": True, "lines": ["one", "two"]}]
    assert [name for name, _ in echo_handlers.handlers].count("ray_print_logs") == 1
