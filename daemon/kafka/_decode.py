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
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from icespool.decode import JsonOptions, LenientResult, RecordError, decode_ndjson_lenient
from icespool.decode._nesting import DEFAULT_MAX_DEPTH, too_deep, too_deep_lines
from icespool.kafka._offsets import RecordMark
from icespool.schema import conform

__all__ = [
    "DeadRecord",
    "Decoded",
    "Fetch",
    "binary_array",
    "blank_lines",
    "decode_json",
    "decode_raw",
    "header_name",
    "headers_json",
    "joined",
    "record_timestamps",
    "route_values",
    "screen",
    "screened_body",
    "too_deep_values",
    "with_metadata_fields",
]

# A line (value) that does not start with "{": one C-speed scan of the joined body.
_NOT_AN_OBJECT = re.compile(rb"(?:\A|\n)[ \t\r]*(?:[^ \t\r\n{]|\n|\Z)")
_UNSAFE = re.compile(rb"}(?:[ \t\r]*\{|[ \t\r\n]*null)")


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
    # Columns the records' own schemas (Debezium's Kafka Connect schemas) carry that the
    # table lacks or holds narrower, with their exact types: what to evolve it for.
    wants: pa.Schema | None = None


# ------------------------------------------------------------------ one fetch

#: A fetch's values or keys (large_binary only past 2 GiB of bytes).
Binary: TypeAlias = pa.BinaryArray | pa.LargeBinaryArray
_OFFSET = operator.attrgetter("offset")
_VALUE = operator.attrgetter("value")
_KEY = operator.attrgetter("key")
_TIMESTAMP = operator.attrgetter("timestamp")
_HEADERS = operator.attrgetter("headers")
_EMPTY = "the record has no value (tombstone or empty)"


def binary_array(values: Binary | pa.ChunkedArray | Sequence[bytes | None]) -> Binary:
    """``values`` as one binary array (null: no bytes, a tombstone or no key). Past
    2 GiB of bytes pyarrow hands back chunks: they become one large_binary array."""
    if isinstance(values, pa.BinaryArray | pa.LargeBinaryArray):
        return values
    array = values if isinstance(values, pa.ChunkedArray) else pa.array(values, pa.binary())
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return binary_array(array.chunk(0))
        return pa.concat_arrays([c.cast(pa.large_binary()) for c in array.chunks])
    if not pa.types.is_binary(array.type) and not pa.types.is_large_binary(array.type):
        array = array.cast(pa.binary())
    result: Binary = array
    return result


class Fetch:
    """The records of one partition from one poll, in offset order, as whole-fetch
    arrays: ``offsets`` (int64), ``values`` and ``keys`` (binary; null for a
    tombstone or a record without key). ``keys``, ``timestamps`` (int64 ms since the
    epoch) and ``headers`` (per record, (name, bytes) pairs) are read from the client's
    records only when something asks for them (a metadata column, a header route, a
    change decoder, a dead letter): most fetches never do."""

    __slots__ = (
        "_headers",
        "_keys",
        "_records",
        "_rows",
        "_timestamps",
        "offsets",
        "partition",
        "topic",
        "values",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offsets: npt.NDArray[np.int64] | Sequence[int],
        values: Binary | pa.ChunkedArray | Sequence[bytes | None],
        keys: Binary | pa.ChunkedArray | Sequence[bytes | None] | None,
        timestamps: npt.NDArray[np.int64] | Sequence[int] | None = None,
        headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
        *,
        records: Sequence[Any] | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offsets: npt.NDArray[np.int64] = np.asarray(offsets, dtype=np.int64)
        self.values = binary_array(values)
        self._keys = None if keys is None else binary_array(keys)
        self._timestamps = None if timestamps is None else np.asarray(timestamps, np.int64)
        self._headers = None if headers is None else list(headers)
        if records is None and (keys is None or timestamps is None or headers is None):
            raise ValueError("a fetch needs its keys, timestamps and headers, or the records")
        # The client's records (and which of them this fetch holds, after `take`):
        # where keys, timestamps and headers come from when asked.
        self._records = records
        self._rows = rows

    @classmethod
    def of_records(cls, topic: str, partition: int, records: Sequence[Any]) -> Fetch:
        """A fetch over the client's records (aiokafka's ConsumerRecord or a raw
        record: anything with offset, value, key, timestamp and headers), each
        attribute gathered by one C-level pass (no Python bytecode per record)."""
        n = len(records)
        return cls(
            topic,
            partition,
            np.fromiter(map(_OFFSET, records), np.int64, n),
            pa.array(list(map(_VALUE, records)), pa.binary()),
            None,
            records=records,
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def _source(self) -> Sequence[Any]:
        assert self._records is not None
        if self._rows is None:
            return self._records
        return list(map(self._records.__getitem__, self._rows.tolist()))

    @property
    def keys(self) -> Binary:
        if self._keys is None:
            self._keys = binary_array(list(map(_KEY, self._source())))
        return self._keys

    @property
    def timestamps(self) -> npt.NDArray[np.int64]:
        if self._timestamps is None:
            source = self._source()
            self._timestamps = np.fromiter(map(_TIMESTAMP, source), np.int64, len(source))
        return self._timestamps

    @property
    def headers(self) -> list[Sequence[tuple[str, bytes]]]:
        if self._headers is None:
            self._headers = list(map(_HEADERS, self._source()))
        return self._headers

    def last_mark(self) -> RecordMark:
        """What identifies the fetch's last record, read from that record alone (the
        fetch's keys and timestamps are not materialised for it)."""
        index = len(self.offsets) - 1
        if self._records is None:
            timestamp, key = int(self.timestamps[index]), self.key(index)
        else:
            at = index if self._rows is None else int(self._rows[index])
            last = self._records[at]
            timestamp, key = int(_TIMESTAMP(last)), _KEY(last)
        return RecordMark.of(int(self.offsets[index]), timestamp, key, self.value(index))

    def value(self, index: int) -> bytes | None:
        """One record's value (for the few records a dead letter or an error names)."""
        found: bytes | None = self.values[index].as_py()
        return found

    def key(self, index: int) -> bytes | None:
        found: bytes | None = self.keys[index].as_py()
        return found

    def take(self, rows: npt.NDArray[np.int64]) -> Fetch:
        rows = np.asarray(rows, dtype=np.int64)
        index = pa.array(rows, pa.int64())
        timestamps = None if self._timestamps is None else self._timestamps[rows]
        keys = None if self._keys is None else self._keys.take(index)
        headers = None
        if self._headers is not None:
            headers = list(map(self._headers.__getitem__, rows.tolist()))
        lazy = self._records is not None and (keys is None or timestamps is None or headers is None)
        return Fetch(
            self.topic,
            self.partition,
            self.offsets[rows],
            self.values.take(index),
            keys,
            timestamps,
            headers,
            records=self._records if lazy else None,
            rows=(rows if self._rows is None else self._rows[rows]) if lazy else None,
        )


def joined(values: Binary) -> bytes:
    """The values joined with newlines (a null as an empty line), one record per
    line: a raw newline or CR inside a value can only be JSON whitespace (strings
    escape them), so they are blanked there without changing any value. Whole-array
    work: one pyarrow kernel, C-speed byte counts; the blanking only when needed."""
    if not len(values):
        return b""
    body = _newline_joined(values)
    if body.count(b"\n") != len(values) - 1 or b"\r" in body:
        body = _newline_joined(_blanked(values))
    return body


def _newline_joined(values: Binary) -> bytes:
    lines = pc.binary_join_element_wise(
        values,
        pa.scalar(b"", values.type),
        pa.scalar(b"\n", values.type),
        null_handling="replace",
        null_replacement="",
    )
    data = lines.buffers()[2]
    # Every line ends with its newline: the last one is not part of the body.
    return data.to_pybytes()[:-1] if data is not None else b""


def _blanked(values: Binary) -> Binary:
    """``values`` with every raw newline and CR turned into a space (same offsets)."""
    validity, offsets, data = values.buffers()
    if data is None:
        return values
    spaced = data.to_pybytes().replace(b"\n", b" ").replace(b"\r", b" ")
    array: Binary = pa.Array.from_buffers(
        values.type, len(values), [validity, offsets, pa.py_buffer(spaced)], offset=values.offset
    )
    return array


def screen(values: Binary, max_bytes: int) -> tuple[npt.NDArray[np.int64], list[DeadRecord]]:
    """The positions of the values a decoder may see, and the dead records of the
    others: ``empty`` (null, zero bytes, or only whitespace) and ``oversized`` (more
    than ``max_bytes``). Lengths are one pyarrow kernel; whitespace-only values are
    found on the joined values by one regex scan (`blank_lines`)."""
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy().astype(np.int64, copy=False)
    empty = lengths == 0
    over = lengths > max_bytes
    dead = [DeadRecord(int(i), "empty", _EMPTY) for i in np.flatnonzero(empty)]
    for i in np.flatnonzero(over).tolist():
        value = values[i].as_py()
        if value.isspace():  # as before: a value of only whitespace is empty, whatever its size
            dead.append(DeadRecord(i, "empty", _EMPTY))
        else:
            dead.append(
                DeadRecord(
                    i,
                    "oversized",
                    f"value of {len(value)} bytes exceeds max_record_bytes ({max_bytes})",
                )
            )
    good = np.flatnonzero(~(empty | over)).astype(np.int64)
    return good, dead


# A line of only whitespace (JSON's, and the \v \f that str.isspace also counts):
# the first line, and any line after a newline (a pattern that starts with a literal
# newline is scanned at memchr speed; one with a lookbehind is tried at every byte).
_BLANK_FIRST = re.compile(rb"[ \t\r\x0b\x0c]*(?:\n|\Z)")
_BLANK_AFTER = re.compile(rb"\n[ \t\r\x0b\x0c]*(?=\n|\Z)")
_NL = 10


def blank_lines(body: bytes) -> npt.NDArray[np.int64]:
    """0-based indices of the lines of ``body`` that hold only whitespace: one regex
    scan; line numbers only when there is a match (one search per match)."""
    first = [0] if _BLANK_FIRST.match(body) else []
    after = [m.start() for m in _BLANK_AFTER.finditer(body)]
    if not after:
        return np.asarray(first, np.int64)
    breaks = np.flatnonzero(np.frombuffer(body, np.uint8) == _NL)
    lines = np.searchsorted(breaks, np.asarray(after, np.int64)) + 1
    return np.concatenate((np.asarray(first, np.int64), lines.astype(np.int64)))


# Years 1-9999 in ms (see daemon.value_ranges): what a timestamptz column holds.
_FIRST_MS, _LAST_MS = -62_135_596_800_000, 253_402_300_799_999


def record_timestamps(timestamps: npt.NDArray[np.int64] | Sequence[int]) -> pa.Array:
    """Kafka record timestamps (ms) as a timestamptz column. A producer may set any
    int64: one beyond years 1-9999 is null, not a value the table cannot hold (and
    past 2^63 / 1000 ms the conversion to microseconds wrapped around silently)."""
    ms = np.asarray(timestamps, dtype=np.int64)
    bad = (ms < _FIRST_MS) | (ms > _LAST_MS)
    us = np.where(bad, 0, ms) * 1000
    return pa.array(us, pa.timestamp("us", "UTC"), mask=bad if bad.any() else None)


_METADATA: dict[str, Callable[[Fetch], pa.Array]] = {
    "_kafka_topic": lambda f: pa.repeat(pa.scalar(f.topic, pa.string()), len(f.offsets)),
    "_kafka_partition": lambda f: pa.array(np.full(len(f.offsets), f.partition, np.int32)),
    "_kafka_offset": lambda f: pa.array(f.offsets),
    "_kafka_timestamp": lambda f: record_timestamps(f.timestamps),
    "_kafka_key": lambda f: f.keys,
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


def _pick(values: Binary, rows: npt.NDArray[np.int64]) -> Binary:
    return values if len(rows) == len(values) else values.take(pa.array(rows, pa.int64()))


def _drop(
    good: npt.NDArray[np.int64], lines: npt.NDArray[np.int64] | list[int]
) -> npt.NDArray[np.int64]:
    """``good`` without its entries at ``lines`` (positions in ``good``)."""
    keep = np.ones(len(good), dtype=bool)
    keep[np.asarray(lines, dtype=np.int64)] = False
    return good[keep]


def screened_body(
    values: Binary, max_bytes: int, max_depth: int
) -> tuple[bytes, npt.NDArray[np.int64], list[DeadRecord]]:
    """What a JSON decoder may see of ``values``: their newline-joined body (one
    line per value, see `joined`), the positions of the values it holds, and the
    dead records of the others (``empty``, ``oversized``, ``too_deep``; unsorted).

    Every guard is whole-array: lengths by a pyarrow kernel, whitespace-only values
    by one regex scan of the body, nesting depth by `too_deep_lines` over the body
    (C passes and numpy). The body is joined again only when a guard removed lines.
    """
    good, dead = screen(values, max_bytes)
    body = joined(_pick(values, good))
    blank = blank_lines(body) if len(good) else np.empty(0, np.int64)
    if len(blank):
        dead.extend(DeadRecord(int(good[k]), "empty", _EMPTY) for k in blank.tolist())
        good = _drop(good, blank)
        body = joined(_pick(values, good))
    deep = too_deep_lines(body, max_depth) if len(good) else []
    if deep:
        # Found here, once, rather than by bisecting down to them.
        dead.extend(DeadRecord(int(good[k]), "too_deep", too_deep(max_depth)) for k in deep)
        good = _drop(good, deep)
        body = joined(_pick(values, good))
    return body, good, dead


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
    max_depth = (options or JsonOptions()).max_depth
    body, good, dead = screened_body(view.values, max_record_bytes, max_depth)
    value_schema = pa.schema([f for f in schema if f.name not in metadata_columns])
    # One record per line and no blank line: line k of the body is value good[k].
    result = (
        decode_ndjson_lenient(body, value_schema, options) if len(good) else LenientResult(None, [])
    )
    ok = good
    if result.errors:
        bad = np.asarray([e.index for e in result.errors], dtype=np.int64)
        ok = _drop(good, bad)
        dead.extend(
            DeadRecord(int(good[e.index]), e.reason, _error_text(e), e.column)
            for e in result.errors
        )
    dead = [DeadRecord(int(positions[d.index]), d.reason, d.error, d.column) for d in dead]
    dead.sort(key=lambda d: d.index)
    if result.table is None:
        return Decoded(None, np.empty(0, np.int64), dead)
    rows = view if len(ok) == len(view.offsets) else view.take(ok)
    batch = _with_metadata(result.table, rows, schema, metadata_columns)
    return Decoded(batch, positions[ok], dead)


def _error_text(error: RecordError) -> str:
    # As the error the record alone raises (a SchemaError names its column first).
    return error.message if error.column is None else f"column {error.column!r}: {error.message}"


def too_deep_values(values: Binary, max_depth: int) -> dict[int, str]:
    """Which ``values`` nest deeper than ``max_depth``, with the error each gets (one
    linear scan of the joined values; see `icespool.decode._nesting`)."""
    if not len(values):
        return {}
    lines = too_deep_lines(joined(values), max_depth)
    return dict.fromkeys(lines, too_deep(max_depth))


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
    lengths = pc.fill_null(pc.binary_length(view.values), 0).to_numpy()
    over = lengths > max_record_bytes
    dead = [
        DeadRecord(
            int(positions[i]),
            "oversized",
            f"value of {int(lengths[i])} bytes exceeds max_record_bytes ({max_record_bytes})",
        )
        for i in np.flatnonzero(over).tolist()
    ]
    ok = np.flatnonzero(~over).astype(np.int64)
    rows = view if len(ok) == len(view.offsets) else view.take(ok)
    columns: dict[str, pa.Array] = {}
    names = set(schema.names)
    if "key" in names:
        columns["key"] = rows.keys
    if "value" in names:
        columns["value"] = rows.values
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
    values = fetch.values
    deep = too_deep_values(values, max_depth)
    if deep:  # no parser may see them; they get no route
        mask = np.zeros(len(values), dtype=bool)
        mask[list(deep)] = True
        values = binary_array(pc.if_else(pa.array(mask), pa.scalar(b"{}", values.type), values))
        routes = _routes(values, field)
        return [None if i in deep else r for i, r in enumerate(routes)]
    return _routes(values, field)


def _routes(values: Binary, field: str) -> list[str | None]:
    body = joined(values)
    # pyarrow 26 crashes on a top-level `null` starting a block (see icespool.decode):
    # only bodies of plain objects reach it.
    if not _UNSAFE.search(body) and not _NOT_AN_OBJECT.search(body):
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
    return [_route_of(v or b"", field) for v in values.to_pylist()]


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
