"""The codec of every persisted record: a versioned msgpack envelope (R24) that never stores a
secret in clear (R26).

A record is `b"STRB"` followed by one msgpack array `[format_version, kind, body]`: `kind` names
the record type (see `_KINDS`) and `body` is the record's JSON-mode shape (field names and plain
values, as `model_dump(mode="json")` gives them), so that any language can read it. Decoding
never guesses: bytes that are not a well-formed envelope of a known kind raise
`checkpoint_corrupt`, a newer format raises `checkpoint_incompatible`, and an older format is
migrated by registered migrations or rejected with a hint. docs/checkpoint-format.md is the
reference; tests/fixtures/checkpoints holds golden files of every version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, get_args

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import SchemaSerializer, to_jsonable_python

from ._capabilities import AgentSpec, CapabilitySnapshot, ToolSpec
from ._checkpoint import Checkpoint, Compatibility, ForkOrigin, PlannedCall, RunSnapshot
from ._config import RetryPolicy, RunConfig
from ._decisions import Decision, PlanStep, Usage
from ._errors import AgentError, ErrorCode, SteerableError
from ._events import RunEvent
from ._messages import ApprovalRequest, HostMessage, TranscriptEntry
from ._outcome import RunMetrics, RunOutcome
from ._redaction import SECRET_TYPES as _SECRET_TYPES
from ._redaction import _redact, _secret_ref, redact
from ._shape import first_shape_error
from ._storable import MAX_MESSAGE_BYTES, MAX_VALUE_BYTES, MAX_VALUE_DEPTH, check_storable

__all__ = [
    "FORMAT_HISTORY",
    "FORMAT_VERSION",
    "MAX_MESSAGE_BYTES",
    "MAX_VALUE_BYTES",
    "MAX_VALUE_DEPTH",
    "check_storable",
    "decode",
    "decode_body",
    "encode",
    "encode_bodies",
    "encode_body",
    "redact",
    "register_migration",
]

FORMAT_VERSION: Final = 4
"""The format this steerable writes. Monotonic: bump it for any change an older reader cannot
read (a new, renamed or removed field, a new kind), add a line to `FORMAT_HISTORY`, register a
migration from the previous version and keep the old golden fixtures (R24)."""

FORMAT_HISTORY: dict[int, str] = {
    1: "initial format: b'STRB' + msgpack [format_version, kind, body]; body is the record's "
    "JSON-mode shape; secrets are stored as 'secret:sha256:<16 hex>' references",
    2: "SubagentResult gains child_revision (the child's final revision, -1 if unknown) and "
    "RunSnapshot gains model_retries (0); format 1 bodies migrate unchanged (defaults apply)",
    3: "ToolCall and SubagentCall gain id (the call id, None if unrecorded), ToolSpec gains "
    "argument_descriptions ({}), ErrorCode gains provider_error, EventKind model_delta and custom; "
    "format 2 bodies migrate unchanged (defaults apply)",
    4: "ErrorCode gains tool_crashed (an isolated tool's worker died); format 3 bodies migrate "
    "unchanged",
}
"""One line per format version: what changed (mirrored in docs/checkpoint-format.md)."""

MAGIC: Final = b"STRB"
"""The 4 bytes every record starts with."""

_MASK: Final = b"**********"
"""What pydantic's JSON mode prints instead of a non-empty secret."""
_KIND_REPR_LIMIT: Final = 40
_SHAPE_CHECK_BYTES: Final = 1024
"""Records longer than this have their keys walked before pydantic validates them: a crafted
record of many unknown keys or empty items would make pydantic build one error each. A shorter
one costs at most a few milliseconds to refuse, and the walk would double its decoding time."""

# kind -> model class, or annotated union of models. Every record exported by
# steerable.protocol has a kind, so that any of them can be persisted on its own.
_KINDS: Final[dict[str, Any]] = {
    "checkpoint": Checkpoint,
    "snapshot": RunSnapshot,
    # Before "entry": a UserMessage encoded without an explicit kind is a host message.
    "host_message": HostMessage,
    "entry": TranscriptEntry,
    "event": RunEvent,
    "outcome": RunOutcome,
    "config": RunConfig,
    "error": AgentError,
    "decision": Decision,
    "plan_step": PlanStep,
    "approval_request": ApprovalRequest,
    "planned_call": PlannedCall,
    "capabilities": CapabilitySnapshot,
    "compatibility": Compatibility,
    "fork_origin": ForkOrigin,
    "tool_spec": ToolSpec,
    "agent_spec": AgentSpec,
    "retry_policy": RetryPolicy,
    "usage": Usage,
    "metrics": RunMetrics,
}


def _members(tp: Any) -> tuple[type[BaseModel], ...]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return (tp,)
    union, *_ = get_args(tp)  # Annotated[A | B, Field(discriminator=...)]
    return tuple(get_args(union))


_MEMBERS: Final = {kind: _members(tp) for kind, tp in _KINDS.items()}
_KIND_OF: Final[dict[type[BaseModel], str]] = {}
for _kind, _types in _MEMBERS.items():
    for _tp in _types:
        _KIND_OF.setdefault(_tp, _kind)

_ADAPTERS: dict[str, TypeAdapter[Any]] = {}
_MIGRATIONS: dict[int, Callable[[str, Any], Any]] = {}


# -- encoding ------------------------------------------------------------------------------------


_SERIALIZERS: dict[type[BaseModel], SchemaSerializer] = {}


def _serializer_of(cls: type[BaseModel]) -> SchemaSerializer:
    """`cls.__pydantic_serializer__`, looked up once per class: a class attribute read goes
    through pydantic's metaclass `__getattr__` hook (~0.2 µs), a dict lookup does not."""
    serializer = _SERIALIZERS.get(cls)
    if serializer is None:
        serializer = _SERIALIZERS[cls] = cls.__pydantic_serializer__
    return serializer


def encode(record: BaseModel, *, kind: str | None = None) -> bytes:
    """Encode a protocol record as one envelope.

    Args:
        record: A protocol record (Checkpoint, RunSnapshot, a transcript entry, ...).
        kind: The record kind; inferred from the record's type when None. A UserMessage is a
            "host_message" unless `kind="entry"` is given.

    Returns:
        `b"STRB"` + msgpack `[FORMAT_VERSION, kind, body]`; secrets become references (R26).

    Raises:
        ValueError: The record has no kind (or not the given one), holds a value msgpack cannot
            carry (an int outside 64 bits, an unknown type), or encodes to more than
            `MAX_MESSAGE_BYTES`.
    """
    kind = _kind_for(record, kind)
    serializer = _serializer_of(type(record))
    try:
        data = _pack(kind, serializer.to_python(record, mode="json"))
        if _MASK in data:
            # R26: JSON mode masks secrets as "**********"; store a reference instead, so that
            # equal secrets stay recognisable without being readable. Rare, hence the re-encode.
            data = _pack(kind, _plain_with_secret_refs(record))
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"cannot encode {type(record).__name__} as {kind!r}: {exc}") from exc
    return _checked_size(kind, data)


def encode_body(kind: str, body: Any) -> bytes:
    """Encode a body that is already in a record's JSON-mode shape (the runtime's fast path).

    The body is not validated: it must be what `model_dump(mode="json")` of a `kind` record gives
    (dict keys are strings; tuples may stay tuples). A pydantic model or secret found inside is
    converted as `encode` would convert it.

    Raises:
        ValueError: Unknown kind, a value msgpack cannot carry, or more than `MAX_MESSAGE_BYTES`.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown record kind {kind!r}; known kinds: {sorted(_KINDS)}")
    try:
        data = _pack(kind, body)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"cannot encode a {kind!r} body: {exc}") from exc
    return _checked_size(kind, data)


_HEADS: dict[str, bytes] = {}
_packers = threading.local()
_KEEP_PACKER_BYTES = 64 * 1024
"""A thread's packer that packed a larger body is dropped (a packer's buffer only grows)."""


def encode_bodies(kind: str, bodies: Iterable[Any]) -> Iterator[bytes | ValueError]:
    """`encode_body` of each of many bodies of one kind, with one packer for all (a store's
    batch of events): for each body the same bytes, or the `ValueError` it would raise.

    Raises:
        ValueError: Unknown kind.
    """
    head = _HEADS.get(kind)
    if head is None:
        if kind not in _KINDS:
            raise ValueError(f"unknown record kind {kind!r}; known kinds: {sorted(_KINDS)}")
        # `[FORMAT_VERSION, kind, body]` packed: a 3-element array header, then two values.
        head = _HEADS[kind] = MAGIC + b"\x93" + msgpack.packb(FORMAT_VERSION) + msgpack.packb(kind)
    # One packer per thread (a Packer and its buffer cost ~0.3 µs to make): it resets after
    # each `pack`, and after a refused body below, so calls that interleave share it safely.
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, default=_msgpack_default)
    for body in bodies:
        try:
            data = head + packer.pack(body)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            packer.reset()
            yield ValueError(f"cannot encode a {kind!r} body: {exc}")
            continue
        if len(data) > _KEEP_PACKER_BYTES:
            _packers.packer = None  # its buffer grew for this body: the thread keeps none
        try:
            yield _checked_size(kind, data)
        except ValueError as exc:
            yield exc


def _kind_for(record: object, kind: str | None) -> str:
    if not isinstance(record, BaseModel):
        raise ValueError(
            f"encode() takes a protocol record, not {type(record).__name__}; "
            "use encode_body(kind, body) for plain data"
        )
    if kind is None:
        found = _KIND_OF.get(type(record))
        if found is None:
            raise ValueError(f"{type(record).__name__} is not a record kind the codec knows")
        return found
    if kind not in _KINDS:
        raise ValueError(f"unknown record kind {kind!r}; known kinds: {sorted(_KINDS)}")
    if type(record) not in _MEMBERS[kind]:
        raise ValueError(f"a {type(record).__name__} is not a {kind!r} record")
    return kind


def _pack(kind: str, body: Any) -> bytes:
    packed: bytes = msgpack.packb(
        [FORMAT_VERSION, kind, body], use_bin_type=True, default=_msgpack_default
    )
    return MAGIC + packed


def _msgpack_default(value: Any) -> Any:
    # Called by msgpack for what it cannot pack itself; never reached on the common path.
    if isinstance(value, _SECRET_TYPES):
        return _secret_ref(value)
    if isinstance(value, BaseModel):
        return _plain_with_secret_refs(value)
    return to_jsonable_python(_redact(value), inf_nan_mode="constants")


def _plain_with_secret_refs(record: BaseModel) -> Any:
    # Python mode keeps secrets as Secret objects (JSON mode masks them); refs replace them
    # before the JSON-mode conversion of everything else.
    python = _serializer_of(type(record)).to_python(record)
    return to_jsonable_python(_redact(python), inf_nan_mode="constants")


def _checked_size(kind: str, data: bytes) -> bytes:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(
            f"a {kind!r} record of {len(data)} bytes exceeds MAX_MESSAGE_BYTES "
            f"({MAX_MESSAGE_BYTES}); store large values as artifacts and keep references"
        )
    return data


# -- secrets (R26) -------------------------------------------------------------------------------


# -- decoding ------------------------------------------------------------------------------------


def decode(data: bytes | bytearray | memoryview, *, kind: str | None = None) -> Any:
    """Decode and validate one envelope.

    Args:
        data: The bytes `encode` or `encode_body` wrote (bytes, bytearray or memoryview).
        kind: The expected kind; a record of another kind is rejected as foreign.

    Returns:
        The validated record (for a union kind such as "entry", the member model).

    Raises:
        SteerableError: `checkpoint_corrupt` for anything that is not a well-formed envelope of
            a known kind whose body validates, or a foreign kind; `checkpoint_incompatible`
            for a newer format, or an older one no registered migration reaches. Nothing else.
        ValueError: `kind` is not a kind the codec knows (a caller bug, not bad bytes).
    """
    found, body = decode_body(data, kind=kind)
    if len(data) > _SHAPE_CHECK_BYTES:
        problem = first_shape_error(_MEMBERS[found], body)
        if problem is not None:  # before pydantic, which would build an error per bad key
            raise _corrupt(f"the {found!r} record does not validate: {problem}")
    adapter = _ADAPTERS.get(found)
    if adapter is None:
        adapter = _ADAPTERS.setdefault(found, TypeAdapter(_KINDS[found]))
    try:
        return adapter.validate_python(body)
    except ValidationError as exc:
        raise _corrupt(f"the {found!r} record does not validate: {_summary(exc)}") from exc
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        raise _corrupt(f"the {found!r} record does not validate: {exc}") from exc


def decode_body(
    data: bytes | bytearray | memoryview, *, kind: str | None = None
) -> tuple[str, Any]:
    """Open an envelope and migrate its body to `FORMAT_VERSION`, without validating it.

    For callers that validate lazily (e.g. transcript entries loaded for a later revision).

    Returns:
        `(kind, body)` with body in the current format's JSON-mode shape.

    Raises:
        SteerableError: As `decode`, except that a body that would not validate is returned.
        ValueError: `kind` is not a kind the codec knows.
    """
    if kind is not None and kind not in _KINDS:
        raise ValueError(f"unknown record kind {kind!r}; known kinds: {sorted(_KINDS)}")
    version, found, body = _open(data)
    if kind is not None and found != kind:
        raise _corrupt(
            f"foreign record: expected kind {kind!r}, found kind {found!r}",
            expected=kind,
            found=found,
        )
    if version < FORMAT_VERSION:
        body = _migrate(version, found, body)
    return found, body


def _open(data: object) -> tuple[int, str, Any]:
    buf = _as_bytes(data)
    try:
        top = msgpack.unpackb(
            memoryview(buf)[len(MAGIC) :],
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            # Bounded by the input: a length prefix can never make us allocate more than it.
            max_str_len=len(buf),
            max_bin_len=len(buf),
            max_array_len=len(buf),
            max_map_len=len(buf) // 2,
            max_ext_len=0,  # ext types (timestamps included) are never written: reject them
        )
    except msgpack.ExtraData:
        raise _corrupt("trailing bytes after the record (truncated or concatenated?)") from None
    except (
        msgpack.UnpackException,
        ValueError,
        TypeError,
        OverflowError,
        RecursionError,
        MemoryError,
    ) as exc:
        detail = str(exc) or type(exc).__name__
        if "max_ext_len" in detail:
            detail = "msgpack ext types, timestamps included, are not part of the format"
        raise _corrupt(f"not well-formed msgpack after the magic ({detail})") from None
    if not isinstance(top, list) or not top:
        raise _corrupt("the envelope is not an array [format_version, kind, body]")
    version = top[0]
    if type(version) is not int:
        raise _corrupt(f"missing or non-integer format_version (found {type(version).__name__})")
    _check_version(version)
    if len(top) != 3:
        raise _corrupt(f"the envelope has {len(top)} items, expected [format_version, kind, body]")
    kind = top[1]
    if not isinstance(kind, str) or kind not in _KINDS:
        shown = repr(kind)[:_KIND_REPR_LIMIT]
        raise _corrupt(f"unknown record kind {shown}; known kinds: {sorted(_KINDS)}")
    return version, kind, top[2]


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        buf = data
    elif isinstance(data, bytearray | memoryview):
        buf = bytes(data)
    else:
        raise _corrupt(f"expected bytes, got {type(data).__name__}")
    if len(buf) > MAX_MESSAGE_BYTES:
        raise _corrupt(
            f"{len(buf)} bytes is more than MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES}): "
            "not a record this steerable wrote"
        )
    if len(buf) <= len(MAGIC):
        what = "empty input" if not buf else f"{len(buf)} bytes"
        raise _corrupt(f"{what}: too short to be a steerable record")
    if buf[: len(MAGIC)] != MAGIC:
        raise _corrupt(
            f"not a steerable record: starts with {buf[: len(MAGIC)]!r}, expected {MAGIC!r} "
            "(foreign or damaged bytes)"
        )
    return buf


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code}: ext types are not part of the format")


def _check_version(version: int) -> None:
    if version > FORMAT_VERSION:
        raise _incompatible(
            f"written by a newer steerable (format {version} > {FORMAT_VERSION}); "
            "upgrade steerable to read it",
            format_version=version,
            supported=FORMAT_VERSION,
        )
    if version < 0:
        raise _corrupt(f"format_version {version} is negative")


def _migrate(version: int, kind: str, body: Any) -> Any:
    missing = [v for v in range(version, FORMAT_VERSION) if v not in _MIGRATIONS]
    if missing:
        oldest = missing[-1] + 1
        raise _incompatible(
            f"written by an older steerable (format {version} < {FORMAT_VERSION}) and no "
            f"migration from format {missing[-1]} is registered; this steerable reads formats "
            f"{oldest} to {FORMAT_VERSION}: open it with the steerable release that wrote it "
            "(finish or export the run there), or start a new run",
            format_version=version,
            supported=FORMAT_VERSION,
            oldest_readable=oldest,
        )
    for v in range(version, FORMAT_VERSION):
        try:
            body = _MIGRATIONS[v](kind, body)
        except Exception as exc:  # R24: whatever a migration trips on is one error code
            raise _corrupt(
                f"migrating the {kind!r} record from format {v} to {v + 1} failed: "
                f"{type(exc).__name__}: {exc}",
                format_version=version,
            ) from exc
    return body


def register_migration(from_version: int, fn: Callable[[str, Any], Any]) -> None:
    """Register the migration of bodies from format `from_version` to `from_version + 1` (R24).

    Args:
        from_version: A format older than `FORMAT_VERSION`.
        fn: `fn(kind, body) -> body`: takes a plain body of format `from_version` and returns
            it in format `from_version + 1`. It must not rename kinds; it may raise to reject a
            body it cannot migrate (decode then reports `checkpoint_corrupt`).

    Raises:
        ValueError: `from_version` is not an older format, or already has a migration.
    """
    if type(from_version) is not int or not 0 <= from_version < FORMAT_VERSION:
        raise ValueError(
            f"from_version must be an int in [0, {FORMAT_VERSION}), got {from_version!r}"
        )
    if not callable(fn):
        raise ValueError(f"a migration must be callable, got {type(fn).__name__}")
    if from_version in _MIGRATIONS:
        raise ValueError(f"a migration from format {from_version} is already registered")
    _MIGRATIONS[from_version] = fn


def _summary(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "<root>"
    return f"{len(errors)} error(s), first at {where}: {first['msg']}"


def _corrupt(message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.CHECKPOINT_CORRUPT, message, **details))


def _incompatible(message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.CHECKPOINT_INCOMPATIBLE, message, **details))


def _from_format_1(kind: str, body: Any) -> Any:
    # Format 2 only added SubagentResult.child_revision and RunSnapshot.model_retries, whose
    # defaults a format 1 body takes on validation: nothing to rewrite.
    del kind
    return body


register_migration(1, _from_format_1)


def _from_format_2(kind: str, body: Any) -> Any:
    # Format 3 only added fields with defaults (ToolCall.id, SubagentCall.id,
    # ToolSpec.argument_descriptions) and enum values no format 2 body holds. A format 2
    # decision's steps keep id None: their results' call ids are positional (`c<decision>.<i>`,
    # see docs/models.md), which the model adapters' mappings fall back to.
    del kind
    return body


def _from_format_3(kind: str, body: Any) -> Any:
    # Format 4 only added an error code, which no format 3 body can hold: nothing to rewrite.
    del kind
    return body


register_migration(2, _from_format_2)
register_migration(3, _from_format_3)
