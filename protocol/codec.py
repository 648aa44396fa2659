"""The msgpack codec of steerable's persisted records (R24, R26).

`encode`/`decode` turn protocol records into versioned envelopes and back; `register_migration`
adds a migration from an older format; `redact` replaces secrets by references;
`check_storable` says whether a value can be stored at all. See
docs/checkpoint-format.md.
"""

from ._codec import (
    FORMAT_HISTORY,
    FORMAT_VERSION,
    MAX_MESSAGE_BYTES,
    MAX_VALUE_BYTES,
    MAX_VALUE_DEPTH,
    check_storable,
    decode,
    decode_body,
    encode,
    encode_body,
    redact,
    register_migration,
)

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
    "encode_body",
    "redact",
    "register_migration",
]
