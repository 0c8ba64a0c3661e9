"""The progress bar of a call that runs a job: one bar, from the call's start to its end.

``enrich()``, ``to_spark()`` and ``execute()`` each show one bar (tqdm's: a widget in Jupyter,
text elsewhere). It opens at the call's first phase and says which phase the call is in:

- ``snapshot``: the Spark input is copied into Ray's object store, while the actors start;
- ``deploy``: the actors are started and connected (``recover``: again, after a restart);
- ``run``: the input records get their outcomes, which the bar counts;
- ``collect``: the output and the figures are gathered from the actors;
- ``output``: the output becomes a Spark DataFrame.

Its elapsed time and rate count from the call's start, so they are what the caller sees, and
not the run phase's alone (a 32 s call whose first 9 s went to the snapshot and the deploy
would show a rate 1.4 times too high). On success the bar ends at 100 % as ``<job> · done``
and stays: a notebook saved afterwards shows the end, not the last update before it. A call
that fails leaves it where it stopped, as ``<job> · failed in <phase>``.

>>> import io, functools, tqdm
>>> from actorflow.operators.clock import ManualClock
>>> clock, out = ManualClock(), io.StringIO()
>>> progress = JobProgress(clock=clock, bar=functools.partial(tqdm.tqdm, file=out, ncols=72, ascii=True))
>>> progress.name("clicks"); progress.phase("deploy"); progress.set_total(100)
>>> clock.advance_by(4_000); progress.phase("run"); progress.advance(100); progress.close()
>>> out.getvalue().rpartition("\\r")[2]
'clicks · done: 100%|#################| 100/100 [00:04<00:00, 25.00rec/s]\\n'

A call made inside another (``enrich()`` calls ``to_spark()``, which calls ``run_job()``) shares
the bar of the outermost: ``reports_progress`` opens and closes one per outermost call, and
``current_progress()`` is the bar of the call under way in this context.

Threading model: a bar belongs to the context (the thread) of its call; only that thread calls
its methods.

Lifecycle: made when the call starts (nothing shown) -> shown at the call's first phase ->
closed when the outermost call returns or raises.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any, Callable, ParamSpec, TypeVar

from tqdm.auto import tqdm

from actorflow.operators.clock import Clock, SystemClock

__all__ = ["JobProgress", "current_progress", "reports_progress"]

P = ParamSpec("P")
R = TypeVar("R")


class JobProgress:
    """One call's bar: its phases, and the input records done out of ``total``.

    ``phases`` holds ``(phase, ms since the call started)`` as each phase began, bar or no bar
    (``enabled=False``). ``bar`` makes the bar: tqdm's, a widget in Jupyter.
    """

    def __init__(self, enabled: bool = True, *, clock: Clock | None = None, bar: Callable[..., Any] = tqdm) -> None:
        self.enabled = enabled
        self._clock = clock or SystemClock()
        self.started_ms = self._clock.now_ms()
        self.job: str | None = None
        self.phases: list[tuple[str, int]] = []
        self.total: int | None = None
        self.outcome: str | None = None  # "done", "failed in <phase>" or "interrupted in <phase>", once closed
        self._make_bar = bar
        self.bar: Any = None

    def name(self, job: str) -> None:
        self.job = job
        self._describe()

    def phase(self, phase: str) -> None:
        """The call enters ``phase``; the first phase shows the bar."""
        if self.outcome is not None or (self.phases and self.phases[-1][0] == phase):
            return
        self.phases.append((phase, self._clock.now_ms() - self.started_ms))
        if self.bar is None and self.enabled:
            self._show()
        else:
            self._describe()

    def set_total(self, total: int) -> None:
        """The input's records, known once its snapshot is taken."""
        if total == self.total:
            return
        self.total = total
        if self.bar is not None:
            self.bar.reset(total=total)  # tqdm's way to a new total, on a widget too; it restarts the clock
            self._count_from_start()

    def advance(self, done: int, postfix: str = "") -> None:
        """``done`` input records have their outcome (fewer after a restart that replays some)."""
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(done - self.bar.n)

    def close(self, error: BaseException | None = None) -> None:
        """End the bar: ``done`` after a call that returned, else where the call stopped."""
        if self.outcome is not None:
            return
        where = self.phases[-1][0] if self.phases else "its start"
        if error is None:
            self.outcome = "done"
        elif isinstance(error, KeyboardInterrupt):
            self.outcome = f"interrupted in {where}"
        else:
            self.outcome = f"failed in {where}"
        if self.bar is None:
            return
        if error is None:
            self.bar.set_postfix_str("", refresh=False)  # what was in flight is over
        self._describe()
        # leave=True: the last state stays. A widget that closed with leave=False would hide,
        # and a notebook saved afterwards would show its last update instead of the end.
        self.bar.close()

    def _show(self) -> None:
        # smoothing=0: the rate is the records done over the elapsed time, not a recent average.
        self.bar = self._make_bar(total=self.total, desc=self._description(), unit="rec", smoothing=0, leave=True)
        self._count_from_start()

    def _count_from_start(self) -> None:
        # The bar reads the call's clock and counts from the call's start (tqdm's own clock
        # would start when the bar is made, or reset).
        self.bar._time = self._seconds
        self.bar.start_t = self.bar.last_print_t = self.started_ms / 1000
        self.bar.refresh()

    def _seconds(self) -> float:
        return self._clock.now_ms() / 1000

    def _description(self) -> str:
        state = self.outcome or (self.phases[-1][0] if self.phases else "")
        return " · ".join(part for part in (self.job, state) if part)

    def _describe(self) -> None:
        if self.bar is not None:  # tqdm adds the ": " (set_description would add a second one)
            self.bar.set_description_str(self._description(), refresh=True)


_current: contextvars.ContextVar[JobProgress | None] = contextvars.ContextVar("actorflow_job_progress", default=None)


def current_progress() -> JobProgress:
    """The bar of the call under way in this context; outside any, one that shows nothing."""
    progress = _current.get()
    return progress if progress is not None else JobProgress(enabled=False)


def reports_progress(call: Callable[P, R]) -> Callable[P, R]:
    """Give ``call`` (which takes ``progress: bool`` by keyword) one bar from its start to its
    end; the calls it makes, decorated too, share it."""
    default = inspect.signature(call).parameters["progress"].default

    @functools.wraps(call)
    def with_bar(*args: P.args, **kwargs: P.kwargs) -> R:
        if _current.get() is not None:
            return call(*args, **kwargs)
        progress = JobProgress(bool(kwargs.get("progress", default)))
        token = _current.set(progress)
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            progress.close(error)
            raise
        finally:
            _current.reset(token)
        progress.close()
        return result

    return with_bar
