"""The benchmark's 8-column event: its table declaration, ndjson bodies and Arrow batches.

Every event is one JSON object of about 163 bytes (the size DESIGN.md's reference points
were measured with)::

    {"event_id":..,"ts":"2024-05-01T..Z","kind":..,"user":..,"value":..,"count":..,
     "ok":..,"payload":..}
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.json as pj

__all__ = [
    "COLUMNS",
    "JSON_SCHEMA",
    "decode_body",
    "ndjson_body",
]

#: The ``schema`` of the ``[[tables]]`` entry, as the daemon's config declares it.
COLUMNS: list[dict[str, object]] = [
    {"name": "event_id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "kind", "type": "string"},
    {"name": "user", "type": "string"},
    {"name": "value", "type": "double"},
    {"name": "count", "type": "int"},
    {"name": "ok", "type": "boolean"},
    {"name": "payload", "type": "string"},
]

#: What ``pyarrow.json`` decodes the bodies to (the table's Arrow types, no field ids).
JSON_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.int64(), nullable=False),
        ("ts", pa.timestamp("us", "UTC")),
        ("kind", pa.string()),
        ("user", pa.string()),
        ("value", pa.float64()),
        ("count", pa.int32()),
        ("ok", pa.bool_()),
        ("payload", pa.string()),
    ]
)

_KINDS = ("click", "view", "buy", "scroll")
_BASE_SECONDS = 1_714_566_896  # 2024-05-01T12:34:56Z


def _event(i: int) -> dict[str, object]:
    seconds = _BASE_SECONDS + i // 1000
    hh, rest = divmod(seconds % 86400, 3600)
    mm, ss = divmod(rest, 60)
    return {
        "event_id": i,
        "ts": f"2024-05-01T{hh:02d}:{mm:02d}:{ss:02d}.{(i * 7919) % 1_000_000:06d}Z",
        "kind": _KINDS[i % len(_KINDS)],
        "user": f"user-{(i * 31) % 50_000:05d}",
        "value": round((i % 10_000) * 0.731, 3),
        "count": i % 1000,
        "ok": i % 3 != 0,
        "payload": f"p{i:09d}-abcdefghi-{i % 97:02d}",
    }


def ndjson_body(rows: int, seed: int) -> bytes:
    """``rows`` events, one JSON object per line, ids starting at ``seed * rows``."""
    base = seed * rows
    lines = [json.dumps(_event(i), separators=(",", ":")) for i in range(base, base + rows)]
    return ("\n".join(lines) + "\n").encode()


def decode_body(body: bytes) -> pa.Table:
    """The bare-limit decode: the whole body at once with ``pyarrow.json``."""
    return pj.read_json(
        io.BytesIO(body),
        parse_options=pj.ParseOptions(explicit_schema=JSON_SCHEMA),
    )
