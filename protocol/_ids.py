"""Identities (R3): the host owns session and task ids; the runtime owns run ids and revisions.

Run ids sort by creation time (a 48-bit millisecond timestamp, then 80 random bits, in
Crockford base32, as ULIDs do), so `steerable runs` lists newest last without an index.
"""

from __future__ import annotations

import hashlib
import os
import random
import time

__all__ = ["call_id", "idempotency_key", "new_run_id", "new_trace_id"]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


# Two digits per lookup: a run id's 26 digits in 13 steps, where a loop of divmods over single
# digits cost tens of microseconds per start().
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_SHIFTS = tuple(range(120, -1, -10))


def _ulid_digits(millis: int, entropy: int) -> str:
    """`millis` in 10 Crockford base32 digits, then `entropy` in 16 (130 bits, top two zero)."""
    value = millis << 80 | entropy
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


# Ids must be unique, not secret: a generator seeded from the OS once per process (and again
# in a forked child) instead of one getrandom() system call per id.
_random = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(32)))


def new_run_id() -> str:
    """A new, time-sortable run id such as `run_01JH5...` (26 base32 digits after the prefix)."""
    millis = time.time_ns() // 1_000_000
    entropy = _random.getrandbits(80)
    return "run_" + _ulid_digits(millis, entropy)


def new_trace_id() -> str:
    """A new W3C-compatible trace id: 32 lower-case hex digits."""
    return f"{_random.getrandbits(128):032x}"


def call_id(decision: int, index: int) -> str:
    """The id of step `index` of the plan made by decision number `decision` (both from 1/0)."""
    return f"c{decision}.{index}"


def idempotency_key(run_id: str, call: str) -> str:
    """The idempotency key of one call (R4): distinct per call, the same on every re-dispatch.

    Derived from the run id and the call id, never from the session or run id alone, since one
    run may legitimately make several writes with the same tool. A forked run has a new run id
    and therefore new keys: re-executing a side effect is a new, explicitly authorised write.
    """
    digest = hashlib.sha256(f"{run_id}/{call}".encode()).hexdigest()
    return "idem_" + digest[:32]
