"""Run timelines (docs/observability.md): the HTML file opened in real headless Chromium, the
Chrome Trace Event JSON checked against the format's required fields, `steerable trace`.

The scenario has two parallel tools, two steering messages, a retried call and a subagent
with its own tool, so the page must draw nested lanes, one bar group per call (one bar per
attempt), one marker per steering message, and details on hover, all without the network.
Chromium is Debian's `chromium` (`just browser`; `.ci/run` installs it): with CI=true a
missing browser fails the test.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import RetryableToolError, Runtime, SqliteStore, ToolContext, tool
from steerable.actors._cli.cli import main
from steerable.actors._observe.chrome import chrome_trace
from steerable.actors._observe.files import write_timeline
from steerable.actors.testing import Gate, ScriptedAgent, call, plan
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunState,
    SubagentCall,
)

WAIT = 10.0  # generous fail-instead-of-hang bound
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: found"


@tool
def flaky(ctx: ToolContext) -> str:
    """Fails on its first attempt."""
    if ctx.attempt == 1:
        raise RetryableToolError("busy")
    return "ok"


@pytest.fixture(scope="module")
def scenario() -> list[RunEvent]:
    """A run with parallel tools, two steering messages, a retry and a subagent: its events."""
    gate = Gate()
    helper = ScriptedAgent([plan(call("lookup", term="x"))], name="helper")
    top = ScriptedAgent(
        [
            plan(call("gate"), call("gate")),
            Plan(steps=(SubagentCall(agent="helper", task="help"),)),
            plan(call("flaky")),
        ],
        then=Finish(output="done"),
        name="top",
    )
    config = RunConfig(retry=RetryPolicy(max_retries=2, backoff=0.01, jitter=False))
    try:
        with Runtime(
            tools=[gate.tool(), lookup, flaky], agents={"helper": helper}, config=config
        ) as rt:
            handle = rt.start("the task", agent=top)
            gate.wait_started(2)
            handle.send("first message")
            handle.send("second message")
            gate.release()
            assert handle.result(WAIT).state is RunState.FINISHED
            return list(handle.events(timeout=WAIT))
    finally:
        gate.release()


def _expected(events: list[RunEvent]) -> dict[str, Any]:
    """What the pictures must show, counted from the events themselves."""
    tool_calls = {(e.run_id, e.data["call_id"]) for e in events if e.kind is EventKind.TOOL_STARTED}
    finished = [e for e in events if e.kind is EventKind.TOOL_FINISHED and e.data["attempts"]]
    return {
        "tool_calls": len(tool_calls),
        "attempts": sum(e.data["attempts"] for e in finished),
        "model_calls": sum(e.kind is EventKind.REASONING_STARTED for e in events),
        "subagents": sum(e.kind is EventKind.SUBAGENT_STARTED for e in events),
        "steering": sum(e.kind is EventKind.MESSAGE_ACCEPTED for e in events),
        "runs": len({e.run_id for e in events}),
    }


def test_the_scenario_has_what_the_pictures_must_show(scenario: list[RunEvent]) -> None:
    assert _expected(scenario) == {
        "tool_calls": 4,  # two gates, flaky, the helper's lookup
        "attempts": 5,  # flaky ran twice
        "model_calls": 6,  # top: 4, helper: 2
        "subagents": 1,
        "steering": 2,
        "runs": 2,
    }


# ---------------------------------------------------------------------------------- chrome json


def test_chrome_trace_has_the_required_fields_and_one_event_per_attempt(
    scenario: list[RunEvent],
) -> None:
    trace = json.loads(json.dumps(chrome_trace(scenario)))  # JSON all the way down
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    events = trace["traceEvents"]
    assert events
    for event in events:
        assert isinstance(event["name"], str)
        assert event["name"]
        assert event["ph"] in ("X", "i", "M")
        assert isinstance(event["pid"], int)
        assert isinstance(event["tid"], int)
        assert isinstance(event["ts"], int | float)
        assert event["ts"] >= 0
        if event["ph"] == "X":
            assert isinstance(event["dur"], int | float)
            assert event["dur"] >= 0
            assert isinstance(event["cat"], str)
        elif event["ph"] == "i":
            assert event["s"] in ("t", "p", "g")
        else:
            assert event["name"] in ("process_name", "process_sort_index", "thread_name")
            assert isinstance(event["args"], dict)
    expected = _expected(scenario)
    complete = [e for e in events if e["ph"] == "X"]
    assert sum(e["cat"] == "tool" for e in complete) == expected["attempts"]
    assert sum(e["cat"] == "model" for e in complete) == expected["model_calls"]
    assert sum(e["cat"] == "subagent" for e in complete) == expected["subagents"]
    assert sum(e["cat"] == "run" for e in complete) == expected["runs"]
    marks = [e for e in events if e["ph"] == "i"]
    assert sum(e["name"] == "steering" for e in marks) == expected["steering"]
    # Lanes exist for concurrency: bars on one call lane never overlap.
    lanes: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in complete:
        if e["cat"] != "run":
            lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for bars in lanes.values():
        bars.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(bars))


# ---------------------------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip("no Chromium here: `just browser` installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def test_the_html_timeline_draws_every_call_and_steering_message_in_chromium(
    scenario: list[RunEvent], chromium: Any, tmp_path: Path
) -> None:
    path = write_timeline(scenario, tmp_path / "timeline.html")
    expected = _expected(scenario)
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(path.as_uri())
    try:
        assert page.title().startswith("steerable timeline: top")
        runs = page.locator("svg#timeline g.run")
        assert runs.count() == expected["runs"]
        assert [runs.nth(i).get_attribute("data-depth") for i in range(runs.count())] == ["0", "1"]
        tools = page.locator("g.call[data-kind=tool]")
        assert tools.count() == expected["tool_calls"]
        assert page.locator("g.call[data-kind=tool] rect.bar").count() == expected["attempts"]
        flaky_bars = page.locator("g.call[data-kind=tool][data-name=flaky] rect.bar")
        assert flaky_bars.count() == 2
        assert page.locator("g.call[data-kind=model]").count() == expected["model_calls"]
        assert page.locator("g.call[data-kind=subagent]").count() == expected["subagents"]
        steering = page.locator("g.marker[data-kind=steering]")
        assert steering.count() == expected["steering"]
        # Every bar is drawn: a real box inside the picture.
        svg = page.locator("svg#timeline").bounding_box()
        assert svg is not None
        bars = page.locator("g.call rect.bar")
        for i in range(bars.count()):
            box = bars.nth(i).bounding_box()
            assert box is not None
            assert box["width"] > 0
            assert box["height"] > 0
            assert svg["x"] <= box["x"]
            assert box["x"] + box["width"] <= svg["x"] + svg["width"] + 1
        # The retried call's first attempt failed, its second succeeded: outcome colours.
        classes = [flaky_bars.nth(i).get_attribute("class") or "" for i in range(2)]
        assert "outcome-error" in classes[0]
        assert "outcome-ok" in classes[1]
        # Hover shows the details. The pointer events go to the element itself: markers of
        # one moment are drawn on top of each other, and which is on top depends on timing.
        tip = page.locator("#tip")
        assert not tip.is_visible()
        flaky_bars.nth(1).dispatch_event("mousemove")
        assert tip.is_visible()
        assert "flaky" in tip.inner_text()
        assert "attempt 2" in tip.inner_text()
        flaky_bars.nth(1).dispatch_event("mouseleave")
        assert not tip.is_visible()
        for i in range(steering.count()):
            steering.nth(i).dispatch_event("mousemove")
            assert tip.inner_text().startswith("steering")
            assert f"seq: {i}" in tip.inner_text()
    finally:
        page.close()
    assert errors == []
    assert [url for url in requests if not url.startswith("file:")] == []  # no network


# ---------------------------------------------------------------------------------- the CLI


def test_steerable_trace_writes_both_formats_from_recorded_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.jsonl"
    agents = {"helper": ScriptedAgent([plan(call("lookup", term="y"))], name="helper")}
    top = ScriptedAgent([Plan(steps=(SubagentCall(agent="helper", task="h"),))], name="top")
    other = ScriptedAgent([plan(call("lookup", term="z"))], name="other")
    with log.open("w") as out, Runtime(tools=[lookup], agents=agents) as rt:
        rt.subscribe(lambda event: out.write(event.model_dump_json() + "\n"))
        handle = rt.start("t", agent=top)
        rt.start("u", agent=other).result(WAIT)
        handle.result(WAIT)
        assert rt.flush_observers(WAIT)
    chrome = tmp_path / "trace.json"
    args = ["trace", handle.run_id, "--events", str(log), "--db", str(tmp_path / "unused.db")]
    assert main([*args, "--format", "chrome", "--out", str(chrome)]) == 0
    assert f": {chrome}" in capsys.readouterr().out
    trace = json.loads(chrome.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert len(names) == 2  # the run and its subagent; the other run is not in its tree
    assert all("other" not in name for name in names)
    page = tmp_path / "timeline.html"
    assert main([*args, "--out", str(page)]) == 0
    assert page.read_text().count('class="run"') == 2
    assert main([*args, "--events", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["trace", "run_nope", "--events", str(log)]) == 2
    assert "no events of run run_nope" in capsys.readouterr().err


def test_steerable_trace_without_recorded_events_says_how_to_get_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Runtime(store=SqliteStore(tmp_path / "runs.db")) as rt:  # `trace` creates no database
        run_id = rt.start("t", agent=ScriptedAgent()).result(10.0).run_id
    with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as conn, conn:
        conn.execute("DELETE FROM events")  # a run stored before its events were
    assert main(["trace", run_id, "--db", str(tmp_path / "runs.db")]) == 2
    assert "--events FILE" in capsys.readouterr().err
