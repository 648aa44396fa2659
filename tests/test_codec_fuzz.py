"""Hostile bytes never get past `decode` as anything but `SteerableError` (R24).

Random bytes, truncations, bit flips, random msgpack behind the magic, nesting and
length-prefix bombs: decode returns a valid record or raises `SteerableError` with
`checkpoint_corrupt` / `checkpoint_incompatible`; no other exception escapes, and no input
takes long.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from steerable.protocol import (
    ErrorCode,
    SteerableError,
)
from steerable.protocol._codec import _KINDS
from steerable.protocol.codec import (
    FORMAT_VERSION,
    decode,
    decode_body,
    encode,
)

ROOT = Path(__file__).resolve().parent.parent
MAGIC = b"STRB"
CODES = {ErrorCode.CHECKPOINT_CORRUPT, ErrorCode.CHECKPOINT_INCOMPATIBLE}
SLOW_DECODE_SECONDS = 2.0  # generous: a decode of these inputs takes well under 10 ms


def _valid_records() -> dict[str, BaseModel]:
    path = ROOT / "scripts" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records: dict[str, BaseModel] = module.build_records()
    return records


VALID = {name: encode(record) for name, record in _valid_records().items()}
SMALL = [data for data in VALID.values() if len(data) < 512]
KINDS = sorted(_KINDS)


def check(data: Any, *, kind: str | None = None) -> BaseModel | None:
    """Decode `data`; return the record, or None when it was rejected with a codec code."""
    started = time.perf_counter()
    error: SteerableError | None = None
    try:
        record = decode(data, kind=kind)
    except SteerableError as exc:
        error = exc
    assert time.perf_counter() - started < SLOW_DECODE_SECONDS
    if error is not None:
        assert error.code in CODES, error
        assert error.error.message
        return None
    assert isinstance(record, BaseModel)
    return record


def check_corrupt(data: bytes) -> None:
    with pytest.raises(SteerableError) as info:
        decode(data)
    assert info.value.code is ErrorCode.CHECKPOINT_CORRUPT


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    check(data)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_behind_the_magic(data: bytes) -> None:
    check(MAGIC + data)


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_truncation_of_a_valid_record_is_corrupt(name: str) -> None:
    data = VALID[name]
    for length in range(len(data)):
        check_corrupt(data[:length])


@pytest.mark.parametrize("data", SMALL, ids=lambda d: f"{len(d)}B")
def test_every_single_bit_flip_of_a_small_record(data: bytes) -> None:
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        check(bytes(flipped))


@FUZZ
@given(st.sampled_from(sorted(VALID)), st.data())
def test_single_bit_flips(name: str, data: st.DataObject) -> None:
    encoded = bytearray(VALID[name])
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    check(bytes(encoded))


@FUZZ
@given(st.sampled_from(sorted(VALID)), st.data())
def test_multiple_bit_flips_and_byte_overwrites(name: str, data: st.DataObject) -> None:
    encoded = bytearray(VALID[name])
    positions = st.integers(min_value=0, max_value=len(encoded) - 1)
    for at, mask in data.draw(
        st.lists(st.tuples(positions, st.integers(1, 255)), min_size=1, max_size=8)
    ):
        encoded[at] ^= mask
    check(bytes(encoded))


MSGPACK: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | st.sampled_from(KINDS),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@FUZZ
@given(MSGPACK)
def test_valid_msgpack_of_random_structures_behind_the_magic(value: Any) -> None:
    check(MAGIC + msgpack.packb(value))


@FUZZ
@given(
    st.integers(min_value=-2, max_value=FORMAT_VERSION + 2) | MSGPACK,
    st.sampled_from(KINDS) | MSGPACK,
    MSGPACK,
    st.sampled_from(KINDS) | st.none(),
)
def test_random_envelopes(version: Any, kind: Any, body: Any, expected: str | None) -> None:
    check(MAGIC + msgpack.packb([version, kind, body]), kind=expected)


@FUZZ
@given(st.sampled_from(sorted(VALID)), st.data())
def test_valid_bodies_with_one_field_replaced_by_random_data(
    name: str, data: st.DataObject
) -> None:
    kind, body = decode_body(VALID[name])
    node = body
    # Walk down a random path of dicts and lists, then replace what is there.
    for _ in range(data.draw(st.integers(min_value=0, max_value=6))):
        children = list(node) if isinstance(node, dict) else list(range(len(node)))
        child = data.draw(st.sampled_from(children)) if children else None
        if child is None or not isinstance(node[child], dict | list) or not node[child]:
            break
        node = node[child]
    if isinstance(node, dict) and node:
        node[data.draw(st.sampled_from(sorted(node)))] = data.draw(MSGPACK)
    elif isinstance(node, list) and node:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(MSGPACK)
    check(MAGIC + msgpack.packb([FORMAT_VERSION, kind, body]))


@pytest.mark.parametrize("depth", [100, 1_000, 1_025, 10_000, 1_000_000])
def test_deeply_nested_arrays_and_maps(depth: int) -> None:
    check(MAGIC + b"\x91" * depth + b"\xc0")
    check(MAGIC + b"\x81\xa1a" * depth + b"\xc0")
    # The same bomb inside a well-formed envelope, as the value of a SystemNote's data.
    prefix = b"\x93" + msgpack.packb(FORMAT_VERSION) + msgpack.packb("entry")
    prefix += b"\x83" + msgpack.packb("kind") + msgpack.packb("system")
    prefix += msgpack.packb("text") + msgpack.packb("t") + msgpack.packb("data") + b"\x81\xa1d"
    record = check(MAGIC + prefix + b"\x91" * depth + b"\xc0")
    assert record is None or depth < 1_025


@pytest.mark.parametrize(
    "header",
    [
        b"\xdd\xff\xff\xff\xff",  # array32 of 4G items
        b"\xdf\xff\xff\xff\xff",  # map32 of 4G pairs
        b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
        b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
        b"\xdc\xff\xff",  # array16 of 64K items
    ],
)
def test_length_prefix_bombs_fail_fast_without_allocating(header: bytes) -> None:
    check_corrupt(MAGIC + header)
    check_corrupt(MAGIC + header + bytes(64))
    check_corrupt(MAGIC + b"\x93\x01\xa5entry" + header + bytes(64))


def test_every_ext_type_is_rejected() -> None:
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    envelope = b"\x93" + msgpack.packb(FORMAT_VERSION) + msgpack.packb("entry")
    for code in (-128, -1, 0, 1, 127):  # -1 is msgpack's timestamp
        for size in (1, 2, 4, 8, 12, 16, 3, 300):
            if size in fixext:
                header = bytes([fixext[size], code & 0xFF])
            else:
                header = bytes([0xC7, size, code & 0xFF]) if size < 256 else b""
                header = header or b"\xc8" + size.to_bytes(2, "big") + bytes([code & 0xFF])
            check_corrupt(MAGIC + envelope + header + bytes(size))
