"""Every example runs, and `steerable demo` shows each feature it promises.

Examples run as a user would run them: `python examples/<name>.py` in a fresh interpreter. The
demo also runs in-process, where the autouse fixture checks that it leaves no thread behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steerable.actors._cli.cli import build_parser, main
from steerable.actors._cli.demo import FEATURES, run_demo
from steerable.protocol import RunState

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 60.0  # seconds: a fail-instead-of-hang guard; each example takes well under 2 s

# What each example must print (in this order). Examples not listed must just exit 0.
MARKERS: dict[str, list[str]] = {
    "quickstart.py": ["run 1: finished", "run 2: cancelled", "quickstart ok"],
    "demo.py": [f"[x] {feature}" for feature in FEATURES],
    "chat_agent.py": [
        "model: the fake OpenAI server at http://127.0.0.1:",
        "tool get_weather started",
        "host: steered the run while get_weather ran",
        "tool get_weather finished: ok",
        "approval: book_table {'restaurant': 'Taberna', 'time': '20:00'} -> approved",
        "tool book_table finished: ok",
        "streamed: Checking the weather.",
        "final: finished: Lisbon is sunny (21 C) and your table at Taberna is booked for 20:00.",
        "tokens: 30 in, 15 out",
        "the model saw the steering message as a user turn after the tool result",
        "chat_agent ok",
    ],
}
# Examples that talk to a model use the loopback fake server unless these are set.
_MODEL_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")

# The demo's story, in order: what a reader must see, after normalising times and run ids.
DEMO_STORY = [
    "tool_started       c1.0 fetch",
    "tool_started       c1.1 fetch",
    "tool_started       c1.2 fetch",
    ">> host: all 3 fetch calls are inside their tool at once",
    ">> host: send('also cover the new CLI', mode='queue') -> seq 0",
    "message_accepted   seq 0 (queue)",
    "tool_finished      c1.0 fetch: ok",
    "tool_finished      c1.2 fetch: ok",
    "message_delivered  seq 0",
    "the user said 'also cover the new CLI'",
    "tool_started       c2.0 draft",
    "mode='interrupt') -> seq 1",
    "message_accepted   seq 1 (interrupt)",
    "tool_finished      c2.0 draft: FAILED cancelled",
    "execute_finished   1 call(s) (interrupted)",
    "message_delivered  seq 1",
    "approval_requested c3.0 publish",
    "state_changed      running -> waiting (waiting for approval)",
    ">> host: c3.0 publish waits for a person: approve('c3.0') -> True",
    "approval_settled   c3.0 approved",
    "tool_finished      c3.0 publish: ok",
    "tool_started       c4.0 notify_mirror",
    "tool_finished      c4.0 notify_mirror: FAILED side_effect_unknown",
    "the run moved on without it",
    "tool_retry         c5.0 lookup: handler_error, attempt 2 in 0.05s",
    "tool_finished      c5.0 lookup: ok after 2 attempts",
    "run_ended          finished",
    "tool_started       c1.0 reindex",
    ">> host: reindex is running; cancel('user pressed stop') -> True",
    "run_cancelled      reason='user pressed stop'",
    "run_ended          cancelled",
    "run A <id>  finished",
    "run B <id>  cancelled",
    "threads left behind: none",
    "Timeline of both runs (open it in a browser): <path>",
]


def _run(*args: str, db: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _MODEL_ENV}
    if db is not None:
        env["STEERABLE_DB"] = str(db)
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=env,
    )


def _normalize(text: str) -> list[str]:
    """The output without what legitimately varies: time offsets and run ids."""
    untimed = (re.sub(r"^ *\d+\.\d{3}s  ", "", line) for line in text.splitlines())
    unpathed = (re.sub(r"(open it in a browser\): ).*", r"\1<path>", line) for line in untimed)
    return [re.sub(r"\.\.[0-9A-Z]{6}\b", "<id>", line) for line in unpathed]


def _assert_in_order(lines: list[str], markers: list[str]) -> None:
    position = 0
    for marker in markers:
        for index in range(position, len(lines)):
            if marker in lines[index]:
                position = index + 1
                break
        else:
            shown = "\n".join(lines)
            pytest.fail(f"{marker!r} missing (or out of order) after line {position}:\n{shown}")


def test_examples_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert set(MARKERS) <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path) -> None:
    done = _run(str(path))
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout}\n{done.stderr}"
    _assert_in_order(done.stdout.splitlines(), MARKERS.get(path.name, []))


def test_cli_demo_tells_the_whole_story(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.html"
    done = _run(
        "-m", "steerable.actors._cli", "demo", "--timeline", str(timeline), db=tmp_path / "runs.db"
    )
    assert done.returncode == 0, f"steerable demo failed:\n{done.stdout}\n{done.stderr}"
    assert done.stderr == ""
    lines = _normalize(done.stdout)
    _assert_in_order(lines, DEMO_STORY)
    _assert_in_order(lines, [f"[x] {feature}" for feature in FEATURES])
    assert not any(line.lstrip().startswith("[ ]") for line in lines)
    assert done.stdout.splitlines()[-2].endswith(f"open it in a browser): {timeline}")
    page = timeline.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page


def test_run_demo_in_process_is_deterministic_and_leaves_nothing(tmp_path: Path) -> None:
    first: list[str] = []
    outcomes = run_demo(first.append, timeline=tmp_path / "in-process.html")
    assert [o.state for o in outcomes] == [RunState.FINISHED, RunState.CANCELLED]
    finished, cancelled = outcomes
    assert finished.metrics.retries == 1
    assert finished.metrics.messages_delivered == 2
    # R6: every error, in order, naming its call (the interrupted one, the write that may
    # have happened, the retried attempt); the run's own error last.
    assert [(e.code.value, e.details.get("call_id")) for e in finished.errors] == [
        ("cancelled", "c2.0"),
        ("side_effect_unknown", "c4.0"),
        ("handler_error", "c5.0"),
    ]
    assert finished.errors[-1].details["retried"] is True
    assert [(e.code.value, e.details.get("call_id")) for e in cancelled.errors] == [
        ("cancelled", "c1.0"),
        ("cancelled", None),
    ]
    # The same story every time: only time offsets and run ids differ between runs.
    second = _run(
        "-m", "steerable.actors._cli", "demo", "--memory", "--timeline", str(tmp_path / "t.html")
    )
    assert _normalize("\n".join(first)) == _normalize(second.stdout)


def test_cli_lists_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([])  # a subcommand is required
    assert exit_info.value.code == 2
    assert build_parser().parse_args(["demo"]).command == "demo"


def test_cli_reads_the_demo_runs_back_from_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    demo = _run(
        "-m", "steerable.actors._cli", "demo", "--timeline", str(tmp_path / "t.html"), db=db
    )
    assert demo.returncode == 0, demo.stderr
    runs = _run("-m", "steerable.actors._cli", "runs", db=db)
    assert runs.returncode == 0, runs.stderr
    rows = [line.split() for line in runs.stdout.splitlines()[1:-1]]
    assert [(row[1], row[3]) for row in rows] == [
        ("finished", "release-writer"),
        ("cancelled", "indexer"),
    ]
    run_a = rows[0][0]
    show = _run("-m", "steerable.actors._cli", "show", run_a, db=db)
    assert show.returncode == 0, show.stderr
    assert "state     finished" in show.stdout
    assert "result c4.0 notify_mirror: error side_effect_unknown" in show.stdout
    revisions = _run("-m", "steerable.actors._cli", "revisions", run_a, db=db)
    assert revisions.stdout.splitlines()[1].split()[:2] == ["0", "running"]
    replay = _run("-m", "steerable.actors._cli", "replay", run_a, "--revision", "3", db=db)
    assert "replay of " + run_a + " at revision 3 (read-only)" in replay.stdout
    assert "message_delivered" in replay.stdout
    missing = _run("-m", "steerable.actors._cli", "show", "run_nope", db=db)
    assert missing.returncode == 2
    assert "[not_found]" in missing.stderr
