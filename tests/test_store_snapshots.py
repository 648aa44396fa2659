"""Snapshots stored as a static part once per run and a trimmed per-revision part (W4 bytes).

Both stores keep per revision only what `dynamic_part` leaves (no static field, no field at its
default, no metric that repeats a top-level counter); loading restores the exact snapshot.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import CheckpointStore, MemoryStore, SqliteStore
from steerable.actors._stores.store import STATIC_KEYS, dynamic_part
from steerable.protocol import (
    AgentError,
    CallStatus,
    CapabilitySnapshot,
    ErrorCode,
    PlannedCall,
    RunConfig,
    RunMetrics,
    RunSnapshot,
    RunState,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._stored import (
    TEMPLATE_KEYS,
    SnapshotBody,
    body_template,
    snapshot_body,
    templated_body,
)


def _bare() -> dict[str, Any]:
    return RunSnapshot(
        run_id="r",
        revision=0,
        trace_id="ab" * 16,
        task="t",
        agent="a",
        state=RunState.RUNNING,
        config=RunConfig(max_steps=9),
        capabilities=CapabilitySnapshot(tools={"t": "1:none:x"}),
    ).model_dump(mode="json")


def _full() -> dict[str, Any]:
    return RunSnapshot(
        run_id="r",
        revision=0,
        trace_id="ab" * 16,
        session_id="s",
        task_id="k",
        parent_run_id="p",
        depth=2,
        task="t",
        agent="a",
        state=RunState.WAITING,
        waiting_for=WaitingFor.APPROVAL,
        config=RunConfig(max_steps=9),
        capabilities=CapabilitySnapshot(tools={"t": "1:none:x"}),
        model_calls=4,
        model_retries=1,
        steps=3,
        usage=Usage(input_tokens=10, output_tokens=5),
        decisions=4,
        transcript_len=0,
        last_seq=2,
        delivered_seq=1,
        pending_messages=(UserMessage(seq=2, content="hi", at=1.0),),
        plan=(
            PlannedCall(
                call_id="c4.0",
                kind="tool",
                name="t",
                idempotency_key="idem_1",
                status=CallStatus.AWAITING_APPROVAL,
            ),
        ),
        errors=(AgentError.of(ErrorCode.PROVIDER_ERROR, "boom"),),
        output={"x": [1, 2]},
        metrics=RunMetrics(
            steps=3,
            model_calls=4,
            input_tokens=10,
            output_tokens=5,
            retries=1,
            checkpoints=7,
            duration_seconds=1.5,
            phase_seconds={"reason": 0.5},
        ),
        deadline_left=-0.25,
        created_at=1.0,
        updated_at=2.0,
    ).model_dump(mode="json")


def test_the_per_revision_part_leaves_out_static_default_and_derived_fields() -> None:
    body = _bare()
    before = dict(body)
    part = dynamic_part(body)
    assert body == before  # the caller's dict is left as it is
    assert not part.keys() & set(STATIC_KEYS)
    assert set(part) == {
        "revision",
        "state",
        "model_calls",
        "model_retries",
        "steps",
        "usage",
        "decisions",
        "transcript_len",
        "metrics",
        "updated_at",
    }
    assert part["metrics"] == {}
    full = dynamic_part(_full())
    assert full["metrics"] == {
        "retries": 1,
        "checkpoints": 7,
        "duration_seconds": 1.5,
        "phase_seconds": {"reason": 0.5},
    }
    assert full["deadline_left"] == -0.25
    assert full["waiting_for"] == "approval"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    made: CheckpointStore = (
        MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "runs.db")
    )
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("shape", ["bare", "full"])
def test_a_loaded_snapshot_is_the_one_written(store: CheckpointStore, shape: str) -> None:
    first = _bare() if shape == "bare" else _full()
    second = {**first, "revision": 1, "updated_at": 3.0, "plan": [], "output": None}
    store.write_checkpoint("r", 0, first, 0, [])
    store.write_checkpoint("r", 1, second, 0, [])
    assert store.load("r", 0).snapshot == RunSnapshot.model_validate(first)
    assert store.load("r").snapshot == RunSnapshot.model_validate(second)


@pytest.mark.parametrize("shape", ["bare", "full"])
def test_a_built_body_is_the_full_snapshot_and_carries_its_part(shape: str) -> None:
    body = _bare() if shape == "bare" else _full()
    static = {key: body[key] for key in STATIC_KEYS}
    built = snapshot_body(static, dynamic_part(body), body["metrics"])
    assert built == body  # every field, defaults included
    assert built.dynamic == dynamic_part(dict(built))
    assert dynamic_part(built) is built.dynamic  # the stores take it as it is
    assert RunSnapshot.model_validate(built) == RunSnapshot.model_validate(body)


@pytest.mark.parametrize("shape", ["bare", "full"])
def test_a_templated_body_is_the_built_body(shape: str) -> None:
    body = _bare() if shape == "bare" else _full()
    static = {key: body[key] for key in STATIC_KEYS}
    part = dynamic_part(body)
    # The run machine's order: the template's keys first, then whatever is not at a default.
    ordered = {key: part[key] for key in TEMPLATE_KEYS}
    ordered.update({key: value for key, value in part.items() if key not in ordered})
    template = body_template(static)
    expected = snapshot_body(static, dict(ordered), body["metrics"])
    built = templated_body(template, ordered, body["metrics"])
    again = templated_body(template, dict(ordered), body["metrics"])
    assert type(built) is SnapshotBody
    assert list(built.items()) == list(expected.items())  # same fields, same key order
    assert built.dynamic is ordered
    assert dynamic_part(dict(built)) == ordered
    for key in ("pending_messages", "plan", "errors"):
        if key in ordered:
            continue  # the part's own list
        assert built[key] == []
        assert built[key] is not again[key]  # each body's default lists are its own
        assert built[key] is not template[key]


def test_changing_a_built_body_keeps_its_part_true() -> None:
    body = _full()
    static = {key: body[key] for key in STATIC_KEYS}
    built = snapshot_body(static, dynamic_part(body), body["metrics"])
    built["updated_at"] = 9.0  # the host's stamp: kept in step
    assert built.dynamic is not None
    assert built.dynamic["updated_at"] == 9.0
    assert dynamic_part(built) == dynamic_part(dict(built))
    changes: list[Callable[[SnapshotBody], object]] = [
        lambda b: b.__setitem__("plan", []),  # now at its default: left out
        lambda b: b.__setitem__("agent", "other"),  # static
        lambda b: b.__setitem__("metrics", {}),  # trimmed by rule
        lambda b: b.update(output=None),
        lambda b: b.pop("deadline_left"),
        lambda b: b.setdefault("extra", 1),
        lambda b: b.__delitem__("errors"),
        lambda b: b.__ior__({"last_seq": -1}),
        lambda b: b.popitem(),
        lambda b: b.clear(),
    ]
    for change in changes:
        again = snapshot_body(static, dynamic_part(body), body["metrics"])
        change(again)
        assert again.dynamic is None
        assert dynamic_part(again) == dynamic_part(dict(again))


def test_a_built_body_pickles_and_copies_as_a_plain_dict() -> None:
    body = _full()
    built = snapshot_body(
        {key: body[key] for key in STATIC_KEYS}, dynamic_part(body), body["metrics"]
    )
    for copied in (pickle.loads(pickle.dumps(built)), copy.deepcopy(built), copy.copy(built)):
        assert type(copied) is dict
        assert copied == body
