"""`Runtime.tune_gc()`: opt-in (steerable never touches the collector itself), and what it
sets stays set: a runtime's start and shutdown neither apply it nor undo it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from steerable.actors import Runtime
from steerable.actors._engine.gcpolicy import TUNED_THRESHOLD
from steerable.protocol import Finish, RunState, RunView


class _Done:
    def decide(self, view: RunView) -> Finish:
        return Finish(output="done")


def _one_run() -> None:
    with Runtime() as rt:
        assert rt.start("t", agent=_Done()).result(timeout=30).state is RunState.FINISHED


@pytest.fixture
def gc_state() -> Iterator[tuple[int, int, int]]:
    """The process's collector settings, put back after the test whatever it did."""
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    try:
        yield before
    finally:
        gc.set_threshold(*before)
        if frozen == 0:
            gc.unfreeze()


def test_a_runtime_leaves_the_collector_alone(gc_state: tuple[int, int, int]) -> None:
    frozen = gc.get_freeze_count()
    _one_run()
    assert gc.get_threshold() == gc_state
    # Never more frozen (a freeze by the runtime would add what it made); a frozen object
    # may be freed meanwhile (e.g. an earlier run's weak reference in the closed-log queue).
    assert gc.get_freeze_count() <= frozen


def test_tune_gc_sets_the_policy_and_a_runtime_keeps_it(gc_state: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 10, 10)
    assert Runtime.tune_gc() == (700, 10, 10)
    assert gc.get_threshold() == TUNED_THRESHOLD
    assert gc.get_freeze_count() > 0
    frozen = gc.get_freeze_count()
    _one_run()
    assert gc.get_threshold() == TUNED_THRESHOLD
    assert 0 < gc.get_freeze_count() <= frozen  # neither unfrozen nor frozen again


def test_tune_gc_without_freezing_only_sets_thresholds(gc_state: tuple[int, int, int]) -> None:
    frozen = gc.get_freeze_count()
    assert Runtime.tune_gc((5000, 15, 15), freeze=False) == gc_state
    assert gc.get_threshold() == (5000, 15, 15)
    assert gc.get_freeze_count() == frozen
