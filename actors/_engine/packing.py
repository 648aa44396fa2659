"""`msgpack.packb` without making a packer per call, for the hot paths that pack plain data.

`msgpack.packb(obj)` builds a `Packer` and its 256 KiB buffer each time: about a quarter of a
microsecond, as much as packing a small dict costs (docs/performance.md, "Wave 4: session
12"). Each thread keeps one packer here instead; a packer resets its buffer after every `pack`,
also when packing raises, so a failed call leaves nothing behind for the next. A packer's buffer
only grows, so one that packed more than `_KEEP_BYTES` is dropped: a thread keeps at most that.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

__all__ = ["packb"]

_local = threading.local()
_BUFFER = 4096
"""The buffer a thread's packer starts with (it grows as a value needs)."""
_KEEP_BYTES = 64 * 1024
"""A packer whose buffer grew past this is not kept."""


def packb(obj: Any) -> bytes:
    """`msgpack.packb(obj, use_bin_type=True)`: the same bytes, and the same errors.

    No `default`: nothing runs Python code inside the packer, so no call can re-enter it.
    """
    try:
        packer: msgpack.Packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, buf_size=_BUFFER)
    try:
        data: bytes = packer.pack(obj)
    except BaseException:
        del _local.packer  # its buffer may have grown before the value was refused
        raise
    if len(data) > _KEEP_BYTES:
        del _local.packer
    return data
