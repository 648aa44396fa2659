"""Write the golden codec fixtures into tests/fixtures/checkpoints (docs/style.md:
checkpoint formats have a history).

Usage:
    python scripts/make_fixtures.py [--out DIR] [--check]

Every file is deterministic (fixed ids and timestamps), so running the script twice gives the
same bytes. Files of the current format are named `v{FORMAT_VERSION}_*.bin`; files of older
formats are frozen data: never regenerate or delete them (tests decode them through the
registered migrations). `--check` compares instead of writing and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgpack
from pydantic import BaseModel

from steerable.protocol import (
    AgentError,
    AgentSpec,
    ApprovalDecision,
    AskUser,
    CallStatus,
    CancelRequest,
    CapabilitySnapshot,
    Checkpoint,
    Compatibility,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    ForkOrigin,
    Phase,
    Plan,
    PlannedCall,
    RetryPolicy,
    RunConfig,
    RunEvent,
    RunMetrics,
    RunSnapshot,
    RunState,
    SideEffect,
    SteeringMode,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    TranscriptEntry,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol.codec import (
    FORMAT_VERSION,
    encode,
)

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints"

RUN_ID = "run_01JDQ8W2K5ABCDEFGHJKMNPQRS"
PARENT_FORK_ID = "run_01JDQ7000000000000000000AA"
CHILD_RUN_ID = "run_01JDQ8W3000000000000000CHD"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_732_867_200.0  # 2024-11-29T08:00:00Z
V = FORMAT_VERSION


def _idem(call: str) -> str:
    return f"idem_{call.replace('.', '_'):0>32}"


def build_entries() -> tuple[TranscriptEntry, ...]:
    """The transcript of the full checkpoint: every entry kind and every decision kind."""
    usage = Usage(input_tokens=1200, output_tokens=80)
    return (
        UserMessage(seq=0, content="Find the three cheapest flights to Lisbon", at=T0 + 1.0),
        DecisionEntry(
            model_call=1,
            decision=Plan(
                steps=(
                    ToolCall(
                        name="search", arguments={"query": "flights LIS", "limit": 3}, id="c1.0"
                    ),
                    SubagentCall(
                        agent="summarizer", task="Summarise the fares", max_steps=5, id="c1.1"
                    ),
                ),
                usage=usage,
                thought="search, then summarise",
            ),
        ),
        ToolResult(
            call_id="c1.0",
            tool="search",
            ok=True,
            value={"flights": [{"id": "F1", "price": 99.5}, {"id": "F2", "price": 120}]},
            attempts=2,
            duration=1.25,
        ),
        SubagentResult(
            call_id="c1.1",
            agent="summarizer",
            child_run_id=CHILD_RUN_ID,
            state=RunState.FINISHED,
            ok=True,
            output="F1 is cheapest.",
        ),
        UserMessage(seq=1, content="Only direct flights", mode=SteeringMode.INTERRUPT, at=T0 + 9.5),
        DecisionEntry(model_call=2, decision=AskUser(question="Which date?", usage=usage)),
        UserMessage(seq=2, content="Friday", at=T0 + 20.0),
        DecisionEntry(
            model_call=3, decision=Finish(output={"answer": "F1", "price": 99.5}, usage=usage)
        ),
        SystemNote(
            text="Finish rejected: the answer ignores 'only direct flights'",
            data={"check": "accept", "model_call": 3},
        ),
        DecisionEntry(
            model_call=4,
            decision=Plan(
                steps=(
                    ToolCall(
                        name="write_file", arguments={"path": "out.md", "text": "F1"}, id="c4.0"
                    ),
                    ToolCall(name="charge", arguments={"amount_cents": 9950}, id="c4.1"),
                    ToolCall(name="search", arguments={"query": "direct LIS"}, id="c4.2"),
                    ToolCall(name="search", arguments={"query": "direct LIS friday"}, id="c4.3"),
                    SubagentCall(agent="summarizer", task="Summarise direct fares", id="c4.4"),
                ),
                usage=usage,
            ),
        ),
        ToolResult(
            call_id="c4.2",
            tool="search",
            ok=False,
            error=AgentError.of(
                ErrorCode.TIMEOUT, "search took longer than 30.0 s", tool="search", timeout=30.0
            ),
            attempts=3,
            duration=90.0,
        ),
    )


def build_snapshot() -> RunSnapshot:
    """A run parked on an approval, mid-plan, forked from another run."""
    entries = build_entries()
    tools = [
        ToolSpec(name="search", description="Search fares", json_schema={"type": "object"}),
        ToolSpec(
            name="write_file",
            side_effect=SideEffect.WRITE,
            requires_approval=True,
            timeout=10.0,
        ),
        ToolSpec(name="charge", side_effect=SideEffect.IDEMPOTENT, honors_idempotency_key=True),
    ]
    agents = [AgentSpec(name="travel", version="2"), AgentSpec(name="summarizer")]

    def call(index: int, name: str, status: CallStatus, **kw: object) -> PlannedCall:
        cid = f"c4.{index}"
        return PlannedCall.model_validate(
            {
                "call_id": cid,
                "kind": kw.pop("kind", "tool"),
                "name": name,
                "idempotency_key": _idem(cid),
                "status": status,
                **kw,
            }
        )

    return RunSnapshot(
        run_id=RUN_ID,
        revision=6,
        trace_id=TRACE_ID,
        session_id="sess-42",
        task_id="task-7",
        forked_from=ForkOrigin(run_id=PARENT_FORK_ID, revision=2),
        task="Book the cheapest direct flight to Lisbon",
        agent="travel",
        state=RunState.WAITING,
        waiting_for=WaitingFor.APPROVAL,
        config=RunConfig(
            max_steps=20,
            total_timeout=600.0,
            token_budget=100_000,
            retry=RetryPolicy(max_retries=3, backoff=0.5, jitter=False),
            steering=SteeringMode.INTERRUPT,
        ),
        capabilities=CapabilitySnapshot.of(tools, agents),
        compatibility=Compatibility(
            task_version="3",
            policy="default",
            profile="travel-v2",
            input_artifacts={"brief.md": "sha256:5f1e0c"},
        ),
        model_calls=4,
        steps=4,
        usage=Usage(input_tokens=4800, output_tokens=320),
        decisions=4,
        transcript_len=len(entries),
        last_seq=5,
        delivered_seq=2,
        pending_messages=(
            UserMessage(seq=3, content="Window seat please", at=T0 + 40.0),
            ApprovalDecision(seq=4, call_id="c4.0", approved=True, reason="ok", at=T0 + 41.0),
            CancelRequest(seq=5, reason="user closed the tab", at=T0 + 42.0),
        ),
        plan=(
            call(0, "write_file", CallStatus.AWAITING_APPROVAL, arguments={"path": "out.md"}),
            call(1, "charge", CallStatus.RUNNING, attempts=1),
            call(2, "search", CallStatus.DONE, attempts=3),
            call(3, "search", CallStatus.PENDING),
            call(
                4,
                "summarizer",
                CallStatus.RUNNING,
                kind="subagent",
                attempts=1,
                child_run_id=CHILD_RUN_ID,
            ),
        ),
        errors=(
            AgentError.of(ErrorCode.TIMEOUT, "search took longer than 30.0 s", tool="search"),
            AgentError.of(ErrorCode.HOOK_ERROR, "on_start hook raised KeyError", hook="on_start"),
            AgentError.of(
                ErrorCode.TOOL_CRASHED,
                "tool 'render' crashed: the worker process was killed by SIGXCPU",
                tool="render",
                signal="SIGXCPU",
                signal_number=24,
                cpu_seconds=30,
            ),
        ),
        metrics=RunMetrics(
            steps=4,
            model_calls=4,
            input_tokens=4800,
            output_tokens=320,
            retries=3,
            tool_errors=1,
            messages_delivered=3,
            checkpoints=6,
            phase_seconds={"reason": 2.5, "execute": 91.25},
        ),
        deadline_left=512.5,
        created_at=T0,
        updated_at=T0 + 42.5,
    )


def build_records() -> dict[str, BaseModel]:
    """The records of the current format's good fixtures, by file name."""
    snapshot = build_snapshot()
    entries = build_entries()
    plan = tuple(
        c.model_copy(update={"status": CallStatus.DONE}) if c.call_id == "c4.1" else c
        for c in snapshot.plan
    )
    delta_snapshot = snapshot.model_copy(
        update={
            "revision": 7,
            "state": RunState.RUNNING,
            "waiting_for": None,
            "plan": plan,
            "transcript_len": len(entries) + 2,
            "updated_at": T0 + 45.0,
        }
    )
    delta = Checkpoint(
        snapshot=RunSnapshot.model_validate(delta_snapshot.model_dump()),
        entries_from=len(entries),
        entries=(
            ToolResult(call_id="c4.1", tool="charge", ok=True, value={"charged": 9950}),
            SystemNote(text="Resumed after a restart", data={"from_revision": 6}),
        ),
    )
    return {
        f"v{V}_checkpoint_full.bin": Checkpoint(snapshot=snapshot, entries=entries),
        f"v{V}_checkpoint_delta.bin": delta,
        f"v{V}_host_message.bin": ApprovalDecision(
            seq=4, call_id="c4.0", approved=False, reason="not on a Friday", at=T0 + 41.0
        ),
        f"v{V}_event.bin": RunEvent(
            run_id=RUN_ID,
            trace_id=TRACE_ID,
            seq=17,
            kind=EventKind.TOOL_FINISHED,
            phase=Phase.EXECUTE,
            at=T0 + 30.0,
            data={"call_id": "c4.2", "tool": "search", "ok": False, "code": "timeout"},
        ),
    }


GOOD_FIXTURES: dict[str, str] = {
    f"v{V}_checkpoint_full.bin": "a full Checkpoint (entries_from 0): a forked run waiting for "
    "an approval, plan calls in every status, pending user/approval/cancel messages, errors, "
    "and transcript entries of every kind (user, plan/ask_user/finish decisions, tool results "
    "ok and failed, subagent result, system note)",
    f"v{V}_checkpoint_delta.bin": "the next revision: the snapshot plus only the 2 entries "
    "added since (entries_from > 0)",
    f"v{V}_host_message.bin": "an ApprovalDecision (kind host_message)",
    f"v{V}_event.bin": "a RunEvent (kind event)",
}

BAD_FIXTURES: dict[str, tuple[ErrorCode, str]] = {
    "bad_future_version.bin": (
        ErrorCode.CHECKPOINT_INCOMPATIBLE,
        "the full checkpoint with format_version FORMAT_VERSION + 1; the message says to "
        "upgrade steerable",
    ),
    "bad_missing_version.bin": (
        ErrorCode.CHECKPOINT_CORRUPT,
        'the magic, then ["checkpoint", body] without a format_version',
    ),
    "bad_truncated.bin": (ErrorCode.CHECKPOINT_CORRUPT, "the first half of the full checkpoint"),
    "bad_foreign_magic.bin": (
        ErrorCode.CHECKPOINT_CORRUPT,
        "the full checkpoint behind a zip file's magic (PK\\x03\\x04)",
    ),
    "bad_bitflip.bin": (
        ErrorCode.CHECKPOINT_CORRUPT,
        "the full checkpoint with one bit flipped in the snapshot's state ('w`iting'): "
        "well-formed msgpack whose body does not validate",
    ),
    "bad_not_msgpack.bin": (
        ErrorCode.CHECKPOINT_CORRUPT,
        "the magic followed by bytes that are not msgpack (0xc1 is never used)",
    ),
}


def _flip_state_bit(full: bytes) -> bytes:
    marker = b"\xa5state\xa7waiting"
    at = full.index(marker) + len(b"\xa5state\xa7w")  # the snapshot's state comes first
    flipped = bytearray(full)
    flipped[at] ^= 0x01  # 'a' -> '`'
    return bytes(flipped)


def build_fixtures() -> dict[str, bytes]:
    """Every fixture file's bytes by name (README.md included)."""
    records = build_records()
    files = {name: encode(record) for name, record in records.items()}
    full = files[f"v{V}_checkpoint_full.bin"]
    body = records[f"v{V}_checkpoint_full.bin"].model_dump(mode="json")
    files["bad_future_version.bin"] = b"STRB" + msgpack.packb([V + 1, "checkpoint", body])
    files["bad_missing_version.bin"] = b"STRB" + msgpack.packb(["checkpoint", body])
    files["bad_truncated.bin"] = full[: len(full) // 2]
    files["bad_foreign_magic.bin"] = b"PK\x03\x04" + full[4:]
    files["bad_bitflip.bin"] = _flip_state_bit(full)
    files["bad_not_msgpack.bin"] = b"STRB\xc1 this is not msgpack"
    files["README.md"] = _readme().encode()
    return files


def _readme() -> str:
    lines = [
        "# Golden codec fixtures",
        "",
        "Generated by `python scripts/make_fixtures.py` (deterministic: fixed ids and",
        "timestamps); do not edit. Format reference: docs/checkpoint-format.md.",
        "",
        f"Files named `v{V}_*` are the current format (FORMAT_VERSION = {V}). Files of older",
        "formats are frozen: never regenerate or delete them; they must keep decoding through",
        "the registered migrations (R24).",
        "",
        "| File | Content | Decoding must |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{name}` | {text} | return the record `build_records()` builds |"
        for name, text in GOOD_FIXTURES.items()
    ]
    lines += [
        f"| `{name}` | {text} | raise `SteerableError` with code `{code}` |"
        for name, (code, text) in BAD_FIXTURES.items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with --check, compare) the fixtures; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    out: Path = args.out
    stale = []
    for name, data in build_fixtures().items():
        path = out / name
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(name)
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    if stale:
        print(f"fixtures differ from the generator: {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
