"""The codec (R24, R26): envelope, kinds, versions and migrations, secrets, golden fixtures."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import pytest
from pydantic import BaseModel, Secret, SecretBytes, SecretStr

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    CallStatus,
    Checkpoint,
    DecisionEntry,
    ErrorCode,
    Finish,
    Plan,
    RunConfig,
    RunEvent,
    RunSnapshot,
    SteerableError,
    SystemNote,
    ToolCall,
    ToolResult,
    UserMessage,
    _codec,
)
from steerable.protocol.codec import (
    FORMAT_HISTORY,
    FORMAT_VERSION,
    MAX_MESSAGE_BYTES,
    decode,
    decode_body,
    encode,
    encode_body,
    redact,
    register_migration,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
DOC = ROOT / "docs" / "checkpoint-format.md"
MAGIC = b"STRB"
SECRET = "hunter2-correct-horse-battery"
REF = re.compile(r"^secret:sha256:[0-9a-f]{16}$")


def _load_fixture_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_fixtures", ROOT / "scripts/make_fixtures.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_fixtures = _load_fixture_script()


def _envelope(*items: Any) -> bytes:
    packed: bytes = msgpack.packb(list(items))
    return MAGIC + packed


def _raises(code: ErrorCode, data: Any, kind: str | None = None) -> SteerableError:
    with pytest.raises(SteerableError) as info:
        decode(data, kind=kind)
    assert info.value.code is code, info.value
    return info.value


def _ref(raw: bytes) -> str:
    return "secret:sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def _note(text: str = "hi") -> SystemNote:
    return SystemNote(text=text, data={"n": 1})


# -- envelope and kinds --------------------------------------------------------------------------


def test_envelope_is_magic_then_one_msgpack_array_of_version_kind_body() -> None:
    record = UserMessage(seq=3, content="go on")
    data = encode(record)
    assert data[:4] == MAGIC
    assert data[4] == 0x93  # a fixarray of 3 items
    assert msgpack.unpackb(data[4:]) == [
        FORMAT_VERSION,
        "host_message",
        record.model_dump(mode="json"),
    ]


def test_body_is_the_json_mode_shape_tuples_as_arrays_enums_as_strings() -> None:
    record = DecisionEntry(model_call=1, decision=Plan(steps=(ToolCall(name="t"),)))
    kind, body = decode_body(encode(record))
    assert kind == "entry"
    assert body == {
        "kind": "decision",
        "model_call": 1,
        "decision": {
            "kind": "plan",
            "steps": [{"kind": "tool", "name": "t", "arguments": {}, "id": None}],
            "usage": {"input_tokens": 0, "output_tokens": 0},
            "thought": "",
        },
    }


def test_non_json_values_in_any_fields_take_their_json_mode_form() -> None:
    when = dt.datetime(2024, 11, 29, 8, 0, tzinfo=dt.UTC)
    record = ToolResult(call_id="c", tool="t", ok=True, value={1: when, "t": (1, 2)})
    assert decode(encode(record)).value == {"1": "2024-11-29T08:00:00Z", "t": [1, 2]}


def test_infinity_inside_any_values_survives() -> None:
    record = ToolResult(call_id="c", tool="t", ok=True, value={"x": float("inf")})
    assert decode(encode(record)) == record


def test_infinity_in_typed_float_fields_survives() -> None:
    record = RunConfig(step_timeout=float("inf"), total_timeout=float("inf"))
    assert decode(encode(record)) == record


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        (Checkpoint(snapshot=make_fixtures.build_snapshot()), "checkpoint"),
        (make_fixtures.build_snapshot(), "snapshot"),
        (UserMessage(seq=0, content="x"), "host_message"),
        (ApprovalDecision(seq=1, call_id="c", approved=True), "host_message"),
        (_note(), "entry"),
        (ToolResult(call_id="c", tool="t", ok=True), "entry"),
        (RunConfig(), "config"),
        (AgentError.of(ErrorCode.TIMEOUT, "slow"), "error"),
        (Finish(), "decision"),
        (ToolCall(name="t"), "plan_step"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_kind_is_inferred_from_the_record_type(record: BaseModel, kind: str) -> None:
    assert decode_body(encode(record))[0] == kind
    assert decode(encode(record), kind=kind) == record


def test_a_user_message_may_be_encoded_as_a_transcript_entry() -> None:
    record = UserMessage(seq=0, content="x")
    assert decode(encode(record, kind="entry"), kind="entry") == record


def test_union_kinds_decode_to_the_member_model() -> None:
    decoded = decode(encode(ToolResult(call_id="c", tool="t", ok=False)))
    assert type(decoded) is ToolResult


@pytest.mark.parametrize(
    ("record", "kind", "match"),
    [
        (ToolResult(call_id="c", tool="t", ok=True), "host_message", "is not a 'host_message'"),
        (RunConfig(), "nope", "unknown record kind"),
        ({"a": 1}, None, "takes a protocol record"),
        (dt.date(2024, 1, 1), None, "takes a protocol record"),
    ],
)
def test_encode_refuses_a_record_that_is_not_of_its_kind(
    record: Any, kind: str | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        encode(record, kind=kind)


def test_encode_refuses_a_model_without_a_kind() -> None:
    class Foreign(BaseModel):
        x: int = 1

    with pytest.raises(ValueError, match="not a record kind"):
        encode(Foreign())


@pytest.mark.parametrize(
    "value",
    [object(), 2**64, -(2**63) - 1],
    ids=["object", "int-too-big", "int-too-small"],
)
def test_encode_refuses_values_msgpack_cannot_carry(value: Any) -> None:
    with pytest.raises(ValueError, match="cannot encode"):
        encode(ToolResult(call_id="c", tool="t", ok=True, value=value))
    with pytest.raises(ValueError, match="cannot encode"):
        encode_body("entry", {"value": value})


def test_encode_refuses_more_than_max_message_bytes() -> None:
    big = ToolResult(call_id="c", tool="t", ok=True, value="x" * MAX_MESSAGE_BYTES)
    with pytest.raises(ValueError, match="MAX_MESSAGE_BYTES"):
        encode(big)


def test_encode_body_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown record kind"):
        encode_body("nope", {})


def test_encode_body_converts_models_tuples_and_secrets_inside_the_body() -> None:
    body = {
        "kind": "system",
        "text": "t",
        "data": {
            "error": AgentError.of(ErrorCode.TIMEOUT, "slow"),
            "pair": (1, 2),
            "k": SecretStr(SECRET),
        },
    }
    data = encode_body("entry", body)
    assert SECRET.encode() not in data
    note = decode(data)
    assert note.data["error"] == AgentError.of(ErrorCode.TIMEOUT, "slow").model_dump(mode="json")
    assert note.data["pair"] == [1, 2]
    assert note.data["k"] == _ref(SECRET.encode())


def test_encode_bodies_gives_encode_bodys_bytes_or_its_error_for_each_body() -> None:
    bodies: list[Any] = [
        {"seq": 0, "data": {"pair": (1, 2), "k": SecretStr(SECRET)}},
        {"value": object()},  # refused: the next body still encodes
        {"error": AgentError.of(ErrorCode.TIMEOUT, "slow")},
        {"big": "x" * MAX_MESSAGE_BYTES},
        {"seq": 3, "text": "é" * 40},
    ]
    out = list(_codec.encode_bodies("entry", bodies))
    assert len(out) == len(bodies)
    for body, got in zip(bodies, out, strict=True):
        try:
            expected: bytes | str = encode_body("entry", body)
        except ValueError as exc:
            expected = str(exc).split(":")[0]
        if isinstance(got, ValueError):
            assert str(got).split(":")[0] == expected
        else:
            assert got == expected
    assert [type(x) for x in out] == [bytes, ValueError, bytes, ValueError, bytes]
    with pytest.raises(ValueError, match="unknown record kind"):
        list(_codec.encode_bodies("nope", [{}]))


# -- decoding ------------------------------------------------------------------------------------


def test_decode_rejects_a_foreign_kind() -> None:
    error = _raises(ErrorCode.CHECKPOINT_CORRUPT, encode(RunConfig()), kind="checkpoint")
    assert "foreign record" in error.error.message
    assert error.error.details == {"expected": "checkpoint", "found": "config"}


def test_decode_with_an_unknown_expected_kind_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="unknown record kind"):
        decode(encode(RunConfig()), kind="nope")


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = encode(_note())
    assert decode(bytearray(data)) == _note()
    assert decode(memoryview(data)) == _note()


@pytest.mark.parametrize("data", ["STRB", None, 42, [1, 2]], ids=repr)
def test_decode_rejects_what_is_not_bytes(data: Any) -> None:
    assert "expected bytes" in _raises(ErrorCode.CHECKPOINT_CORRUPT, data).error.message


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "empty input"),
        (MAGIC, "too short"),
        (b"PK\x03\x04\x93\x01", "not a steerable record"),
        (MAGIC + b"\xc1", "not well-formed msgpack"),
        (MAGIC + b"\x93\x01", "not well-formed msgpack"),
        (_envelope(1, "entry", {}) + b"\x00", "trailing bytes"),
        (MAGIC + msgpack.packb({"format_version": 1}), "not an array"),
        (MAGIC + msgpack.packb([]), "not an array"),
        (_envelope("entry", {}), "missing or non-integer format_version"),
        (_envelope(True, "entry", {}), "missing or non-integer format_version"),
        (_envelope(1.0, "entry", {}), "missing or non-integer format_version"),
        (_envelope(None, "entry", {}), "missing or non-integer format_version"),
        (_envelope(-1, "entry", {}), "negative"),
        (_envelope(FORMAT_VERSION, "entry"), "has 2 items"),
        (_envelope(FORMAT_VERSION, "entry", {}, 4), "has 4 items"),
        (_envelope(FORMAT_VERSION, 7, {}), "unknown record kind"),
        (_envelope(FORMAT_VERSION, "x" * 1000, {}), "unknown record kind"),
        (_envelope(FORMAT_VERSION, "entry", {"kind": "nope"}), "does not validate"),
        (_envelope(FORMAT_VERSION, "entry", []), "does not validate"),
        (_envelope(FORMAT_VERSION, "config", {"max_steps": -1}), "does not validate"),
        (_envelope(FORMAT_VERSION, "entry", {"kind": "system", "text": "t", "extra": 1}), "extra"),
        (MAGIC + msgpack.packb([1, "entry", msgpack.ExtType(3, b"x")]), "ext types"),
        (MAGIC + msgpack.packb([1, "entry", msgpack.Timestamp(1, 0)]), "timestamps included"),
        (MAGIC + msgpack.packb([1, "entry", {1: 2}]), "not allowed for map key"),
        (MAGIC + b"\x93\x01\xa5entr\xff\xc0", "not well-formed msgpack"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_decode_reports_bad_bytes_as_corrupt_with_a_clear_message(data: bytes, words: str) -> None:
    message = _raises(ErrorCode.CHECKPOINT_CORRUPT, data).error.message
    assert words in message


def test_decode_rejects_more_than_max_message_bytes_before_parsing() -> None:
    data = MAGIC + bytes(MAX_MESSAGE_BYTES)
    assert "MAX_MESSAGE_BYTES" in _raises(ErrorCode.CHECKPOINT_CORRUPT, data).error.message


def test_decode_body_returns_the_plain_body_without_validating_it() -> None:
    assert decode_body(_envelope(FORMAT_VERSION, "entry", {"kind": "nope"})) == (
        "entry",
        {"kind": "nope"},
    )


# -- versions and migrations (R24) ---------------------------------------------------------------


def test_format_history_has_one_line_per_version() -> None:
    assert sorted(FORMAT_HISTORY) == list(range(1, FORMAT_VERSION + 1))
    for line in FORMAT_HISTORY.values():
        assert line.strip()
        assert "\n" not in line


def test_docs_mirror_the_format_history() -> None:
    text = DOC.read_text()
    for version, line in FORMAT_HISTORY.items():
        assert f"| {version} | {line} |" in text, (
            f"docs/checkpoint-format.md lacks version {version}"
        )


def test_a_newer_format_is_incompatible_with_an_upgrade_hint() -> None:
    newer = FORMAT_VERSION + 1
    error = _raises(ErrorCode.CHECKPOINT_INCOMPATIBLE, _envelope(newer, "checkpoint", {}))
    assert error.error.message == (
        f"written by a newer steerable (format {newer} > {FORMAT_VERSION}); "
        "upgrade steerable to read it"
    )
    assert error.error.details == {"format_version": newer, "supported": FORMAT_VERSION}


@pytest.mark.parametrize(
    "data",
    [
        _envelope(FORMAT_VERSION + 1),
        _envelope(FORMAT_VERSION + 1, "a-kind-not-invented-yet", {}, b"crc"),
        _envelope(2**40, None),
    ],
)
def test_a_newer_format_is_incompatible_whatever_its_envelope_looks_like(data: bytes) -> None:
    _raises(ErrorCode.CHECKPOINT_INCOMPATIBLE, data)


def test_an_older_format_without_migration_is_incompatible_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    error = _raises(
        ErrorCode.CHECKPOINT_INCOMPATIBLE, _envelope(0, "entry", {"kind": "system", "text": "t"})
    )
    assert "written by an older steerable (format 0" in error.error.message
    assert "release that wrote it" in error.error.message
    assert error.error.details["oldest_readable"] == FORMAT_VERSION


def test_an_older_format_is_migrated_by_its_registered_migration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    monkeypatch.setattr(_codec, "FORMAT_VERSION", 1)  # the mechanism, on a synthetic format 0
    seen: list[tuple[str, Any]] = []

    def message_to_text(kind: str, body: Any) -> Any:  # synthetic format 0 said "message"
        seen.append((kind, dict(body)))
        if body.get("kind") != "system":
            return body
        migrated = dict(body)
        migrated["text"] = migrated.pop("message")
        return migrated

    register_migration(0, message_to_text)
    old = _envelope(0, "entry", {"kind": "system", "message": "hello"})
    assert decode(old) == SystemNote(text="hello")
    assert decode_body(old) == ("entry", {"kind": "system", "text": "hello"})
    assert seen[0] == ("entry", {"kind": "system", "message": "hello"})


def test_migrations_chain_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    monkeypatch.setattr(_codec, "FORMAT_VERSION", 3)

    def appending(version: int) -> Callable[[str, Any], Any]:
        def migrate(kind: str, body: Any) -> Any:
            return {**body, "text": body["text"] + str(version)}

        return migrate

    for version in (0, 1, 2):
        register_migration(version, appending(version))
    assert decode(_envelope(0, "entry", {"kind": "system", "text": "x"})) == SystemNote(text="x012")
    assert decode(_envelope(2, "entry", {"kind": "system", "text": "x"})) == SystemNote(text="x2")
    assert decode(encode(_note()))  # writes format 3, read without migrating
    assert msgpack.unpackb(encode(_note())[4:])[0] == 3


def test_a_gap_in_the_migration_chain_names_the_oldest_readable_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    monkeypatch.setattr(_codec, "FORMAT_VERSION", 3)
    register_migration(0, lambda kind, body: body)
    register_migration(2, lambda kind, body: body)
    error = _raises(
        ErrorCode.CHECKPOINT_INCOMPATIBLE, _envelope(0, "entry", {"kind": "system", "text": "x"})
    )
    assert "no migration from format 1" in error.error.message
    assert error.error.details["oldest_readable"] == 2
    assert decode(_envelope(2, "entry", {"kind": "system", "text": "x"})) == SystemNote(text="x")


def test_a_failing_migration_reports_corrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    monkeypatch.setattr(_codec, "FORMAT_VERSION", 1)

    def broken(kind: str, body: Any) -> Any:
        return body["missing"]

    register_migration(0, broken)
    error = _raises(ErrorCode.CHECKPOINT_CORRUPT, _envelope(0, "entry", {}))
    assert "migrating the 'entry' record from format 0 to 1 failed: KeyError" in error.error.message


@pytest.mark.parametrize("version", [FORMAT_VERSION, FORMAT_VERSION + 1, -1, True, "0"])
def test_register_migration_accepts_only_older_formats(
    monkeypatch: pytest.MonkeyPatch, version: Any
) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    with pytest.raises(ValueError, match="from_version"):
        register_migration(version, lambda kind, body: body)


def test_register_migration_refuses_a_second_migration_of_a_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_codec, "_MIGRATIONS", {})
    register_migration(0, lambda kind, body: body)
    with pytest.raises(ValueError, match="already registered"):
        register_migration(0, lambda kind, body: body)
    with pytest.raises(ValueError, match="callable"):
        register_migration(0, "not a function")  # type: ignore[arg-type]


def test_the_built_in_migrations_reach_the_current_format() -> None:
    # Format 1 -> 2 added SubagentResult.child_revision; every older format has a migration.
    assert sorted(_codec._MIGRATIONS) == list(range(1, FORMAT_VERSION))
    assert _codec._MIGRATIONS[1]("entry", {"kind": "system", "text": "t"}) == {
        "kind": "system",
        "text": "t",
    }


# -- secrets (R26) -------------------------------------------------------------------------------


class Credentials(BaseModel):
    user: str
    token: SecretStr
    key: SecretBytes


def _credentials() -> Credentials:
    return Credentials(
        user="ann", token=SecretStr(SECRET), key=SecretBytes(b"k3y-" + SECRET.encode())
    )


def test_secrets_in_a_tool_result_are_never_encoded_in_clear() -> None:
    record = ToolResult(
        call_id="c1.0",
        tool="login",
        ok=True,
        value={"creds": _credentials(), "bare": SecretStr(SECRET), "list": [SecretStr(SECRET)]},
    )
    data = encode(record)
    assert SECRET.encode() not in data
    assert b"**********" not in data
    value = decode(data).value
    assert value["creds"] == {
        "user": "ann",
        "token": _ref(SECRET.encode()),
        "key": _ref(b"k3y-" + SECRET.encode()),
    }
    assert value["bare"] == value["list"][0] == _ref(SECRET.encode())


def test_secrets_in_error_details_are_never_encoded_in_clear() -> None:
    error = AgentError.of(
        ErrorCode.HANDLER_ERROR, "login failed", password=SecretStr(SECRET), creds=_credentials()
    )
    record = ToolResult(call_id="c", tool="login", ok=False, error=error)
    for data in (
        encode(error),
        encode(record),
        encode(Checkpoint(snapshot=make_fixtures.build_snapshot(), entries=(record,))),
    ):
        assert SECRET.encode() not in data
        assert _ref(SECRET.encode()).encode() in data


def test_a_generic_pydantic_secret_is_a_reference_too() -> None:
    data = encode(ToolResult(call_id="c", tool="t", ok=True, value=Secret[int](31337)))
    assert decode(data).value == _ref(b"31337")


def test_a_masked_looking_string_that_is_not_a_secret_is_kept() -> None:
    record = ToolResult(call_id="c", tool="t", ok=True, value="password: **********")
    assert decode(encode(record)) == record


def test_redact_replaces_every_secret_by_its_reference() -> None:
    ref = _ref(SECRET.encode())
    value = {
        "a": [1, SecretStr(SECRET), ("x", SecretStr(SECRET))],
        SecretStr(SECRET): {"nested": {SecretBytes(SECRET.encode())}},
        "model": _credentials(),
        "frozen": frozenset({SecretStr(SECRET)}),
    }
    assert redact(value) == {
        "a": [1, ref, ("x", ref)],
        ref: {"nested": {ref}},
        "model": {"user": "ann", "token": ref, "key": _ref(b"k3y-" + SECRET.encode())},
        "frozen": frozenset({ref}),
    }
    assert REF.match(ref)


def test_redact_returns_the_same_object_when_there_is_no_secret() -> None:
    value = {"a": [1, 2.0, ("x", None)], "m": RunConfig(), "s": {"b"}}
    assert redact(value) is value
    config = RunConfig()
    assert redact(config) is config


def test_redact_is_idempotent_and_equal_secrets_share_a_reference() -> None:
    once = redact([SecretStr(SECRET), SecretStr(SECRET), SecretStr("other")])
    assert redact(once) is once
    assert once[0] == once[1] != once[2]


def test_an_empty_secret_is_a_reference_too() -> None:
    assert redact(SecretStr("")) == _ref(b"")


# -- golden fixtures -----------------------------------------------------------------------------

GOOD: list[str] = list(make_fixtures.GOOD_FIXTURES)
BAD: dict[str, tuple[ErrorCode, str]] = make_fixtures.BAD_FIXTURES
RECORDS: dict[str, BaseModel] = make_fixtures.build_records()


@pytest.mark.parametrize("name", GOOD)
def test_golden_fixture_decodes_to_the_record_the_script_builds(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    assert decode(data) == RECORDS[name]
    assert encode(RECORDS[name]) == data, "the format changed: bump FORMAT_VERSION (see docs)"


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_fixture_raises_its_code(name: str) -> None:
    code, _ = BAD[name]
    _raises(code, (FIXTURES / name).read_bytes())


def test_the_full_checkpoint_fixture_covers_every_entry_decision_and_call_status() -> None:
    full = decode(
        (FIXTURES / f"v{FORMAT_VERSION}_checkpoint_full.bin").read_bytes(), kind="checkpoint"
    )
    assert isinstance(full, Checkpoint)
    assert full.entries_from == 0
    assert {e.kind for e in full.entries} == {
        "user",
        "decision",
        "tool_result",
        "subagent_result",
        "system",
    }
    assert {e.decision.kind for e in full.entries if isinstance(e, DecisionEntry)} == {
        "plan",
        "ask_user",
        "finish",
    }
    assert {c.status for c in full.snapshot.plan} == set(CallStatus)
    assert {m.kind for m in full.snapshot.pending_messages} == {"user", "approval", "cancel"}
    assert full.snapshot.errors
    assert full.snapshot.transcript_len == len(full.entries)
    delta = decode(
        (FIXTURES / f"v{FORMAT_VERSION}_checkpoint_delta.bin").read_bytes(), kind="checkpoint"
    )
    assert delta.entries_from == len(full.entries)
    assert delta.snapshot.transcript_len == delta.entries_from + len(delta.entries)


def test_the_fixture_script_is_deterministic_and_the_committed_fixtures_are_current(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert make_fixtures.main(["--out", str(first)]) == 0
    assert make_fixtures.main(["--out", str(second)]) == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        generated = (first / name).read_bytes()
        assert generated == (second / name).read_bytes(), name
        assert generated == (FIXTURES / name).read_bytes(), (
            f"{name} is stale: run scripts/make_fixtures.py"
        )
    assert make_fixtures.main(["--check", "--out", str(FIXTURES)]) == 0


def test_every_fixture_file_is_described() -> None:
    generated = set(make_fixtures.build_fixtures())
    for path in FIXTURES.iterdir():
        frozen = re.fullmatch(r"v(\d+)_.*\.bin", path.name)
        if path.name not in generated:
            # A fixture of an older format is frozen data: it must still decode (R24).
            assert frozen, f"unknown fixture {path.name}: add it to scripts/make_fixtures.py"
            assert int(frozen.group(1)) < FORMAT_VERSION, path.name
            decode(path.read_bytes())


def test_a_run_snapshot_body_uses_the_model_field_names() -> None:
    snapshot = make_fixtures.build_snapshot()
    kind, body = decode_body(encode(snapshot))
    assert kind == "snapshot"
    assert list(body) == list(RunSnapshot.model_fields)
    assert body["state"] == "waiting"


def test_events_round_trip() -> None:
    event = RECORDS[f"v{FORMAT_VERSION}_event.bin"]
    assert isinstance(event, RunEvent)
    assert decode(encode(event), kind="event") == event
