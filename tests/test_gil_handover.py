"""A run's outcome is handed to the host that waits for it before the run's teardown
(actors/_engine/gil.py; docs/performance.md, "Wave 4: session 16").

The thread that settles a run hands the GIL over once, right after the outcome is set, when a
host waits for it (`result()`, `await wait()`), and never when nobody does: a run that ends
unwatched must not cost a context switch.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pytest

from steerable.actors import Runtime
from steerable.actors._host import cell as cell_module
from steerable.actors._host.handle import RunHandle
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import Finish, RunEvent, RunState

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import until
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import until

WAIT = 10.0


class _Recorder:
    """Stands in for `hand_over`: records, per call, whether the outcome was already set."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.handles: list[RunHandle] = []

    def __call__(self) -> None:
        self.calls.append(all(h._cell.future.done() for h in self.handles))


class Gated:
    """Finishes once `release` is set: the test decides when the run may end."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def decide(self, view: object) -> Finish:
        assert self.release.wait(WAIT)
        return Finish(output="done")


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    monkeypatch.setattr(cell_module, "hand_over", rec)
    return rec


def test_a_host_blocked_in_result_before_the_end_is_handed_the_gil(recorder: _Recorder) -> None:
    release = threading.Event()

    with Runtime() as rt:
        handle = rt.start("t", agent=Gated(release))
        recorder.handles.append(handle)
        outcome: list[RunState] = []
        waiter = threading.Thread(target=lambda: outcome.append(handle.result(WAIT).state))
        waiter.start()
        # The waiter marks the run as awaited before it blocks; only then may the run end.
        until(lambda: handle._cell.awaited, "the waiter to wait")
        release.set()
        waiter.join(WAIT)
        assert outcome == [RunState.FINISHED]
    assert recorder.calls == [True]


def test_an_async_host_awaiting_the_outcome_is_handed_the_gil(recorder: _Recorder) -> None:
    release = threading.Event()

    async def main() -> RunState:
        async with Runtime() as rt:
            handle = await rt.astart("t", agent=Gated(release))
            recorder.handles.append(handle)
            waiting = asyncio.ensure_future(handle.wait())
            await asyncio.sleep(0)  # the task runs up to its await: the run is awaited now
            assert handle._cell.awaited
            release.set()
            return (await asyncio.wait_for(waiting, WAIT)).state

    assert asyncio.run(main()) is RunState.FINISHED
    assert recorder.calls == [True]


def test_a_run_nobody_waits_for_ends_without_a_hand_over(recorder: _Recorder) -> None:
    finished = threading.Event()

    def on_finish(event: RunEvent) -> None:
        finished.set()

    with Runtime() as rt:
        handle = rt.start(
            "t", agent=ScriptedAgent([Finish(output="done")]), hooks={"on_finish": on_finish}
        )
        # The hook runs after the outcome is published: by then a hand-over would have been.
        assert finished.wait(WAIT)
        assert handle._cell.future.done()
        assert not handle._cell.awaited
    assert recorder.calls == []
