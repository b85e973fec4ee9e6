"""Dead letters: the table's schema, its rows, and the topic alternative."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema

from daemon.kafka._decode import DeadRecord, Fetch, header_name, headers_json, record_timestamps
from daemon.schema import parse_schema

__all__ = ["DEAD_LETTER_COLUMNS", "dead_letter_batch", "dead_letter_headers", "dead_letter_schema"]

#: The dead-letter table's columns (the table is created on first start).
DEAD_LETTER_COLUMNS: list[dict[str, object]] = [
    {"name": "topic", "type": "string", "required": True},
    {"name": "partition", "type": "int", "required": True},
    {"name": "offset", "type": "long", "required": True},
    {"name": "timestamp", "type": "timestamptz"},
    {"name": "key", "type": "binary"},
    {"name": "value", "type": "binary"},
    {"name": "headers", "type": "string", "doc": "JSON list of [name, base64 value]"},
    {"name": "target_table", "type": "string", "doc": "the table the record was meant for"},
    {"name": "reason", "type": "string", "required": True},
    {"name": "error", "type": "string", "required": True},
    {"name": "dead_lettered_at", "type": "timestamptz", "required": True},
]


def dead_letter_schema() -> Schema:
    return parse_schema(DEAD_LETTER_COLUMNS)


def dead_letter_batch(
    fetch: Fetch,
    dead: Sequence[tuple[DeadRecord, str | None]],
    schema: pa.Schema,
) -> pa.RecordBatch:
    """Rows for ``dead`` (record, intended table) in fetch order."""
    rows = np.asarray([d.index for d, _ in dead], dtype=np.int64)
    view = fetch.take(rows)
    now = int(time.time() * 1_000_000)
    columns = {
        "topic": pa.array([fetch.topic] * len(rows), pa.string()),
        "partition": pa.array(np.full(len(rows), fetch.partition, np.int32)),
        "offset": pa.array(view.offsets),
        "timestamp": record_timestamps(view.timestamps),
        "key": view.keys.cast(pa.binary()),
        "value": view.values.cast(pa.binary()),
        "headers": pa.array([headers_json(h) for h in view.headers], pa.string()),
        "target_table": pa.array([t for _, t in dead], pa.string()),
        "reason": pa.array([d.reason for d, _ in dead], pa.string()),
        "error": pa.array([d.error for d, _ in dead], pa.string()),
        "dead_lettered_at": pa.array(np.full(len(rows), now, np.int64), pa.timestamp("us", "UTC")),
    }
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def dead_letter_headers(
    fetch: Fetch, record: DeadRecord, target: str | None
) -> list[tuple[str, bytes]]:
    """Headers of a record re-published to a dead-letter topic: the original ones
    plus where it came from and why it failed."""
    original = [(header_name(k), v) for k, v in fetch.headers[record.index]]
    return [
        *original,
        ("icespool.topic", fetch.topic.encode()),
        ("icespool.partition", str(fetch.partition).encode()),
        ("icespool.offset", str(int(fetch.offsets[record.index])).encode()),
        ("icespool.reason", record.reason.encode()),
        ("icespool.error", record.error.encode()),
        ("icespool.target_table", (target or "").encode()),
    ]
