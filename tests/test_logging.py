"""A library is quiet: steerable logs through `logging` under `steerable`, never to stdout.

Nothing below WARNING appears unless the host configures logging; a host that does gets
records carrying the bound fields (`run_id`, `trace_id`, ...) as attributes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog

from steerable.actors._engine.log import get_logger

# A whole run (with a tool that times out and reports late), then a DEBUG record through
# steerable's own logger: by default neither may print anything.
PROGRAM = textwrap.dedent(
    """
    import threading
    from steerable.actors import Runtime, tool
    from steerable.actors._engine.log import get_logger
    from steerable.actors.testing import ScriptedAgent, call, plan
    from steerable.protocol import Finish, RunConfig

    release = threading.Event()

    @tool(side_effect="none")
    def slow() -> str:
        release.wait(10)
        return "late"

    with Runtime(tools=[slow]) as rt:
        agent = ScriptedAgent([plan(call("slow")), Finish(output="done")])
        handle = rt.start("t", agent=agent, config=RunConfig(step_timeout=0.05))
        outcome = handle.result(timeout=30)
        release.set()
        get_logger("steerable.test").debug("debug_record", run_id=handle.run_id)
    print("state", outcome.state.value)
    """
)


@pytest.fixture(autouse=True)
def _structlog_unconfigured() -> None:
    """Earlier tests' `capture_logs` leaves structlog marked configured; start from a host
    that configured nothing, as a fresh process does."""
    structlog.reset_defaults()


def _run(tmp_path: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(prelude + PROGRAM)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def test_nothing_below_warning_reaches_stdout_or_stderr_by_default(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "state finished\n"
    assert done.stderr == ""


def test_a_host_that_configures_logging_gets_debug_records(tmp_path: Path) -> None:
    prelude = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,"
        " format='%(name)s|%(levelname)s|%(message)s')\n"
    )
    done = _run(tmp_path, prelude)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "state finished\n"  # still nothing on stdout
    assert "steerable.test|DEBUG|debug_record run_id=" in done.stderr


def test_records_carry_the_bound_fields(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("steerable.test").bind(run_id="run_1", trace_id="tr_1")
    with caplog.at_level(logging.DEBUG, logger="steerable"):
        log.info("something_happened", call_id="c1.0")
    (record,) = [r for r in caplog.records if r.name == "steerable.test"]
    assert record.levelno == logging.INFO
    assert record.__dict__["run_id"] == "run_1"
    assert record.__dict__["trace_id"] == "tr_1"
    assert record.__dict__["steerable"] == {
        "run_id": "run_1",
        "trace_id": "tr_1",
        "call_id": "c1.0",
    }
    assert record.getMessage().startswith("something_happened ")


def test_disabled_levels_cost_no_record(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="steerable"):
        get_logger("steerable.test").debug("hidden")
        get_logger("test").warning("shown")  # the name is put under `steerable`
    assert [r.getMessage() for r in caplog.records] == ["shown"]
    assert caplog.records[0].name == "steerable.test"


def test_a_field_named_like_a_record_attribute_does_not_break_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="steerable"):
        get_logger("steerable.test").info("odd", name="x", msg="y", args=(1,))
    (record,) = caplog.records
    assert record.name == "steerable.test"
    assert record.__dict__["steerable"] == {"name": "x", "msg": "y", "args": (1,)}
