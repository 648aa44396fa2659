"""Fuzzing the inbox from the host side (reliability suite, item 3, host inbox).

Hypothesis draws what agents do (tool plans, writes that need approval, calls that block until
cancelled, questions to the user, finishing) and sequences of host actions (`send` with random
content and modes, invalid mode strings included; `approve`/`deny` of pending and of random
call ids; `cancel`; `pending_approvals`), played against live runs from several threads at
once. Whatever happens:

- the only exceptions that reach the host are `SteerableError` with code `run_ended` (the run
  is terminal) and `ValueError` for a mode that is neither "queue" nor "interrupt";
- nothing hangs: every run answers a last message or ends, and ends when cancelled;
- the user messages in the run's transcript are exactly the accepted ones, in seq order, each
  once: all of them when the run was still live to take the last one, otherwise a prefix
  (a run that ended has not delivered what came after its last boundary: docs/steering.md);
- each agent saw each delivered message in exactly one `view.delivered`, in the same order;
- an approved call ran at most once, and only if some `approve` returned True for it; a
  call whose `deny` returned True has an `approval_denied` result.

Set STEERABLE_FUZZ_EXAMPLES to run more examples (default 100; a quarter of that on SQLite).
`pytest -s` prints the totals (actions played, messages accepted and checked, ...).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steerable.actors import MemoryStore, RunHandle, Runtime, SqliteStore, ToolContext, tool
from steerable.actors.testing import Gate, call, plan, wait_state
from steerable.protocol import (
    AskUser,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    RunConfig,
    RunState,
    RunView,
    SteerableError,
    ToolResult,
    UserMessage,
)

T = TypeVar("T")
WAIT = 30.0  # generous fail-instead-of-hang bound
EXAMPLES = int(os.environ.get("STEERABLE_FUZZ_EXAMPLES", "100"))
VALID_MODES = (None, "queue", "interrupt")
INVALID_MODES = ("bogus", "", "QUEUE", " queue", "interrupt\x00")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TOTALS: Counter[str] = Counter()  # figures for docs/reliability.md, printed by `pytest -s`


@pytest.fixture(scope="module", autouse=True)
def print_totals() -> Iterator[None]:
    yield
    if TOTALS:
        print("\nhost fuzz totals:", dict(sorted(TOTALS.items())))


# ------------------------------------------------------------------ the runs' side


class SteeredAgent:
    """Follows a drawn script of decisions, then asks the user forever (the run waits)."""

    def __init__(self, script: list[str], name: str) -> None:
        self.name = name
        self._script = list(script)
        self._lock = threading.Lock()
        self.delivered: list[int] = []  # seqs of view.delivered, in decide order
        self.by_call: dict[int, list[int]] = {}  # model call number -> its view.delivered
        self.calls = 0

    def decide(self, view: RunView) -> Any:
        with self._lock:
            self.calls += 1
            self.delivered.extend(m.seq for m in view.delivered)
            self.by_call[view.model_calls + 1] = [m.seq for m in view.delivered]
            step = self._script.pop(0) if self._script else "ask"
        if step == "echo":
            return plan(call("echo", text="e"), call("echo", text="f"))
        if step == "write":
            return plan(call("guarded", text="w"), call("echo", text="e"))
        if step == "two_writes":
            return plan(call("guarded", text="a"), call("guarded", text="b"))
        if step == "block":
            return plan(call("block"), call("echo", text="e"))
        if step == "finish":
            return Finish(output="done")
        return AskUser(question="anything else?")


@dataclass
class World:
    """The tools of one example and what they saw."""

    gate: Gate = field(default_factory=Gate)  # cooperative: cancel or release ends a call
    executed: list[tuple[str, str]] = field(default_factory=list)  # guarded calls that ran
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tools(self) -> list[Any]:
        world = self

        @tool
        def echo(text: str) -> str:
            return text

        @tool(side_effect="write", requires_approval=True)
        def guarded(text: str, ctx: ToolContext) -> str:
            with world.lock:
                world.executed.append((ctx.run_id, ctx.call_id))
            return text

        return [echo, guarded, self.gate.tool("block")]


# ------------------------------------------------------------------ the host's side


@dataclass
class HostLog:
    """What the host threads did and were told, per run."""

    accepted: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # (seq, content)
    approved: dict[int, set[str]] = field(default_factory=dict)  # approve returned True
    denied: dict[int, set[str]] = field(default_factory=dict)  # deny returned True
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def unexpect(self, what: str) -> None:
        with self.lock:
            self.unexpected.append(what)

    def count(self, what: str) -> None:
        with self.lock:
            TOTALS[what] += 1

    def note(self, table: dict[int, Any], run: int, item: Any) -> None:
        with self.lock:
            bucket = table.setdefault(run, [] if table is self.accepted else set())
            if isinstance(bucket, list):
                bucket.append(item)
            else:
                bucket.add(item)


PENDING_ID = st.tuples(st.just("pending"), st.integers(0, 3))  # the n-th pending approval
CALL_ID = st.one_of(
    PENDING_ID,
    PENDING_ID,
    st.tuples(st.just("random"), st.text(max_size=12)),  # an id nobody issued
)
SEND = st.tuples(
    st.just("send"),
    st.text(max_size=24),
    st.sampled_from(VALID_MODES + VALID_MODES + INVALID_MODES),
)
ACTION = st.one_of(  # sends weighted up: they are what the transcript check is about
    SEND,
    SEND,
    SEND,
    st.tuples(st.just("approve"), CALL_ID),
    st.tuples(st.just("approve"), CALL_ID),
    st.tuples(st.just("deny"), CALL_ID, st.text(max_size=8)),
    st.tuples(st.just("deny"), CALL_ID, st.text(max_size=8)),
    st.tuples(st.just("cancel"), st.text(max_size=8)),
    st.tuples(st.just("pending")),
    st.tuples(st.just("pause")),
    st.tuples(st.just("decide"), st.booleans(), PENDING_ID),  # pause, then approve or deny
)
STEP = st.sampled_from(["echo", "write", "two_writes", "block", "ask", "finish"])


def pick_call_id(handle: RunHandle, choice: tuple[str, Any]) -> str:
    if choice[0] == "pending":
        pending = handle.pending_approvals()
        return pending[choice[1] % len(pending)].call_id if pending else "c-none"
    return str(choice[1])


def wait_quiet(handle: RunHandle) -> None:
    """Block until the run waits for a person, is blocked in `block`, or has ended.

    Lets later actions meet the run in every stage (approvals pending, waiting for the user)
    instead of all landing before its first decision. Synchronised on its events, no sleeps;
    the per-event timeout turns a run that never settles into a failure, not a hang.
    """
    blocked: set[str] = set()
    for event in handle.events(timeout=WAIT):
        if event.data.get("tool") == "block":
            if event.kind is EventKind.TOOL_STARTED:
                blocked.add(event.data["call_id"])
            elif event.kind is EventKind.TOOL_FINISHED:
                blocked.discard(event.data["call_id"])
        if handle.state is RunState.WAITING or handle.state.is_terminal or blocked:
            return
    assert handle.state.is_terminal, f"event stream ended in {handle.state.value}"


def _send(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    _, content, mode = action
    seq = handle.send(content, mode=mode)
    assert mode in VALID_MODES, f"send accepted the invalid mode {mode!r}"
    log.note(log.accepted, run, (seq, content))


def _settle_call(handle: RunHandle, run: int, call_id: str, approve: bool, log: HostLog) -> None:
    if approve and handle.approve(call_id):
        log.note(log.approved, run, call_id)
    elif not approve and handle.deny(call_id, reason="fuzz"):
        log.note(log.denied, run, call_id)


def _approve(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    _settle_call(handle, run, pick_call_id(handle, action[1]), True, log)


def _deny(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    _settle_call(handle, run, pick_call_id(handle, action[1]), False, log)


def _decide(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    wait_quiet(handle)
    _settle_call(handle, run, pick_call_id(handle, action[2]), action[1], log)


def _cancel(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    log.count("cancel_took_effect" if handle.cancel(action[1]) else "cancel_no_op")


def _pause(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    wait_quiet(handle)
    log.count("paused")


def _pending(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    for request in handle.pending_approvals():
        assert request.run_id == handle.run_id


ACTS = {
    "send": _send,
    "approve": _approve,
    "deny": _deny,
    "decide": _decide,
    "cancel": _cancel,
    "pause": _pause,
    "pending": _pending,
}


def act(handle: RunHandle, run: int, action: tuple[Any, ...], log: HostLog) -> None:
    """Play one host action; record what was accepted; allow only the documented errors."""
    kind = action[0]
    try:
        ACTS[kind](handle, run, action, log)
    except SteerableError as exc:
        log.count("refused_run_ended")
        if exc.error.code is not ErrorCode.RUN_ENDED or not handle.state.is_terminal:
            log.unexpect(f"{kind}: {exc!r} in state {handle.state.value}")
    except ValueError as exc:
        log.count("refused_bad_mode")
        if not (kind == "send" and action[2] not in VALID_MODES):
            log.unexpect(f"{kind}: {exc!r}")
    except Exception as exc:  # anything else is a finding (AssertionError included)
        log.unexpect(f"{kind}: {type(exc).__name__}: {exc}")


def _ended(call: Callable[[], T]) -> T | None:
    """`call()`, or None if it raised `SteerableError` with code `run_ended`."""
    try:
        return call()
    except SteerableError as exc:
        if exc.error.code is not ErrorCode.RUN_ENDED:
            raise
        return None


def settle(rt: Runtime, handle: RunHandle, run: int, world: World, log: HostLog) -> bool:
    """Send a last message and drive the run until it is delivered or the run ends.

    Returns True if the last message was delivered (then every accepted message must be).
    """
    world.gate.release()  # calls blocked in `block` return (each was cancellable anyway)
    final = _ended(lambda: handle.send("final"))
    if final is None:
        return False
    log.note(log.accepted, run, (final, "final"))
    for event in handle.events(timeout=WAIT):
        if event.kind is EventKind.APPROVAL_REQUESTED:
            call_id = event.data["call_id"]
            if _ended(lambda: handle.approve(call_id)):  # noqa: B023 - called at once
                log.note(log.approved, run, call_id)
        elif event.kind is EventKind.MESSAGE_DELIVERED and event.data["seq"] == final:
            return True
        elif event.kind is EventKind.RUN_ENDED:
            return False
    raise AssertionError(f"run {handle.run_id} neither delivered {final} nor ended: a hang")


def check_run(
    rt: Runtime,
    handle: RunHandle,
    run: int,
    agent: SteeredAgent,
    world: World,
    log: HostLog,
    *,
    final_delivered: bool,
) -> None:
    outcome = handle.result(timeout=WAIT)
    assert outcome.state.is_terminal
    replay = rt.replay(handle.run_id)
    users = [e for e in replay.transcript if isinstance(e, UserMessage)]
    delivered = [(m.seq, m.content) for m in users]
    accepted = sorted(log.accepted.get(run, []))
    assert len({seq for seq, _ in accepted}) == len(accepted), "a seq was handed out twice"
    if final_delivered:
        assert delivered == accepted, "an accepted message was lost or reordered"
    else:
        assert delivered == accepted[: len(delivered)], "not a prefix of the accepted messages"
    # exactly once, in order, to the decisions the run kept. A model call that an interrupt
    # discarded saw its messages too; they stay news and the next call sees them again
    # (docs/steering.md), so only kept decisions count.
    kept = [e.model_call for e in replay.transcript if isinstance(e, DecisionEntry)]
    answered = [seq for call in kept for seq in agent.by_call.get(call, [])]
    seqs = [seq for seq, _ in delivered]
    assert answered == seqs[: len(answered)]
    assert set(agent.delivered) <= set(seqs)
    events = [e.data["seq"] for e in handle.events() if e.kind is EventKind.MESSAGE_DELIVERED]
    assert events == seqs
    assert set(events) == set(agent.delivered)
    TOTALS["messages_accepted"] += len(accepted)
    TOTALS["messages_delivered_checked"] += len(delivered)
    TOTALS["runs"] += 1
    TOTALS[f"runs_{outcome.state.value}"] += 1
    # approvals: a call runs at most once, and only if an approve() returned True for it;
    # a call whose deny() returned True never runs (its result: denied, or cancelled first)
    results = {e.call_id: e for e in replay.transcript if isinstance(e, ToolResult)}
    with world.lock:
        ran = [c for r, c in world.executed if r == handle.run_id]
    approved = log.approved.get(run, set())
    denied = log.denied.get(run, set())
    assert len(ran) == len(set(ran)), f"an approved call ran twice: {ran}"
    assert not approved & denied, "one call both approved and denied"
    assert set(ran) <= approved, f"ran without an approval: {set(ran) - approved}"
    TOTALS["approvals_granted"] += len(approved)
    TOTALS["approvals_denied"] += len(denied)
    TOTALS["approved_calls_ran"] += len(ran)
    for call_id in denied:
        result = results.get(call_id)
        assert result is None or (
            result.error is not None
            and result.error.code in (ErrorCode.APPROVAL_DENIED, ErrorCode.CANCELLED)
        ), f"denied call {call_id} has {result!r}"


def play(
    script_a: list[str],
    script_b: list[str],
    actions: list[tuple[int, int, tuple[Any, ...]]],
    threads: int,
    *,
    passivate: bool,
    store_dir: Path | None,
) -> None:
    world = World()
    log = HostLog()
    agents = [SteeredAgent(script_a, "a"), SteeredAgent(script_b, "b")]
    store = MemoryStore() if store_dir is None else SqliteStore(str(store_dir / "runs.db"))
    with Runtime(store=store, tools=world.tools(), passivate=passivate) as rt:
        config = RunConfig(cancel_grace=0.05)
        handles = [rt.start(f"task {i}", agent=a, config=config) for i, a in enumerate(agents)]
        per_thread: list[list[tuple[int, tuple[Any, ...]]]] = [[] for _ in range(threads)]
        for who, run, action in actions:
            per_thread[who % threads].append((run, action))
        barrier = threading.Barrier(threads)

        def host(mine: list[tuple[int, tuple[Any, ...]]]) -> None:
            barrier.wait(WAIT)
            for run, action in mine:
                act(handles[run], run, action, log)

        workers = [
            threading.Thread(target=host, args=(mine,), name=f"host-{i}")
            for i, mine in enumerate(per_thread)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT)
            assert not worker.is_alive(), "a host call blocked"
        assert not log.unexpected, log.unexpected
        TOTALS["examples"] += 1
        TOTALS["host_actions"] += len(actions)
        finals = [settle(rt, h, i, world, log) for i, h in enumerate(handles)]
        for handle in handles:
            handle.cancel("example over")
        for i, handle in enumerate(handles):
            check_run(rt, handle, i, agents[i], world, log, final_delivered=finals[i])
        assert not log.unexpected, log.unexpected
        assert rt.statistics()["runs_active"] == 0
        assert rt.directory.entries() == []


SCRIPT = st.lists(STEP, max_size=6)
ACTIONS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), ACTION), min_size=1, max_size=40)


@FUZZ
@given(
    script_a=SCRIPT,
    script_b=SCRIPT,
    actions=ACTIONS,
    threads=st.integers(1, 3),
    passivate=st.booleans(),
)
def test_host_actions_from_many_threads_against_live_runs(
    script_a: list[str],
    script_b: list[str],
    actions: list[tuple[int, int, tuple[Any, ...]]],
    threads: int,
    passivate: bool,
) -> None:
    play(script_a, script_b, actions, threads, passivate=passivate, store_dir=None)


@settings(FUZZ, max_examples=max(10, EXAMPLES // 4))
@given(script_a=SCRIPT, script_b=SCRIPT, actions=ACTIONS, threads=st.integers(1, 3))
def test_host_actions_against_runs_on_a_durable_store(
    script_a: list[str],
    script_b: list[str],
    actions: list[tuple[int, int, tuple[Any, ...]]],
    threads: int,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        play(script_a, script_b, actions, threads, passivate=True, store_dir=Path(tmp))


# ------------------------------------------------------------------ targeted cases


@pytest.fixture
def waiting_run() -> Iterator[tuple[Runtime, RunHandle]]:
    with Runtime() as rt:
        handle = rt.start("t", agent=SteeredAgent([], "asker"))
        wait_state(handle, RunState.WAITING, timeout=WAIT)
        yield rt, handle
        handle.cancel()


@pytest.mark.parametrize("mode", INVALID_MODES)
def test_send_with_an_unknown_mode_is_refused_and_consumes_nothing(
    waiting_run: tuple[Runtime, RunHandle], mode: str
) -> None:
    _, handle = waiting_run
    with pytest.raises(ValueError, match="mode must be 'queue' or 'interrupt'") as info:
        handle.send("hello", mode=mode)
    assert repr(mode) in str(info.value)  # the message names the bad mode
    # nothing was accepted: the next message gets seq 0 and the run is undisturbed
    assert handle.send("hello") == 0
    assert handle.state in (RunState.WAITING, RunState.RUNNING)


def test_send_documents_the_error_for_an_unknown_mode() -> None:
    """API contract: a ValueError that callers must expect is listed in `Raises:`."""
    doc = RunHandle.send.__doc__ or ""
    raises = doc.split("Raises:", 1)[-1] if "Raises:" in doc else ""
    assert "ValueError" in raises, "RunHandle.send raises ValueError for a bad mode, undocumented"


def test_the_store_does_not_change_what_send_accepts(tmp_path: Path) -> None:
    """A lone surrogate is a valid `str`; whether send() takes it must not depend on the store.

    Durable steering (docs/requirements.md): accepted means stored. A message the durable codec
    cannot encode must be refused the same way with every store (or encoded), not accepted in
    memory and refused by SQLite with an undocumented error.
    """
    outcomes: dict[str, str] = {}
    for name, store in (
        ("memory", MemoryStore()),
        ("sqlite", SqliteStore(str(tmp_path / "runs.db"))),
    ):
        with Runtime(store=store) as rt:
            handle = rt.start("t", agent=SteeredAgent([], "asker"))
            wait_state(handle, RunState.WAITING, timeout=WAIT)
            try:
                handle.send("lone \ud800 surrogate")
                outcomes[name] = "accepted"
            except (SteerableError, ValueError) as exc:
                outcomes[name] = type(exc).__name__
            handle.cancel()
            assert handle.result(timeout=WAIT).state is RunState.CANCELLED
    assert outcomes["memory"] == outcomes["sqlite"], outcomes


def test_host_calls_after_the_end_are_typed_no_ops() -> None:
    with Runtime() as rt:
        handle = rt.start("t", agent=SteeredAgent(["finish"], "finisher"))
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        with pytest.raises(SteerableError) as info:
            handle.send("late")
        assert info.value.error.code is ErrorCode.RUN_ENDED
        assert handle.cancel("late") is False
        assert handle.approve("c0") is False
        assert handle.deny("c0") is False
        assert handle.pending_approvals() == []
