"""What a finished run keeps for the cyclic collector to walk (docs/performance.md, "Wave 4:
GC-tracked objects, session 6"): the `MemoryStore` keeps revisions and an ended run's
transcript as bytes, a closed event log its nested data as bytes; what readers get is equal."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from steerable.actors import MemoryStore, Runtime, SqliteStore, tool
from steerable.actors._host.events import EventLog
from steerable.actors._machine.preview import NO_ARGUMENTS
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import (
    AgentError,
    EventKind,
    Finish,
    Phase,
    Plan,
    RunState,
    ToolCall,
    ToolResult,
    TranscriptEntry,
)

WAIT = 10.0


@tool(side_effect="none")
def echo(text: str) -> str:
    return text.upper()


@tool(side_effect="none")
def secret() -> SecretStr:
    return SecretStr("hunter2")


class _Recording(MemoryStore):
    """Keeps the entries each checkpoint hands over, as the machine made them."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[TranscriptEntry] = []

    def write_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: Sequence[TranscriptEntry],
        on_stored: Callable[[], None] | None = None,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        del self.written[entries_from:]
        self.written.extend(entries)
        super().write_checkpoint(
            run_id, revision, snapshot, entries_from, entries, on_stored, on_failed=on_failed
        )


def _plan(*calls: ToolCall) -> Plan:
    return Plan(steps=calls)


def test_an_ended_runs_revisions_and_transcript_are_kept_untracked_and_load_equal() -> None:
    store = _Recording()
    agent = ScriptedAgent(
        [
            _plan(ToolCall(name="echo", arguments={"text": "a"})),
            _plan(ToolCall(name="echo", arguments={"text": "b"})),
            Finish(output="done"),
        ]
    )
    with Runtime(tools=[echo], store=store) as rt:
        handle = rt.start("task", agent=agent)
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        run_id = handle.run_id
        loaded = store.load(run_id)
        assert list(loaded.transcript) == store.written
        assert loaded.transcript[0] == store.written[0]
        revisions = store.revisions(run_id)
        for info in revisions:  # an earlier revision loads as it was written
            assert store.load(run_id, info.revision).snapshot.state is info.state
    # The transcript is encoded once the run's supervisor has stopped (`compact`, after the
    # outcome is published): the runtime's shutdown waits for that.
    gc.collect()
    kept = store._runs[run_id]
    assert not any(gc.is_tracked(r) for r in kept.revisions)
    assert all(type(e) is bytes for e in kept.entries)
    assert list(store.load(run_id).transcript) == store.written


def test_an_entry_holding_a_secret_is_kept_as_an_object() -> None:
    store = MemoryStore()
    agent = ScriptedAgent([_plan(ToolCall(name="secret")), Finish(output="done")])
    with Runtime(tools=[secret], store=store) as rt:
        handle = rt.start("task", agent=agent)
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        transcript = store.load(handle.run_id).transcript
        results = [e for e in transcript if isinstance(e, ToolResult)]
        assert len(results) == 1
        assert results[0].ok
    assert not isinstance(store._runs[handle.run_id].entries[1], bytes)  # compacted, kept


def _close_another() -> None:
    other = EventLog("o" * 32)
    other.close()  # compacts the logs closed before it that are still held


def test_a_held_closed_log_is_compacted_by_the_next_close_and_reads_the_same() -> None:
    log = EventLog("t" * 32)
    nested = {"steps": [{"tool": "echo", "arguments": {"text": "a"}}], "n": 1}
    flat = {"tool": "echo", "value": "A"}
    empty = {"call_id": "c1", "arguments": NO_ARGUMENTS}
    for data in (nested, flat, empty):
        log.append("run_1", EventKind.CUSTOM, Phase.EXECUTE, 1.0, data)
    before = [raw[4] for raw in log._records(0)]
    log.close()
    assert [raw[4] for raw in log._records(0)] == before  # closed, not yet compacted
    _close_another()
    gc.collect()
    assert not any(gc.is_tracked(slot) for slot in log._cols)
    after = [raw[4] for raw in log._records(0)]
    assert after == before
    assert after[2]["arguments"] is NO_ARGUMENTS  # still the shared, unchangeable mapping
    assert [e.data for e in log.stream()] == before


def _echo_agent() -> ScriptedAgent:
    return ScriptedAgent([Plan(steps=[ToolCall(name="echo", arguments={"text": "a"})]), Finish()])


def _counting_packs(monkeypatch: Any) -> list[int]:
    from steerable.actors._host import events

    packed: list[int] = []
    real = events._pack_history

    def counting(cols: Any, tail: int = 0) -> bytes | None:
        packed.append(len(cols))
        return real(cols, tail)

    monkeypatch.setattr(events, "_pack_history", counting)
    return packed


def test_a_log_nobody_keeps_when_its_run_ends_is_never_packed(
    monkeypatch: Any, tmp_path: Path
) -> None:
    # A store that copies the events (SqliteStore) holds no log: a handle dropped as its run
    # ends (W1's are) frees the log, and packing its history would be CPU spent for nothing
    # (issue 14's budget for rich events).
    packed = _counting_packs(monkeypatch)
    with Runtime(tools=[echo], store=SqliteStore(tmp_path / "runs.db")) as rt:
        for _ in range(3):
            outcome = rt.start("task", agent=_echo_agent()).result(timeout=WAIT)
            assert outcome.state is RunState.FINISHED
        assert packed == []
        held = rt.start("task", agent=_echo_agent())
        assert held.result(timeout=WAIT).state is RunState.FINISHED
        assert rt.start("task", agent=_echo_agent()).result(timeout=WAIT).state is RunState.FINISHED
    # The next run's log closes as that run settles, after its outcome is out (the host may
    # read it first): once the runtime is shut down every run has settled.
    assert len(packed) == 1  # the held one, when the next run ended
    kinds = [e.kind for e in held.events()]
    assert kinds[-1] is EventKind.RUN_ENDED
    assert EventKind.TOOL_STARTED in kinds


def test_the_memory_store_keeps_an_ended_runs_log_and_it_is_compacted_once(
    monkeypatch: Any,
) -> None:
    # The MemoryStore keeps a finished run's events as its log holds them (no copy); that
    # log packs the data the collector would walk once, as its run hands it over (inside the
    # run's own time): no data dict of it is left for full collections to walk.
    packed = _counting_packs(monkeypatch)
    store = MemoryStore()
    with Runtime(tools=[echo], store=store) as rt:
        first = rt.start("task", agent=_echo_agent())
        assert first.result(timeout=WAIT).state is RunState.FINISHED
        live = [(e.seq, e.kind, e.data) for e in first.events()]
        run_id = first.run_id
        del first
        assert rt.start("task", agent=_echo_agent()).result(timeout=WAIT).state is RunState.FINISHED
    assert len(packed) == 2  # each log as its run handed it over
    assert [(e.seq, e.kind, e.data) for e in store.events(run_id)] == live
    assert len(packed) == 2  # read as compacted: nothing packed again
    (segment,) = store._events[run_id]._segments
    assert not isinstance(segment[1], bytes)  # the log's own history, not a copy
    gc.collect()
    history = segment[1]._log  # type: ignore[attr-defined]
    assert not any(gc.is_tracked(slot) for slot in history._cols)


def test_a_compacted_log_with_a_dict_msgpack_cannot_carry_packs_the_others() -> None:
    # The whole history is packed in one array; one value msgpack refuses must cost only its
    # own dict (kept as appended), never the others' packing or anyone's data.
    log = EventLog("t" * 32, max_history=3)
    odd: dict[str, Any] = {"thing": [object()]}
    datas: list[dict[str, Any]] = [{"steps": [i]} for i in range(3)] + [odd, {"steps": [9]}]
    for data in datas:
        log.append("run_1", EventKind.CUSTOM, Phase.EXECUTE, 1.0, data)
    log.close()
    _close_another()
    after = [raw[4] for raw in log._records(0)]
    assert after[0] == {"steps": [2]}
    assert after[2] == {"steps": [9]}
    assert after[1] is odd
    assert [type(slot) for slot in list(log._cols)[5::6]] == [bytes, dict, bytes]
