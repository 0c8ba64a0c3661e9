"""The versioned state format (operators/state.py): plain data, a version checked at restore,
checked-in checkpoints of formats 1, 2 and 3 that this release restores, and pre-rename pickles refused."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from actorflow.operators import OperatorHarness, Record, Watermark, WatermarkStatus
from actorflow.operators.errors import AsyncTimeoutError, StateFormatError
from actorflow.operators.state import RESTORED_VERSIONS, STATE_FORMAT_VERSION, is_plain, load_checkpoint
from actorflow.operators.windows import CountEvictor, TumblingEventTimeWindows, WindowOperator

from .fixtures.make_state_fixture import FIXTURE, FIXTURES, make_chain, run_until_the_snapshot
from .fixtures.pre_rename import PRE_RENAME, pre_rename_pickle
from .scripted import Scripted


LATEST = FIXTURES[STATE_FORMAT_VERSION]


def restored_fixture(fn: Scripted, fixture: Path = FIXTURE) -> OperatorHarness:
    h = OperatorHarness(make_chain(fn), start_ms=10_000)
    h.restore(fixture.read_bytes())
    h.open()
    return h


def test_the_format_1_fixture_restores_and_the_run_continues_exactly():
    fn = Scripted()
    h = restored_fixture(fn)
    # Replayed in order: the two in flight and the completed-but-unemitted one (its outcome was never seen).
    assert [v for v, _ in fn.calls] == [{"k": "a", "v": 3}, {"k": "b", "v": 4}, {"k": "a", "v": 7}]
    fn.fail({"k": "a", "v": 3}, RuntimeError("503"))  # its third attempt follows 100 ms on (FixedDelay(3, 100))
    h.set_processing_time(10_100)
    assert len(fn.calls) == 4 and fn.calls[-1][0] == {"k": "a", "v": 3}
    for value in ({"k": "a", "v": 3}, {"k": "b", "v": 4}, {"k": "a", "v": 7}):
        fn.complete(value)
    h.run_until_idle()
    h.process_watermark(200)
    # The sessions: "b" 20..70 (5) merges with 60 (4); "a" 10..90 (1, 2) merges with 75 (7) and 100 (3).
    assert h.output == [
        Record({"k": "b", "window_start": 20, "window_end": 110, "result": 9}, 109),
        Record({"k": "a", "window_start": 10, "window_end": 150, "result": 13}, 149),
        Watermark(200),
    ]


def test_the_fixture_keeps_the_attempt_count_and_the_deadline():
    fn = Scripted()
    h = restored_fixture(fn)
    fn.fail({"k": "a", "v": 3}, RuntimeError("503"))  # attempt 3, the last one, waits 100 ms
    h.set_processing_time(10_699)  # 700 ms were left at the snapshot
    with pytest.raises(AsyncTimeoutError, match=r"failed after 3 attempt\(s\)"):
        h.set_processing_time(10_700)


def _continue(fn: Scripted, h: OperatorHarness) -> list[object]:
    """What follows the version 2 fixture's snapshot: every request completes (the status leaves
    behind them), a record of "c" would open its closed session again, and the watermark ends the
    sessions. (The fixture holds the chain's state only: the task's valve starts afresh.)"""
    for value in ({"k": "a", "v": 3}, {"k": "b", "v": 4}, {"k": "a", "v": 7}):
        fn.complete(value)
    h.run_until_idle()
    h.process_element({"k": "c", "v": 1}, timestamp_ms=-30)
    fn.complete({"k": "c", "v": 1})
    h.run_until_idle()
    h.process_watermark(200)
    return h.output


@pytest.mark.parametrize("version", [2, 3])  # 3 changed the instance's part only
def test_the_fixtures_from_format_2_on_restore_their_queued_status_and_their_closed_session(version):
    fn = Scripted()
    h = restored_fixture(fn, FIXTURES[version])
    assert [v for v, _ in fn.calls] == [{"k": "a", "v": 3}, {"k": "b", "v": 4}, {"k": "a", "v": 7}]
    # The status leaves behind the three records it queued behind; the record of "c" at -30 meets
    # the session [-60, -10) emitted and cleaned up before the snapshot: late, not a second session.
    assert _continue(fn, h) == [
        WatermarkStatus(idle=True),
        Record({"k": "b", "window_start": 20, "window_end": 110, "result": 9}, 109),
        Record({"k": "a", "window_start": 10, "window_end": 150, "result": 13}, 149),
        Watermark(200),
    ]
    assert h.chain.operators[1].metrics.late_records_dropped == 1


def test_the_latest_fixture_is_what_the_fixture_script_makes_today():
    # A change of format that forgets to raise the version fails here, not in a user's restore.
    h = run_until_the_snapshot(Scripted(), STATE_FORMAT_VERSION)
    assert pickle.loads(LATEST.read_bytes()) == h.chain.snapshot_state()


def snapshots_of_every_kind() -> list[object]:
    h = OperatorHarness([
        WindowOperator("k", TumblingEventTimeWindows(100), reduce=lambda a, b: a, evictor=CountEvictor(2)),
    ])
    for ts in (1, 2, 3):
        h.process_element({"k": "a", "v": ts}, timestamp_ms=ts)
    return [*pickle.loads(LATEST.read_bytes()), *h.chain.snapshot_state()]


@pytest.mark.parametrize("index", range(3))
def test_every_snapshot_is_plain_data_with_the_version(index):
    state = snapshots_of_every_kind()[index]
    assert is_plain(state) is None
    assert state["version"] == STATE_FORMAT_VERSION


def test_the_walk_finds_a_class_of_ours():
    assert is_plain({"contents": [("a", Record(1, 2))]}) == "state['contents'][0][1]: Record"


@pytest.mark.parametrize("index, kind", [(0, "async_wait"), (1, "window")])
def test_another_version_is_refused_naming_both_versions(index, kind):
    chain = pickle.loads(FIXTURE.read_bytes())
    chain[index] = {**chain[index], "version": 4}
    h = OperatorHarness(make_chain(Scripted()))
    h.restore(pickle.dumps(chain))
    with pytest.raises(StateFormatError) as info:
        h.open()
    assert str(info.value) == (
        f"{kind} operator state has format version 4, but this actorflow restores state format versions 1, 2 and 3 only"
    )


def test_an_unversioned_window_state_the_pickle_of_earlier_releases_is_refused():
    chain = pickle.loads(FIXTURE.read_bytes())
    chain[1] = pickle.dumps({"contents": {}})
    h = OperatorHarness(make_chain(Scripted()))
    h.restore(pickle.dumps(chain))
    with pytest.raises(StateFormatError, match=r"^window operator state has no format version \(a bytes"):
        h.open()


def test_a_pre_rename_checkpoint_is_refused_in_one_line_without_importing_a_users_operators(tmp_path, monkeypatch):
    # A user's own package named `operators`, first on the path, as Ray puts the driver's directory.
    user = tmp_path / "operators"
    (user / "windows").mkdir(parents=True)
    (user / "__init__.py").write_text("raise AssertionError('the user package was imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = pre_rename_pickle()
    with pytest.raises(StateFormatError) as info:
        load_checkpoint(data)
    assert str(info.value) == f"checkpoint {PRE_RENAME}"
    assert "\n" not in str(info.value)
    assert "operators" not in sys.modules
    # Without the check, unpickling would import the user's package: the refusal is what spares it.
    with pytest.raises(AssertionError, match="the user package was imported"):
        pickle.loads(data)
    sys.modules.pop("operators", None)


@pytest.mark.parametrize("version", RESTORED_VERSIONS)
def test_a_checkpoint_of_each_restored_version_loads(version):
    fixture = FIXTURES[version]
    assert load_checkpoint(fixture.read_bytes()) == pickle.loads(fixture.read_bytes())
    assert {state["version"] for state in pickle.loads(fixture.read_bytes())} == {version}


def test_each_restored_version_has_its_fixture_checked_in_next_to_its_script():
    assert sorted(FIXTURES) == list(RESTORED_VERSIONS) and STATE_FORMAT_VERSION == max(RESTORED_VERSIONS)
    for version, fixture in FIXTURES.items():
        assert fixture == Path(__file__).parent / "fixtures" / f"state_v{version}.pickle" and fixture.stat().st_size > 0


def test_the_state_modules_examples_hold():
    import doctest

    import actorflow.operators.state as state

    result = doctest.testmod(state, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
