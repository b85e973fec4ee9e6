"""One partition's fetch batch -> Arrow batches per table, plus the records that failed.

The values of a whole fetch batch are joined with newlines and decoded by ONE
``decode_ndjson`` call (pyarrow.json with the table's schema): no per-record dicts.
Only when that call fails is the batch split in halves, recursively, until every
bad record stands alone; the good halves go on. A few bad records cost a few
logarithmic rounds, not a per-record pass.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.json as pj

from daemon.decode import JsonOptions, RecordError, decode_ndjson_lenient
from daemon.nesting import DEFAULT_MAX_DEPTH, too_deep, too_deep_lines
from daemon.schema import conform

__all__ = [
    "DeadRecord",
    "Decoded",
    "Fetch",
    "decode_json",
    "decode_raw",
    "header_name",
    "headers_json",
    "record_timestamps",
    "route_values",
    "too_deep_values",
    "with_metadata_fields",
]

# A line (value) that does not start with "{": one C-speed scan of the joined body.
_NOT_AN_OBJECT = re.compile(rb"(?:\A|\n)[ \t\r]*(?:[^ \t\r\n{]|\n|\Z)")
_UNSAFE = re.compile(rb"}(?:[ \t\r]*\{|[ \t\r\n]*null)")


@dataclass(slots=True)
class Fetch:
    """The records of one partition from one poll, in offset order."""

    topic: str
    partition: int
    offsets: npt.NDArray[np.int64]
    values: list[bytes | None]
    keys: list[bytes | None]
    timestamps: list[int]  # ms since the epoch
    headers: list[Sequence[tuple[str, bytes]]]

    def take(self, rows: npt.NDArray[np.int64]) -> Fetch:
        pick = rows.tolist()
        return Fetch(
            self.topic,
            self.partition,
            self.offsets[rows],
            [self.values[i] for i in pick],
            [self.keys[i] for i in pick],
            [self.timestamps[i] for i in pick],
            [self.headers[i] for i in pick],
        )


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """A record that goes to the dead-letter destination instead of its table."""

    index: int  # position in the fetch
    # short label for metrics: invalid, oversized, empty, unknown_route, table_limit,
    # too_deep, bad_utf8, out_of_range, unparseable
    reason: str
    error: str
    column: str | None = None  # the column at fault, when one is


@dataclass(slots=True)
class Decoded:
    batch: pa.RecordBatch | None
    rows: npt.NDArray[np.int64]  # fetch positions of the batch's rows, ascending
    dead: list[DeadRecord] = field(default_factory=list)


# Years 1-9999 in ms (see daemon.value_ranges): what a timestamptz column holds.
_FIRST_MS, _LAST_MS = -62_135_596_800_000, 253_402_300_799_999


def record_timestamps(timestamps: Sequence[int]) -> pa.Array:
    """Kafka record timestamps (ms) as a timestamptz column. A producer may set any
    int64: one beyond years 1-9999 is null, not a value the table cannot hold (and
    past 2^63 / 1000 ms the conversion to microseconds wrapped around silently)."""
    ms = np.asarray(timestamps, dtype=np.int64)
    bad = (ms < _FIRST_MS) | (ms > _LAST_MS)
    us = np.where(bad, 0, ms) * 1000
    return pa.array(us, pa.timestamp("us", "UTC"), mask=bad if bad.any() else None)


_METADATA: dict[str, Callable[[Fetch], pa.Array]] = {
    "_kafka_topic": lambda f: pa.array([f.topic] * len(f.offsets), pa.string()),
    "_kafka_partition": lambda f: pa.array(np.full(len(f.offsets), f.partition, np.int32)),
    "_kafka_offset": lambda f: pa.array(f.offsets),
    "_kafka_timestamp": lambda f: record_timestamps(f.timestamps),
    "_kafka_key": lambda f: pa.array(f.keys, pa.binary()),
}


def with_metadata_fields(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """``schema`` (a route's inferred value columns) with the ``metadata_columns`` a
    source adds to every row, so a table created for the route can hold them."""
    empty = Fetch("", 0, np.empty(0, np.int64), [], [], [], [])
    fields = [pa.field(name, _METADATA[name](empty).type) for name in columns]
    return pa.schema([*(f for f in schema if f.name not in columns), *fields])


def _with_metadata(
    table: pa.Table, fetch: Fetch, schema: pa.Schema, columns: Sequence[str]
) -> pa.RecordBatch:
    for name in columns:
        table = table.append_column(name, _METADATA[name](fetch))
    return _one_batch(conform(table, schema), schema)


def _one_batch(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if isinstance(table, pa.RecordBatch):
        return table
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema)


def _prescreen(fetch: Fetch, max_bytes: int) -> tuple[list[int], list[DeadRecord]]:
    good: list[int] = []
    dead: list[DeadRecord] = []
    for i, value in enumerate(fetch.values):
        if not value or value.isspace():  # isspace: no copy per record
            dead.append(DeadRecord(i, "empty", "the record has no value (tombstone or empty)"))
        elif len(value) > max_bytes:
            dead.append(
                DeadRecord(
                    i,
                    "oversized",
                    f"value of {len(value)} bytes exceeds max_record_bytes ({max_bytes})",
                )
            )
        else:
            good.append(i)
    return good, dead


def _join(values: Sequence[bytes]) -> bytes:
    body = b"\n".join(values)
    if body.count(b"\n") != len(values) - 1 or b"\r" in body:
        # A raw newline can only be JSON whitespace (strings escape it), so blanking
        # it keeps one record per line without changing any value.
        body = b"\n".join(v.replace(b"\n", b" ").replace(b"\r", b" ") for v in values)
    return body


def decode_json(
    fetch: Fetch,
    schema: pa.Schema,
    *,
    metadata_columns: Sequence[str] = (),
    max_record_bytes: int = 2**20,
    subset: npt.NDArray[np.int64] | None = None,
    options: JsonOptions | None = None,
) -> Decoded:
    """Decode the JSON values of ``fetch`` (or of its ``subset`` positions) for one table."""
    positions = subset if subset is not None else np.arange(len(fetch.offsets), dtype=np.int64)
    view = fetch.take(positions) if subset is not None else fetch
    good, dead = _prescreen(view, max_record_bytes)
    value_schema = pa.schema([f for f in schema if f.name not in metadata_columns])
    deep = too_deep_values(view.values, good, (options or JsonOptions()).max_depth)
    if deep:
        # Found here, once, rather than by bisecting down to them.
        good = [i for i in good if i not in deep]
        dead.extend(DeadRecord(i, "too_deep", deep[i]) for i in sorted(deep))
    result = decode_ndjson_lenient([view.values[i] or b"" for i in good], value_schema, options)
    ok = np.asarray(good, dtype=np.int64)
    if result.errors:
        bad = {e.index for e in result.errors}
        ok = np.asarray([g for j, g in enumerate(good) if j not in bad], dtype=np.int64)
        dead.extend(
            DeadRecord(good[e.index], e.reason, _error_text(e), e.column) for e in result.errors
        )
    dead = [DeadRecord(int(positions[d.index]), d.reason, d.error, d.column) for d in dead]
    dead.sort(key=lambda d: d.index)
    if result.table is None:
        return Decoded(None, np.empty(0, np.int64), dead)
    batch = _with_metadata(result.table, view.take(ok), schema, metadata_columns)
    return Decoded(batch, positions[ok], dead)


def _error_text(error: RecordError) -> str:
    # As the error the record alone raises (a SchemaError names its column first).
    return error.message if error.column is None else f"column {error.column!r}: {error.message}"


def too_deep_values(
    values: Sequence[bytes | None], indices: Sequence[int], max_depth: int
) -> dict[int, str]:
    """Which of ``values[indices]`` nest deeper than ``max_depth``, with the error
    each gets (one linear scan of the joined values; see `daemon.nesting`)."""
    if not indices:
        return {}
    lines = too_deep_lines(_join([values[i] or b"" for i in indices]), max_depth)
    return {indices[line]: too_deep(max_depth) for line in lines}


def decode_raw(
    fetch: Fetch,
    schema: pa.Schema,
    *,
    metadata_columns: Sequence[str] = (),
    max_record_bytes: int = 2**20,
    subset: npt.NDArray[np.int64] | None = None,
) -> Decoded:
    """Key, value and headers as they are: columns ``key``/``value`` (binary) and
    ``headers`` (string: a JSON list of ``[name, base64 value]`` pairs)."""
    positions = subset if subset is not None else np.arange(len(fetch.offsets), dtype=np.int64)
    view = fetch.take(positions) if subset is not None else fetch
    dead: list[DeadRecord] = []
    keep: list[int] = []
    for i, value in enumerate(view.values):
        if value is not None and len(value) > max_record_bytes:
            dead.append(
                DeadRecord(
                    int(positions[i]),
                    "oversized",
                    f"value of {len(value)} bytes exceeds max_record_bytes ({max_record_bytes})",
                )
            )
        else:
            keep.append(i)
    ok = np.asarray(keep, dtype=np.int64)
    rows = view.take(ok)
    columns: dict[str, pa.Array] = {}
    names = set(schema.names)
    if "key" in names:
        columns["key"] = pa.array(rows.keys, pa.binary())
    if "value" in names:
        columns["value"] = pa.array(rows.values, pa.binary())
    if "headers" in names:
        columns["headers"] = pa.array([headers_json(h) for h in rows.headers], pa.string())
    table = pa.table(columns) if columns else pa.table({"_": pa.nulls(len(ok))}).drop(["_"])
    batch = _with_metadata(table, rows, schema, metadata_columns) if len(ok) else None
    return Decoded(batch, positions[ok], dead)


def headers_json(headers: Sequence[tuple[str, bytes]]) -> str:
    return json.dumps([[header_name(k), base64.b64encode(v or b"").decode()] for k, v in headers])


def header_name(key: str) -> str:
    """A header key as valid text: one read from bytes that are not UTF-8 (kept with
    surrogate escapes by the raw reader) shows those bytes as ``\\xff``."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return key


def route_values(
    fetch: Fetch, *, field: str | None, header: str | None, max_depth: int = DEFAULT_MAX_DEPTH
) -> list[str | None]:
    """The route value of every record (None: no usable value, or a value nesting
    deeper than ``max_depth``, which no parser may see)."""
    if header is not None:
        by_header: list[str | None] = []
        for pairs in fetch.headers:
            found = next((v for k, v in pairs if k == header), None)
            try:
                by_header.append(found.decode() if found else None)
            except UnicodeDecodeError:
                by_header.append(None)
        return by_header
    assert field is not None
    values = [v or b"" for v in fetch.values]
    deep = too_deep_values(values, range(len(values)), max_depth)
    if deep:  # no parser may see them; they get no route
        routes = _routes([b"{}" if i in deep else v for i, v in enumerate(values)], field)
        return [None if i in deep else r for i, r in enumerate(routes)]
    return _routes(values, field)


def _routes(values: list[bytes], field: str) -> list[str | None]:
    body = _join(values)
    # pyarrow 26 crashes on a top-level `null` starting a block (see daemon.decode):
    # only bodies of plain objects reach it.
    if _UNSAFE.search(body) or _NOT_AN_OBJECT.search(body):
        return [_route_of(v, field) for v in values]
    try:
        parsed = pj.read_json(
            pa.BufferReader(body),
            parse_options=pj.ParseOptions(
                explicit_schema=pa.schema([(field, pa.string())]),
                unexpected_field_behavior="ignore",
                newlines_in_values=False,
            ),
        )
        if parsed.num_rows == len(values):
            routes: list[str | None] = parsed.column(field).to_pylist()
            return routes
    except pa.ArrowException:
        pass
    # Some value is not an object with a string route: find out record by record.
    return [_route_of(v, field) for v in values]


def _route_of(value: bytes, field: str) -> str | None:
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    route = record.get(field)
    if isinstance(route, str) and route:
        return route
    if isinstance(route, int) and not isinstance(route, bool):
        return str(route)
    return None
