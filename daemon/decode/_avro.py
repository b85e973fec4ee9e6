"""Avro values (Kafka's ``format = "avro"``) -> an Arrow batch in the table's schema.

Two framings: the Confluent wire format (magic byte 0, 4-byte big-endian schema id,
Avro binary) with the writer schemas from a schema registry, or plain Avro binary
written with one fixed schema from an ``.avsc`` file (`icespool.decode._avro_registry`).

Each value is read by fastavro's C reader with a copy of the writer schema whose
logical types are removed, so it yields plain ints, bytes and strings instead of
``datetime``/``Decimal``/``UUID`` objects; the records then become Arrow a column at
a time (`icespool.decode._avro_convert`).

A value that does not read, or whose batch does not convert, costs only itself: the
conversion is retried on halves until the bad records stand alone, and they become
dead letters (reason ``invalid``, the error names the column). A schema id the
registry does not know, or a registry that does not answer after a few tries, makes
its records dead letters with reason ``schema_unavailable``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode._avro_convert import CONVERSION_ERRORS, batch_builder
from icespool.decode._avro_registry import AvroSchemas, SchemaUnavailable
from icespool.decode._avro_schema import WriterSchema
from icespool.decode._decoded import (
    DeadRecord,
    Decoded,
    EvolveRequest,
    RowReader,
    Rows,
    with_source_columns,
)
from icespool.decode._json_values import infer_values_schema, value_schema
from icespool.decode._locate import split_failures
from icespool.decode._nesting import DEFAULT_MAX_DEPTH
from icespool.decode._records import Binary, Records, Target
from icespool.decode._screen import EMPTY, oversized
from icespool.decode._wire import HEADER, bad_header, in_order
from icespool.errors import BadInputError, SchemaError

__all__ = ["AvroValues", "avro_rows"]


def _frame(
    schemas: AvroSchemas,
    index: int,
    value: bytes,
    groups: dict[int | None, list[int]],
    dead: list[DeadRecord],
) -> None:
    """Group a value by its writer schema: the Confluent wire format's schema id, or
    None for the one fixed schema; a value without the wire header is a dead letter."""
    problem = bad_header(value) if schemas.framed else None
    if not schemas.framed:
        groups.setdefault(None, []).append(index)
    elif problem is not None:
        dead.append(DeadRecord(index, "invalid", problem))
    else:
        groups.setdefault(int.from_bytes(value[1:HEADER], "big"), []).append(index)


def _writer_schema(
    schemas: AvroSchemas, schema_id: int | None, indices: list[int], dead: list[DeadRecord]
) -> tuple[WriterSchema, int] | None:
    """The writer schema of a group and where its values' Avro starts (after the wire
    header); None, with the group dead-lettered, when the schema is unavailable."""
    try:
        writer = schemas.fixed() if schema_id is None else schemas.get(schema_id)
    except SchemaUnavailable as exc:
        dead.extend(DeadRecord(i, exc.reason, str(exc)) for i in indices)
        return None
    return writer, 0 if schema_id is None else HEADER


class AvroValues:
    """The decoder of Avro values, lenient: a value that does not read, or whose batch
    does not convert, costs only itself (``invalid``, naming the column); a value
    without the wire header is ``invalid``, one of an unknown writer schema
    ``schema_unavailable``. ``schemas``: where the writer schemas come from (asked
    at the first decode, and again while that fails)."""

    def __init__(
        self,
        schemas: Callable[[], AvroSchemas],
        *,
        source_columns: Sequence[str] = (),
        max_record_bytes: int = 2**20,
    ) -> None:
        self._schemas = schemas
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        """A value nests at most as deep as its writer schema, so the table's nesting
        bound limits the schema (recursive ones included) before any value is read."""
        schemas = self._schemas()
        columns = value_schema(target.schema, self._source_columns)
        dead: list[DeadRecord] = []
        groups: dict[int | None, list[int]] = {}
        # Avro is read value by value (fastavro) in any case: the values as bytes.
        values: list[bytes | None] = records.values.to_pylist()
        for i, value in enumerate(values):
            if not value:
                dead.append(DeadRecord(i, "empty", EMPTY))
            elif len(value) > self._max_bytes:
                dead.append(oversized(i, len(value), self._max_bytes))
            else:
                _frame(schemas, i, value, groups, dead)
        tables: list[tuple[pa.RecordBatch, list[int]]] = []
        depth = target.options.max_depth
        for schema_id, indices in groups.items():
            found = _writer_schema(schemas, schema_id, indices, dead)
            if found is not None:
                writer, start = found
                _decode_group(values, indices, start, writer, columns, depth, tables, dead)
        dead.sort(key=lambda d: d.index)
        if not tables:
            return Decoded(None, np.empty(0, np.int64), dead)
        table, ok = in_order(tables, tables[0][0].schema)
        rows = records.take(ok)
        return Decoded(
            with_source_columns(table, rows, target.schema, self._source_columns), ok, dead
        )

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return None  # the writer schema is no reason to change the table

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        # A table auto_create makes for a route: from the values read as JSON, as
        # for every Kafka format.
        return infer_values_schema(records, target)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def _decode_group(
    values: list[bytes | None],
    indices: list[int],
    start: int,
    writer: WriterSchema,
    value_schema: pa.Schema,
    max_depth: int,
    out: list[tuple[pa.RecordBatch, list[int]]],
    dead: list[DeadRecord],
    ignore_unknown: bool = False,
) -> None:
    try:
        build = batch_builder(writer, value_schema, max_depth, ignore_unknown)
    except BadInputError as exc:
        dead.extend(DeadRecord(i, exc.reason, f"{writer.label}: {exc}") for i in indices)
        return
    rows: list[Any] = []
    good: list[int] = []
    reader = writer.reader
    for i in indices:
        value = values[i]
        assert value is not None
        stream = io.BytesIO(value)
        stream.seek(start)
        try:
            record = fastavro.schemaless_reader(stream, reader)
        except Exception as exc:  # fastavro raises EOFError, IndexError, ... on bad bytes
            reason = "bad_utf8" if isinstance(exc, UnicodeDecodeError) else "invalid"
            dead.append(DeadRecord(i, reason, _unreadable(writer, exc)))
            continue
        left = len(value) - stream.tell()
        if left:
            dead.append(
                DeadRecord(
                    i,
                    "invalid",
                    f"not Avro of {writer.label}: {left} byte(s) left after the record",
                )
            )
            continue
        rows.append(record)
        good.append(i)
    by_index = dict(zip(good, rows, strict=True))
    built, failed = split_failures(
        good, lambda part: build([by_index[i] for i in part]), CONVERSION_ERRORS
    )
    out.extend((batch, list(part)) for batch, part in built)
    for index, error in failed:
        reason = error.reason if isinstance(error, BadInputError) else "invalid"
        column = error.column if isinstance(error, SchemaError) else None
        dead.append(DeadRecord(index, reason, str(error), column))


def _unreadable(writer: WriterSchema, exc: Exception) -> str:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, EOFError | IndexError):
        # fastavro's reader runs past the end of a short value (or one written with
        # another schema) with either of these.
        return (
            f"not Avro of {writer.label}: the value is cut short or was written with "
            f"another schema ({detail})"
        )
    return f"not Avro of {writer.label}: {detail}"


def avro_rows(
    schemas: AvroSchemas, max_depth: int = DEFAULT_MAX_DEPTH, *, ignore_unknown: bool = False
) -> RowReader:
    """Avro values (Kafka values or keys) at given positions -> rows in a schema, for
    `icespool.decode._keyed` (Debezium's envelope: ``ignore_unknown`` skips its
    ``source``, ``ts_ms``, ``transaction``). Same wire rules and dead letters as
    `AvroValues`; the good rows come back in position order."""

    def decode(values: Binary, indices: npt.NDArray[np.int64], schema: pa.Schema) -> Rows:
        raw: list[bytes | None] = values.to_pylist()
        dead: list[DeadRecord] = []
        groups: dict[int | None, list[int]] = {}
        for i in indices.tolist():
            value = raw[i]
            assert value is not None, "null values are tombstones, never decoded"
            _frame(schemas, i, value, groups, dead)
        tables: list[tuple[pa.RecordBatch, list[int]]] = []
        for schema_id, group in groups.items():
            found = _writer_schema(schemas, schema_id, group, dead)
            if found is None:
                continue
            writer, start = found
            _decode_group(
                raw, group, start, writer, schema, max_depth, tables, dead, ignore_unknown
            )
        if not tables:
            return None, np.empty(0, np.int64), dead
        table, ok = in_order(tables, schema)
        return table, ok, dead

    return decode
