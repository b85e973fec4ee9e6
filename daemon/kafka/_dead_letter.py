"""Dead letters: the table's schema, its rows, a summary of them, and the topic
alternative."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from icespool.decode import DeadRecord, header_name, headers_json
from icespool.kafka._fetch import Fetch, record_timestamps
from icespool.schema import parse_schema

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "DeadLetterGroup",
    "dead_letter_batch",
    "dead_letter_headers",
    "dead_letter_schema",
    "summarize_dead_letters",
]

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


@dataclass(frozen=True, slots=True)
class DeadLetterGroup:
    """The dead letters meant for ``target_table`` (None: no route) with ``reason``:
    how many, and when the first and the last of them were dead-lettered."""

    target_table: str | None
    reason: str
    count: int
    first: datetime
    last: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "target_table": self.target_table,
            "reason": self.reason,
            "count": self.count,
            "first": self.first.isoformat(),
            "last": self.last.isoformat(),
        }


_KEYS = ["target_table", "reason"]
_AGGREGATES = [("reason", "count"), ("dead_lettered_at", "min"), ("dead_lettered_at", "max")]


def summarize_dead_letters(table: Table, row_filter: BooleanExpression) -> list[DeadLetterGroup]:
    """The rows of the dead-letter ``table`` that ``row_filter`` selects, by target table
    and reason (blocking). Three narrow columns are read, batch by batch: a table of
    millions of dead letters is summed without holding their values."""
    scan = table.scan(row_filter=row_filter, selected_fields=(*_KEYS, "dead_lettered_at"))
    partials: list[pa.Table] = []
    for batch in scan.to_arrow_batch_reader():
        if batch.num_rows:
            rows = pa.Table.from_batches([batch])
            partials.append(rows.group_by(_KEYS, use_threads=False).aggregate(_AGGREGATES))
    if not partials:
        return []
    merged = (
        pa.concat_tables(partials)
        .group_by(_KEYS, use_threads=False)
        .aggregate(
            [
                ("reason_count", "sum"),
                ("dead_lettered_at_min", "min"),
                ("dead_lettered_at_max", "max"),
            ]
        )
    )
    groups = [
        DeadLetterGroup(
            row["target_table"],
            row["reason"],
            row["reason_count_sum"],
            row["dead_lettered_at_min_min"],
            row["dead_lettered_at_max_max"],
        )
        for row in merged.to_pylist()
    ]
    return sorted(groups, key=lambda g: (g.target_table or "", g.reason))
