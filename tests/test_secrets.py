"""Secrets (R26): a credential marked with pydantic's `SecretStr` is never persisted or logged
in clear, only as a reference (`secret:sha256:<16 hex>`) or masked.

The secret's clear text is looked for in the raw bytes of the SQLite file and its WAL (while
the store is open and after it is closed) and in everything logged, captured in the test only
(structlog's `capture_logs` and pytest's `caplog`; the library never configures logging). A
user message is plain text chosen by the person who sends it, not a secret: not covered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr
from structlog.testing import capture_logs

from steerable.actors import Runtime, SqliteStore, Tool, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, plan, wait_event, wait_state
from steerable.protocol import (
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    RunConfig,
    RunState,
    RunView,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound
PASSWORD = "hunter2-pw-7Qx9-CLEAR"
TOKEN = "tok-returned-4Zk1-CLEAR"


class Credentials(BaseModel):
    user: str
    token: SecretStr


class Login:
    """A tool taking a secret argument and returning a model with a secret field."""

    def __init__(self, *, requires_approval: bool = False) -> None:
        self.lock = threading.Lock()
        self.received: list[Any] = []
        login_ = self

        @tool(side_effect="write", requires_approval=requires_approval)
        def login(user: str, password: SecretStr, ctx: ToolContext) -> Credentials:
            with login_.lock:
                login_.received.append(password)
            if not isinstance(password, SecretStr) or password.get_secret_value() != PASSWORD:
                raise ValueError("wrong password")
            return Credentials(user=user, token=SecretStr(TOKEN))

        self.tool: Tool[Any, Any] = login


def database_bytes(path: Path) -> bytes:
    """The database file and its WAL and shared-memory files, as they are on disk."""
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def assert_no_clear_secret(data: bytes | str, where: str) -> None:
    blob = data.encode() if isinstance(data, str) else data
    for secret in (PASSWORD, TOKEN):
        assert secret.encode() not in blob, f"{secret!r} in clear in {where}"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[list[Any]]:
    """Everything steerable logs while the test runs, through structlog and stdlib logging."""
    caplog.set_level(logging.DEBUG)
    with capture_logs() as captured:
        yield captured


def _results(view: RunView) -> list[ToolResult]:
    return [r for r in view.transcript if isinstance(r, ToolResult)]


def test_a_secret_argument_and_a_secret_result_are_stored_as_references(
    tmp_path: Path, logs: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "runs.db"
    login = Login()
    agent = ScriptedAgent(
        [plan(call("login", user="bob", password=SecretStr(PASSWORD))), AskUser(question="?")],
        then=Finish(output="done"),
    )
    with Runtime(store=SqliteStore(path), tools=[login.tool]) as rt:
        handle = rt.start("log in", agent=agent)
        wait_state(handle, RunState.WAITING)
        assert rt.store.flush(WAIT)
        assert_no_clear_secret(database_bytes(path), "the database while open")
        handle.send("thanks")
        outcome = handle.result(timeout=WAIT)
        replay = rt.replay(handle.run_id)
    assert outcome.state is RunState.FINISHED
    # The tool got the real secret; the agent saw the result with the token masked.
    assert [s.get_secret_value() for s in login.received] == [PASSWORD]
    (result,) = _results(agent.views[1])
    assert result.ok
    assert result.value["user"] == "bob"
    assert_no_clear_secret(repr(result.value), "the agent's view of the result")
    # Stored: a reference to the argument, never the clear text.
    assert "secret:sha256:" in repr(replay.transcript[0])
    assert_no_clear_secret(repr(replay.transcript), "the replayed transcript")
    assert_no_clear_secret(database_bytes(path), "the database after close")
    assert_no_clear_secret(repr(logs), "structlog output")
    assert_no_clear_secret(caplog.text, "stdlib logging output")


def test_a_clear_text_argument_for_a_secret_parameter_is_not_stored_in_clear(
    tmp_path: Path, logs: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    # A model adapter sends JSON: the password arrives as a string and becomes a SecretStr by
    # the tool's annotation. The runtime knows the parameter is a secret (R26).
    path = tmp_path / "runs.db"
    login = Login()
    agent = ScriptedAgent(
        [plan(call("login", user="bob", password=PASSWORD))], then=Finish(output="done")
    )
    with Runtime(store=SqliteStore(path), tools=[login.tool]) as rt:
        outcome = rt.start("log in", agent=agent).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert [s.get_secret_value() for s in login.received] == [PASSWORD]
    assert_no_clear_secret(database_bytes(path), "the database")
    assert_no_clear_secret(repr(logs), "structlog output")
    assert_no_clear_secret(caplog.text, "stdlib logging output")


def test_secrets_stay_out_of_logs_and_file_across_errors_hooks_and_resume(
    tmp_path: Path, logs: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Paths that log: a hook that raises (hook_error), a shutdown keeping runs, and a resume
    # with override=True (the differences are logged).
    path = tmp_path / "runs.db"
    login = Login()
    agent = ScriptedAgent(
        [
            plan(call("login", user="bob", password=SecretStr(PASSWORD))),
            plan(call("login", user="eve", password=SecretStr("not-" + PASSWORD))),
            AskUser(question="?"),
        ]
    )

    def failing_hook(event: Any) -> None:
        raise RuntimeError("hook failed")

    rt = Runtime(store=SqliteStore(path), tools=[login.tool])
    try:
        rt.on("after_execute", failing_hook)
        handle = rt.start("log in", agent=agent)
        wait_state(handle, RunState.WAITING)
    finally:
        rt.shutdown(cancel_runs=False)
    results = _results(agent.views[2])
    assert [r.ok for r in results] == [True, False]
    assert results[1].error is not None
    assert results[1].error.code is ErrorCode.HANDLER_ERROR

    @tool(side_effect="none")
    def extra() -> str:
        return "x"

    with Runtime(store=SqliteStore(path), tools=[login.tool, extra]) as rt2:
        resumed = rt2.resume(
            handle.run_id, agent=ScriptedAgent([], then=Finish(output="ok")), override=True
        )
        wait_state(resumed, RunState.WAITING)
        resumed.send("go")
        assert resumed.result(timeout=WAIT).state is RunState.FINISHED
    assert_no_clear_secret(database_bytes(path), "the database")
    assert_no_clear_secret(repr(logs), "structlog output")
    assert_no_clear_secret(caplog.text, "stdlib logging output")
    assert any(entry.get("event") == "resume_override" for entry in logs)  # logging was seen


def test_a_secret_argument_of_a_call_approved_after_passivation_reaches_the_tool(
    tmp_path: Path,
) -> None:
    # The run parks for the approval (its checkpoint holds only the secret's reference) and
    # is woken by approve() in the same process: the tool must still get the real secret,
    # or at least a clear error; never the reference passed off as the password.
    path = tmp_path / "runs.db"
    login = Login(requires_approval=True)
    agent = ScriptedAgent(
        [plan(call("login", user="bob", password=SecretStr(PASSWORD)))],
        then=Finish(output="done"),
    )
    with Runtime(store=SqliteStore(path), tools=[login.tool]) as rt:
        handle = rt.start("log in", agent=agent)
        wait_event(handle, EventKind.APPROVAL_REQUESTED)
        passivated = threading.Event()
        for _ in range(2000):  # bounded wait until the run gave up its supervisor
            if rt.statistics()["runs_passivated"] == 1:
                passivated.set()
                break
            passivated.wait(0.005)
        assert passivated.is_set()
        assert_no_clear_secret(repr(handle.pending_approvals()), "the approval request")
        assert handle.approve(handle.pending_approvals()[0].call_id)
        outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    (result,) = _results(agent.views[1])
    assert result.ok, result.error
    assert [type(s) for s in login.received] == [SecretStr]
    assert_no_clear_secret(database_bytes(path), "the database")


# ------------------------------------------------------------ secrets nested, on every path


class Vault(BaseModel):
    user: str
    token: SecretStr


def _deposit_tools(calls: list[str]) -> list[Tool[Any, Any]]:
    """`deposit` and its approval-gated twin: secrets inside a model, a dict and a list."""

    def body(
        vault: Vault, extra: dict[str, SecretStr], keys: list[SecretStr], note: str = ""
    ) -> str:
        calls.append(vault.user)
        return "deposited"

    return [
        tool(name="deposit", side_effect="write")(body),
        tool(name="deposit_gated", side_effect="write", requires_approval=True)(body),
    ]


def _deposit(name: str = "deposit", **overrides: Any) -> Any:
    # JSON as a model adapter sends it: the secrets are plain strings, typed secret by the tool.
    arguments: dict[str, Any] = {
        "vault": {"user": "bob", "token": PASSWORD},
        "extra": {"pin": PASSWORD},
        "keys": [PASSWORD, "other-" + PASSWORD],
    }
    arguments.update(overrides)
    return call(name, **arguments)


def _host_approves(handle: Any) -> None:
    (request,) = handle.pending_approvals()
    assert handle.approve(request.call_id)


def _host_denies(handle: Any) -> None:
    (request,) = handle.pending_approvals()
    assert handle.deny(request.call_id, "no")


def _host_interrupts(handle: Any) -> None:
    handle.send("stop that", mode="interrupt")


PATHS: dict[str, tuple[list[Any], dict[str, Any], Any, int]] = {
    # name: (plan steps, RunConfig fields, host action while waiting for approval, tool runs)
    "accepted": ([_deposit()], {}, None, 1),
    "invalid": ([_deposit(note=["not", "text"])], {}, None, 0),
    "invalid-neighbour": ([_deposit(), _deposit(note=123)], {}, None, 1),
    "over-budget": ([_deposit(), _deposit()], {"max_steps": 1}, None, 0),
    "approved": ([_deposit("deposit_gated")], {}, _host_approves, 1),
    "denied": ([_deposit("deposit_gated")], {}, _host_denies, 0),
    "interrupted": ([_deposit("deposit_gated")], {}, _host_interrupts, 0),
    # No tool declares these parameters secret: only secret objects can be recognised.
    "unknown-tool": (
        [
            call(
                "no_such_tool",
                vault={"token": SecretStr(PASSWORD)},
                keys=[SecretStr(PASSWORD)],
                model=Vault(user="bob", token=SecretStr(PASSWORD)),
            )
        ],
        {},
        None,
        0,
    ),
}


@pytest.mark.parametrize("path_name", sorted(PATHS))
def test_nested_secrets_are_never_recorded_in_clear_on_any_path(
    tmp_path: Path,
    logs: list[Any],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    path_name: str,
) -> None:
    from steerable.actors._cli.cli import main

    steps, fields, host_action, runs = PATHS[path_name]
    path = tmp_path / "runs.db"
    calls: list[str] = []
    agent = ScriptedAgent([plan(*steps)], then=Finish(output="done"))
    with Runtime(store=SqliteStore(path), tools=_deposit_tools(calls)) as rt:
        handle = rt.start("deposit", agent=agent, config=RunConfig(**fields))
        if host_action is not None:
            wait_event(handle, EventKind.APPROVAL_REQUESTED)
            assert_no_clear_secret(repr(handle.pending_approvals()), "the approval request")
            host_action(handle)
        outcome = handle.result(timeout=WAIT)
        events = list(handle.events(timeout=WAIT))
        assert rt.store.flush(WAIT)
        assert_no_clear_secret(database_bytes(path), "the database while open")
        replay = rt.replay(handle.run_id)
    assert len(calls) == runs
    assert outcome.state in (RunState.FINISHED, RunState.EXHAUSTED)
    if path_name == "over-budget":
        assert outcome.state is RunState.EXHAUSTED
    assert "secret:sha256:" in repr(replay.transcript[0])
    for where, data in (
        ("the database after close", database_bytes(path)),
        ("the events", repr(events)),
        ("the outcome", repr(outcome)),
        ("the replayed transcript", repr(replay.transcript)),
        ("the agent's views", repr([list(v.transcript) for v in agent.views])),
        ("structlog output", repr(logs)),
        ("stdlib logging output", caplog.text),
    ):
        assert_no_clear_secret(data, where)
    for command in (["show"], ["replay"], ["revisions"]):
        assert main([*command, "--db", str(path), handle.run_id]) == 0
    assert main(["runs", "--db", str(path)]) == 0
    printed = capsys.readouterr()
    assert handle.run_id in printed.out
    assert_no_clear_secret(printed.out + printed.err, "CLI output")
