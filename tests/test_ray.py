"""The Ray executor (issue 17, docs/isolation.md): tools as Ray tasks, force-cancelled when the
run gives up on them, results through the supervisor's inbox, the idempotency key carried along.

Marked `ray`: excluded from the main test command (starting Ray takes tens of seconds) and run
by its own CI step (`pytest -m ray`, see README.md). One local Ray (`ray.init(num_cpus=2)`) per
test run. Without Ray these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import RayExecutor, Runtime
from steerable.actors.testing import ScriptedAgent, call, plan, wait_event
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    RunConfig,
    RunState,
    RunView,
    ToolResult,
)

if TYPE_CHECKING:
    from tests import ray_tools as kit
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    import ray_tools as kit

pytestmark = pytest.mark.ray

WAIT = 60.0  # generous: Ray schedules tasks on a loaded machine


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray for the whole test run; its workers import the tests' tool modules."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("Ray is not installed: CI must run these tests (pip install '.[ray]')")
        pytest.skip("Ray is not installed (pip install 'steerable[ray]')")
    tests = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def rt(ray_cluster: Any) -> Iterator[Runtime]:
    runtime = Runtime(
        tools=[kit.ray_whoami, kit.ray_sleeper, kit.ray_slow, kit.ray_raises],
        executors={"ray": RayExecutor()},
    )
    try:
        yield runtime
    finally:
        runtime.shutdown()


def _last_result(view: RunView) -> Finish:
    results = [e for e in view.transcript if isinstance(e, ToolResult)]
    return Finish(output=results[-1].model_dump(mode="json") if results else None)


def test_a_ray_tool_runs_as_a_task_with_its_key(rt: Runtime) -> None:
    agent = ScriptedAgent([plan(call("ray_whoami", note="hi")), _last_result])
    outcome = rt.start("t", agent=agent, config=RunConfig(step_timeout=WAIT)).result(WAIT)
    assert outcome.state is RunState.FINISHED
    result = outcome.output
    assert result["ok"] is True
    value = result["value"]
    assert value["pid"] != os.getpid()
    assert value["note"] == "hi"
    assert value["call_id"] == result["call_id"]
    assert value["idempotency_key"].startswith("idem_")
    assert 0 < value["remaining"] <= WAIT
    assert rt.statistics()["ray_tasks"] == 1


def test_a_ray_tool_error_is_typed(rt: Runtime) -> None:
    agent = ScriptedAgent([plan(call("ray_raises", message="bad")), _last_result])
    result = rt.start("t", agent=agent, config=RunConfig(step_timeout=WAIT)).result(WAIT).output
    assert result["error"]["code"] == ErrorCode.HANDLER_ERROR
    assert "ValueError: bad" in result["error"]["message"]


def test_cancel_force_cancels_the_task(rt: Runtime) -> None:
    agent = ScriptedAgent([plan(call("ray_sleeper"))])
    handle = rt.start("t", agent=agent, config=RunConfig(cancel_grace=0.1))
    wait_event(handle, EventKind.TOOL_STARTED, timeout=WAIT)
    handle.cancel("stop")
    outcome = handle.result(timeout=WAIT)
    assert outcome.state is RunState.CANCELLED
    assert outcome.error is not None
    assert outcome.error.details["abandoned"] == []
    assert len(outcome.error.details["killed"]) == 1
    assert rt.statistics()["ray_tasks_running"] == 0


def test_a_timeout_force_cancels_the_task(rt: Runtime) -> None:
    agent = ScriptedAgent([plan(call("ray_slow")), _last_result])
    config = RunConfig(retry={"max_retries": 0})
    result = rt.start("t", agent=agent, config=config).result(WAIT).output
    assert result["error"]["code"] == ErrorCode.TIMEOUT
    assert result["error"]["details"]["killed"] is True
