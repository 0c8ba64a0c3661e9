"""A call's progress bar, driven by hand: tqdm's real bars (text and widget) on a manual clock.

The bar opens at the call's first phase, says which phase the call is in, counts its rate from
the call's start, and closes at 100 % as ``done``, or where the call stopped.
"""

from __future__ import annotations

import doctest
import functools
import io

import pytest
import tqdm
from tqdm.notebook import tqdm_notebook

from actorflow.cluster import progress as progress_module
from actorflow.cluster.progress import JobProgress, current_progress, reports_progress
from actorflow.operators.clock import ManualClock

START_MS = 1_700_000_000_000


def _text_bar(clock: ManualClock) -> tuple[JobProgress, io.StringIO]:
    out = io.StringIO()
    return JobProgress(clock=clock, bar=functools.partial(tqdm.tqdm, file=out, ncols=100, ascii=True)), out


def _lines(out: io.StringIO) -> list[str]:
    """Each state the text bar showed, in order."""
    return [line for line in out.getvalue().replace("\n", "\r").split("\r") if line]


def _a_32_s_call(progress: JobProgress, clock: ManualClock) -> None:
    """The call of the issue: 9 s of snapshot and deploy, then the run of 5,000 rows."""
    progress.name("clicks")
    clock.advance_by(50)
    progress.phase("snapshot")
    clock.advance_by(5_000)
    progress.set_total(5_000)
    progress.phase("deploy")
    clock.advance_by(3_950)
    progress.phase("run")
    clock.advance_by(10_000)
    progress.advance(2_000, "in flight 16, oldest 0.1s")


def test_the_bar_shows_each_phase_and_a_rate_from_the_calls_start_and_closes_at_100_percent():
    clock = ManualClock(START_MS)
    progress, out = _text_bar(clock)  # the call starts
    _a_32_s_call(progress, clock)
    clock.advance_by(13_000)
    progress.advance(5_000)
    progress.phase("collect")
    clock.advance_by(500)
    progress.phase("output")
    clock.advance_by(500)
    progress.close()

    assert progress.phases == [("snapshot", 50), ("deploy", 5_050), ("run", 9_000), ("collect", 32_000),
                               ("output", 32_500)]
    shown = _lines(out)
    phases = [line.split(":")[0] for line in shown]
    assert list(dict.fromkeys(phases)) == ["clicks · snapshot", "clicks · deploy", "clicks · run", "clicks · collect",
                                          "clicks · output", "clicks · done"]
    # 2,000 rows 19 s after the call started: 105 rows/s, not the run's 200 rows/s.
    assert any(line.endswith("| 2000/5000 [00:19<00:28, 105.26rec/s, in flight 16, oldest 0.1s]") for line in shown), shown
    # 5,000 rows in the caller's 33 s: 151.52 rows/s; what was in flight is over.
    assert shown[-1].endswith("| 5000/5000 [00:33<00:00, 151.52rec/s]") and shown[-1].startswith("clicks · done: 100%")
    assert out.getvalue().endswith("\n")  # closed, and left on screen
    assert progress.outcome == "done" and progress.bar.disable
    assert (progress.bar.n, progress.bar.total, progress.bar.start_t) == (5_000, 5_000, START_MS / 1000)


def test_a_bar_named_before_its_total_is_known_has_one_colon_after_its_description():
    # enrich() shows the snapshot phase before the job has its name, and before the row count.
    clock = ManualClock(START_MS)
    progress, out = _text_bar(clock)
    progress.phase("snapshot")
    progress.name("clicks")
    progress.set_total(10)
    progress.phase("run")
    shown = _lines(out)
    assert [line.split(" [")[0] for line in shown[:3]] == ["snapshot: 0rec", "snapshot: 0rec", "clicks · snapshot: 0rec"]
    assert not any(": :" in line for line in shown), shown


@pytest.mark.parametrize(
    "error, outcome",
    [
        (RuntimeError("an actor died"), "failed in run"),
        (KeyboardInterrupt(), "interrupted in run"),  # Ctrl-C, or a notebook's interrupt
    ],
)
def test_a_call_that_stops_leaves_the_bar_where_it_stopped(error, outcome):
    clock = ManualClock(START_MS)
    progress, out = _text_bar(clock)
    _a_32_s_call(progress, clock)
    progress.close(error)
    progress.phase("collect")  # too late: nothing moves a closed bar
    assert progress.outcome == outcome
    last = _lines(out)[-1]
    assert last.startswith(f"clicks · {outcome}:  40%|"), last
    assert last.endswith("| 2000/5000 [00:19<00:28, 105.26rec/s, in flight 16, oldest 0.1s]"), last
    assert out.getvalue().endswith("\n") and progress.bar.disable


def test_the_widget_ends_complete_and_green_or_red_where_it_stopped():
    # What a saved notebook keeps is the widget's last state: its bar, its style and its texts.
    clock = ManualClock(START_MS)
    done = JobProgress(clock=clock, bar=tqdm_notebook)
    _a_32_s_call(done, clock)
    clock.advance_by(13_000)
    done.advance(5_000)
    done.close()
    label, bar, numbers = done.bar.container.children
    assert (bar.value, bar.max, bar.bar_style) == (5_000, 5_000, "success")
    assert label.value == "clicks\u2007·\u2007done:\u2007100%"
    assert numbers.value == "\u20075000/5000\u2007[00:32&lt;00:00,\u2007156.25rec/s]"
    assert done.bar.container.layout.visibility != "hidden"

    failed = JobProgress(clock=clock, bar=tqdm_notebook)
    _a_32_s_call(failed, clock)
    failed.close(RuntimeError("an actor died"))
    label, bar, _ = failed.bar.container.children
    assert (bar.value, bar.max, bar.bar_style) == (2_000, 5_000, "danger")
    assert label.value.startswith("clicks\u2007·\u2007failed\u2007in\u2007run:")


def test_no_bar_without_progress_but_the_phases_are_kept():
    made: list[object] = []
    progress = JobProgress(False, clock=ManualClock(START_MS), bar=lambda **kwargs: made.append(kwargs))
    progress.phase("deploy")
    progress.set_total(10)
    progress.advance(10)
    progress.close()
    assert made == [] and progress.bar is None
    assert (progress.phases, progress.outcome) == ([("deploy", 0)], "done")


@reports_progress
def _outer(*, progress: bool = True) -> list[JobProgress]:
    return [current_progress(), *_inner(progress=progress)]


@reports_progress
def _inner(*, progress: bool = True) -> list[JobProgress]:
    current_progress().phase("run")
    return [current_progress()]


@reports_progress
def _fails(*, progress: bool = True) -> None:
    current_progress().phase("deploy")
    raise RuntimeError("no actor could start")


def test_a_call_inside_another_shares_its_bar_which_the_outer_call_closes():
    outer, inner = _outer(progress=False)
    assert outer is inner and outer.outcome == "done" and outer.phases[0][0] == "run"
    assert not current_progress().enabled and current_progress() is not outer  # nothing stays open

    with pytest.raises(RuntimeError, match="no actor could start"):
        _fails(progress=False)
    assert not current_progress().enabled


def test_a_call_counts_from_its_start_before_its_first_phase(monkeypatch):
    clock = ManualClock(START_MS)
    monkeypatch.setattr(progress_module, "SystemClock", lambda: clock)

    @reports_progress
    def call(*, progress: bool = True) -> JobProgress:
        clock.advance_by(2_000)  # what the call does before its first phase counts too
        current_progress().phase("run")
        return current_progress()

    made = call(progress=False)
    assert (made.started_ms, made.phases, made.outcome) == (START_MS, [("run", 2_000)], "done")


def test_the_module_example_runs():
    assert doctest.testmod(progress_module).failed == 0
