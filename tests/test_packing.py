"""`actors/_engine/packing.py`: a thread's reused packer gives `msgpack.packb`'s bytes and
errors, keeps nothing of a failed call, and keeps no large buffer."""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from steerable.actors._engine import packing
from steerable.actors._engine.packing import packb

_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(_json_like)
def test_same_bytes_as_packb(value: Any) -> None:
    assert packb(value) == msgpack.packb(value, use_bin_type=True)


@pytest.mark.parametrize(
    ("bad", "error"),
    [({"a": [1, object()]}, TypeError), ({"n": 2**70}, OverflowError), ("\ud800", UnicodeError)],
)
def test_a_refused_value_raises_as_packb_and_leaves_nothing_behind(
    bad: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        msgpack.packb({"before": "x" * 100, "bad": bad}, use_bin_type=True)
    with pytest.raises(error):
        packb({"before": "x" * 100, "bad": bad})
    assert packb({"after": 1}) == msgpack.packb({"after": 1}, use_bin_type=True)


def test_a_large_value_does_not_leave_its_buffer_with_the_thread() -> None:
    packb({"small": 1})
    kept = packing._local.packer
    packb({"small": 2})
    assert packing._local.packer is kept  # reused
    big = packb(["x" * 1000] * 100)  # > 64 KiB
    assert big == msgpack.packb(["x" * 1000] * 100, use_bin_type=True)
    assert not hasattr(packing._local, "packer")  # dropped: the next call makes a small one
    packb({"small": 3})
    assert packing._local.packer is not kept


def test_each_thread_packs_with_its_own_packer() -> None:
    values = [{"thread": i, "items": list(range(i * 10))} for i in range(8)]
    barrier = threading.Barrier(len(values))
    results: dict[int, list[bytes]] = {}

    def work(i: int) -> None:
        barrier.wait()
        results[i] = [packb(values[i]) for _ in range(200)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(values))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i, value in enumerate(values):
        assert set(results[i]) == {msgpack.packb(value, use_bin_type=True)}
