"""Process isolation (issue 17, docs/isolation.md): tools in warm worker processes that are killed
on cancel, interrupt and timeout, with limits, typed crashes, and no zombie or orphan left.

Real processes; tools report their pid through a unix-socket `Beacon`, and the tests wait for
processes to exit with pidfds, never with sleeps.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, Tool, tool
from steerable.actors.testing import ScriptedAgent, call, plan
from steerable.protocol import (
    ErrorCode,
    Finish,
    RunConfig,
    RunState,
    RunView,
    SteeringMode,
    ToolResult,
)

if TYPE_CHECKING:
    from tests import isolation_tools as kit
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    import isolation_tools as kit

WAIT = kit.WAIT
TOOLS: list[Tool[Any, Any]] = [
    kit.whoami,
    kit.whoami_async,
    kit.cooperative,
    kit.sleeper,
    kit.spinner,
    kit.regex_spinner,
    kit.parent_of_sleeper,
    kit.slow_timeout,
    kit.exits,
    kit.segfaults,
    kit.burns_cpu,
    kit.allocates,
    kit.big_result,
    kit.opaque,
    kit.raises,
]


@pytest.fixture
def rt() -> Iterator[Runtime]:
    runtime = Runtime(tools=TOOLS, process_workers=2)
    try:
        yield runtime
    finally:
        runtime.shutdown()


@pytest.fixture
def beacon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kit.Beacon]:
    b = kit.Beacon(tmp_path_factory.mktemp("b", numbered=True))
    try:
        yield b
    finally:
        b.close()


def _last_result(view: RunView) -> Finish:
    results = [e for e in view.transcript if isinstance(e, ToolResult)]
    return Finish(output=results[-1].model_dump(mode="json") if results else None)


def _one_call(rt: Runtime, name: str, config: RunConfig | None = None, **args: Any) -> Any:
    agent = ScriptedAgent([plan(call(name, **args)), _last_result])
    return rt.start("t", agent=agent, config=config).result(timeout=WAIT)


def _results(rt: Runtime, run_id: str) -> list[ToolResult]:
    """The tool results a run recorded (transcript and journal), by call."""
    stored = rt.store.load(run_id)
    found = {e.call_id: e for e in stored.transcript if isinstance(e, ToolResult)}
    found.update({k: v for k, v in stored.journal.items() if isinstance(v, ToolResult)})
    return list(found.values())


def _result(outcome: Any) -> dict[str, Any]:
    assert outcome.state is RunState.FINISHED, outcome
    output: dict[str, Any] = outcome.output
    return output


# --- calls ----------------------------------------------------------------------------------


def test_a_process_tool_runs_in_a_worker_with_its_context(rt: Runtime) -> None:
    result = _result(_one_call(rt, "whoami", config=RunConfig(step_timeout=30), note="hi"))
    assert result["ok"] is True
    value = result["value"]
    assert value["pid"] != os.getpid()
    assert value["pid"] in rt.services.executors.process_pool().pids()
    assert value["note"] == "hi"
    assert value["call_id"] == result["call_id"]
    assert value["idempotency_key"].startswith("idem_")
    assert value["attempt"] == 1
    # The deadline travels as the time left, on the worker's own clock.
    assert 0 < value["remaining"] <= 30


def test_an_async_process_tool(rt: Runtime) -> None:
    value = _result(_one_call(rt, "whoami_async", note="a"))["value"]
    assert value["pid"] != os.getpid()
    assert value["note"] == "a"


def test_a_warm_worker_serves_call_after_call(rt: Runtime) -> None:
    pids = {_result(_one_call(rt, "whoami"))["value"]["pid"] for _ in range(4)}
    assert pids <= set(rt.services.executors.process_pool().pids())
    assert len(pids) <= 2  # two warm workers, reused; none started per call


def test_a_tool_error_is_contained_and_typed(rt: Runtime) -> None:
    result = _result(_one_call(rt, "raises", message="bad input"))
    assert result["ok"] is False
    assert result["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert "ValueError: bad input" in result["error"]["message"]
    assert "traceback" in result["error"]["details"]


# --- killing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sleeper", "spinner", "regex_spinner"])
def test_cancel_kills_a_tool_that_ignores_it_after_the_grace(
    rt: Runtime, beacon: kit.Beacon, name: str
) -> None:
    agent = ScriptedAgent([plan(call(name, beacon=beacon.address))])
    handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.1))
    pid = int(beacon.wait())
    assert kit.alive(pid)
    handle.cancel("stop")
    outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert outcome.error.details["abandoned"] == []
    (killed,) = outcome.error.details["killed"]
    (result,) = _results(rt, handle.run_id)
    assert result.call_id == killed
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert result.error.details["killed"] is True
    assert result.error.details["abandoned"] is False
    assert kit.wait_gone(pid)
    # A fresh worker took its place: the next call runs.
    assert _result(_one_call(rt, "whoami"))["ok"] is True


def test_cancel_reaches_a_cooperative_tool_first(rt: Runtime, beacon: kit.Beacon) -> None:
    kills = rt.statistics()["process_kills"]
    agent = ScriptedAgent([plan(call("cooperative", beacon=beacon.address))])
    handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=WAIT))
    pid = int(beacon.wait())
    handle.cancel("stop")
    outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert "killed" not in outcome.error.details
    (result,) = _results(rt, handle.run_id)
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED
    assert "killed" not in result.error.details  # it stopped on its own
    assert rt.statistics()["process_kills"] == kills
    assert kit.alive(pid)  # and its worker lives on


def test_kill_takes_the_tools_own_children_with_it(rt: Runtime, beacon: kit.Beacon) -> None:
    agent = ScriptedAgent([plan(call("parent_of_sleeper", beacon=beacon.address))])
    handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.05))
    worker, child = (int(p) for p in beacon.wait().split())
    assert kit.alive(child)
    handle.cancel("stop")
    assert handle.result(timeout=WAIT).state is RunState.CANCELLED
    assert kit.wait_gone(worker)
    # The grandchild was in the worker's process group: SIGKILLed with it (init reaps it).
    assert kit.wait_gone(child)


def test_a_timeout_kills_the_call_and_the_run_goes_on(rt: Runtime, beacon: kit.Beacon) -> None:
    # A warm, idle worker first: the 3 s timeout runs from dispatch, and must not be spent
    # waiting for a worker to start.
    assert _result(_one_call(rt, "whoami"))["ok"] is True
    agent = ScriptedAgent([plan(call("slow_timeout", beacon=beacon.address)), _last_result])
    handle = rt.start("t", agent=agent, config=RunConfig(retry={"max_retries": 0}))
    pid = int(beacon.wait())
    result = _result(handle.result(timeout=WAIT))
    assert result["ok"] is False
    assert result["error"]["code"] == ErrorCode.TIMEOUT
    assert result["error"]["details"]["killed"] is True
    assert kit.wait_gone(pid)


def test_an_interrupt_kills_the_running_call(rt: Runtime, beacon: kit.Beacon) -> None:
    agent = ScriptedAgent([plan(call("sleeper", beacon=beacon.address)), _last_result])
    handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.05))
    pid = int(beacon.wait())
    handle.send("stop that", mode=SteeringMode.INTERRUPT)
    result = _result(handle.result(timeout=WAIT))
    assert result["error"]["code"] == ErrorCode.CANCELLED
    assert result["error"]["details"]["killed"] is True
    assert kit.wait_gone(pid)


# --- crashes and limits --------------------------------------------------------------------


def test_a_worker_that_exits_is_a_typed_crash(rt: Runtime) -> None:
    result = _result(_one_call(rt, "exits", status=3))
    assert result["error"]["code"] == ErrorCode.TOOL_CRASHED
    assert result["error"]["details"]["exit_status"] == 3
    assert _result(_one_call(rt, "whoami"))["ok"] is True  # replaced


def test_a_segfault_is_a_typed_crash(rt: Runtime) -> None:
    result = _result(_one_call(rt, "segfaults"))
    assert result["error"]["code"] == ErrorCode.TOOL_CRASHED
    assert result["error"]["details"]["signal"] == "SIGSEGV"


def test_cpu_seconds_limit(rt: Runtime) -> None:
    result = _result(_one_call(rt, "burns_cpu", config=RunConfig(step_timeout=60)))
    assert result["error"]["code"] == ErrorCode.TOOL_CRASHED
    assert result["error"]["details"]["signal"] == "SIGXCPU"
    assert result["error"]["details"]["cpu_seconds"] == 1


def test_memory_limit(rt: Runtime) -> None:
    result = _result(_one_call(rt, "allocates", megabytes=2048))
    assert result["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert result["error"]["details"]["exception"] == "MemoryError"
    # The limit is per call: the same worker allocates freely afterwards.
    assert _result(_one_call(rt, "allocates", megabytes=16))["value"] == 16 * 1024 * 1024


def test_result_bounds_and_serialisation(rt: Runtime) -> None:
    small = _result(_one_call(rt, "big_result", size=10))
    assert small["value"] == "x" * 10
    big = _result(_one_call(rt, "big_result", size=1000))
    assert big["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert "too large" in big["error"]["message"]
    assert big["error"]["details"]["limit"] == 100
    opaque = _result(_one_call(rt, "opaque"))
    assert opaque["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert "not serializable" in opaque["error"]["message"]


def test_a_tool_the_worker_cannot_import_is_a_typed_error(rt: Runtime) -> None:
    def body() -> str:
        return "unreachable"

    body.__qualname__ = "body"
    body.__module__ = "no_such_module_for_steerable"
    ghost = tool(isolation="process", name="ghost")(body)
    agent = ScriptedAgent([plan(call("ghost")), _last_result])
    result = _result(rt.start("t", agent=agent, tools=[ghost]).result(timeout=WAIT))
    assert result["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert result["error"]["details"]["reason"] == "not_importable"


# --- options -----------------------------------------------------------------------------------


def test_a_nested_function_cannot_be_process_isolated() -> None:
    def nested() -> None:
        return None

    with pytest.raises(TypeError, match="module-level"):
        tool(isolation="process")(nested)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"isolation": "fiber"}, ValueError),
        ({"memory_limit": 10}, ValueError),
        ({"isolation": "process", "memory_limit": 0}, ValueError),
        ({"isolation": "process", "cpu_seconds": "1"}, TypeError),
        ({"num_cpus": 1}, ValueError),
        ({"isolation": "process", "executor": "ray"}, ValueError),
        ({"max_result_bytes": -1}, ValueError),
        ({"executor": ""}, ValueError),
    ],
)
def test_bad_placement_options_fail_at_the_decorator(
    options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        tool(**options)


def test_an_unknown_executor_fails_at_runtime_construction() -> None:
    with pytest.raises(ValueError, match="executor 'dask'"):
        Runtime(tools=[tool(executor="dask")(kit.echo)])


def test_missing_ray_is_an_error_at_runtime_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"steerable\[ray\]"):
        Runtime(tools=[tool(executor="ray", name="remote_echo")(kit.echo)])


# --- no zombie, no orphan ---------------------------------------------------------------------


def test_shutdown_leaves_no_worker_process(beacon: kit.Beacon) -> None:
    runtime = Runtime(tools=[kit.sleeper, kit.whoami], process_workers=2)
    try:
        agent = ScriptedAgent([plan(call("sleeper", beacon=beacon.address))])
        runtime.start("t", agent=agent)
        busy = int(beacon.wait())
        _result(_one_call(runtime, "whoami"))
        pids = runtime.services.executors.process_pool().pids()
        assert busy in pids
        assert len(pids) >= 2
    finally:
        assert runtime.shutdown() == []
    for pid in pids:
        assert kit.wait_gone(pid), f"worker {pid} left behind"
    # The process table: no child of the forkserver (our workers' parent) is left.
    parents = {_parent(pid) for pid in pids} - {None}
    for parent in parents:
        assert parent is not None
        assert not set(kit.children_of(parent)) & set(pids)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


DRIVER = Path(__file__).parent / "crash_drivers" / "isolation_driver.py"


@pytest.mark.parametrize("name", ["sleeper", "spinner"])
def test_a_host_killed_with_sigkill_leaves_no_worker(name: str) -> None:
    import subprocess
    import sys
    import tempfile

    # A short directory for the beacon's socket (paths are limited to 108 bytes), removed here:
    # the driver dies by SIGKILL and cannot.
    directory = tempfile.TemporaryDirectory(prefix="iso")
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), name, directory.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parent),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read() if proc.stderr else ""
        assert line[0] == "workers"
        workers = [int(p) for p in line[1:]]
        busy = int(line[1])
        assert kit.alive(busy)
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        directory.cleanup()
    for pid in workers:
        assert kit.wait_gone(pid), f"worker {pid} outlived its host"
