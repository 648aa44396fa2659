"""Shortcuts on the supervisor's hot path give what the plain version gives."""

from __future__ import annotations

import dataclasses

from steerable.actors._host.supervisor_work import _with_call
from steerable.protocol import Budgets, RunView, Transcript, Usage


def _view(**extra: object) -> RunView:
    return RunView(
        run_id="run_a",
        task="task",
        transcript=Transcript([]),
        delivered=(),
        usage=Usage(input_tokens=3),
        model_calls=2,
        steps=1,
        budgets=Budgets(steps_left=5, model_calls_left=4),
        depth=1,
        parent_run_id="run_p",
        session_id="s",
        task_id="t",
        subagents=("helper",),
        **extra,  # type: ignore[arg-type]
    )


def test_the_model_calls_view_is_the_machines_view_with_its_call() -> None:
    view = _view()
    plain = dataclasses.replace(view)
    call = object()
    given = _with_call(view, call)  # type: ignore[arg-type]
    assert given.call is call
    assert given == dataclasses.replace(plain, call=call)
    for field in dataclasses.fields(RunView):
        if field.name != "call":
            assert getattr(given, field.name) is getattr(plain, field.name)


def test_a_view_that_has_a_call_is_copied_and_left_as_it_was() -> None:
    first, second = object(), object()
    view = _view(call=first)
    copied = _with_call(view, second)  # type: ignore[arg-type]
    assert copied is not view
    assert view.call is first
    assert copied.call is second
    assert copied == dataclasses.replace(view, call=second)
    for field in dataclasses.fields(RunView):
        if field.name != "call":
            assert getattr(copied, field.name) is getattr(view, field.name)
