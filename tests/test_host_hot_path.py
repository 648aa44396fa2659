"""Shortcuts on the supervisor's hot path give what the plain version gives."""

from __future__ import annotations

import dataclasses

from steerable.actors._host.supervisor_work import _with_call
from steerable.protocol import Budgets, RunView, Transcript, Usage


def test_the_model_calls_view_is_the_machines_view_with_its_call() -> None:
    view = RunView(
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
    )
    call = object()
    copied = _with_call(view, call)  # type: ignore[arg-type]
    assert copied == dataclasses.replace(view, call=call)  # type: ignore[arg-type]
    assert copied.call is call
    assert view.call is None  # the machine's view is untouched
    for field in dataclasses.fields(RunView):
        if field.name != "call":
            assert getattr(copied, field.name) is getattr(view, field.name)
