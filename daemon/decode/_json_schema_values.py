"""JSON Schema values (Kafka's ``format = "json-schema"``) -> one batch per table.

The Confluent wire format: magic byte 0, the 4-byte schema id, then the value as JSON
text. The headers are read and cut off for the whole fetch at once (numpy over the
values' offsets, one ``binary_slice``); the values of each schema id are then decoded
as Kafka JSON values are, by ONE ``pyarrow.json`` call in the table's types
(`icespool.decode._ndjson`), and the schema's checks run on the decoded columns
(`icespool.decode._json_schema`). No value is parsed in Python.

Before any value is read, the schema is held against the table: a property the
table lacks, or whose declared type cannot become its column's, makes the schema's
records dead letters naming that column (the table's ``evolve`` policy may add the
columns the schema declares, with their declared types). Dead letters otherwise as
for JSON values (``invalid`` naming the column, ``out_of_range``, ``too_deep``,
...), plus ``invalid`` for a value that fails the schema's checks or has no wire
header, and ``schema_unavailable`` for a schema id the registry does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest, with_source_columns
from icespool.decode._json_schema import JsonSchema, natural_type
from icespool.decode._json_values import dead_record, value_schema
from icespool.decode._ndjson import decode_ndjson_lenient
from icespool.decode._records import Binary, Records, Target
from icespool.decode._registry import CachedSchemas, SchemaUnavailable
from icespool.decode._screen import EMPTY, screened_values
from icespool.decode._wire import HEADER, bad_header, in_order, new_columns_request
from icespool.errors import BadInputError, SchemaError

__all__ = ["JsonSchemaValues"]

JsonSchemas = CachedSchemas[JsonSchema]


class JsonSchemaValues:
    """The decoder of JSON Schema values, lenient (see the module doc)."""

    def __init__(
        self,
        schemas: Callable[[], JsonSchemas],
        *,
        source_columns: Sequence[str] = (),
        max_record_bytes: int = 2**20,
    ) -> None:
        self._schemas = schemas
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        schemas = self._schemas()
        columns = value_schema(target.schema, self._source_columns)
        values = records.values
        dead: list[DeadRecord] = []
        parts: list[tuple[pa.RecordBatch, list[int]]] = []
        declared: dict[str, pa.Field] = {}
        groups, bodies = _split(values, dead)
        for schema_id, indices in groups.items():
            try:
                schema = schemas.get(schema_id)
            except SchemaUnavailable as exc:
                dead.extend(DeadRecord(int(i), exc.reason, str(exc)) for i in indices)
                continue
            for f in schema.arrow_schema():
                if columns.get_field_index(f.name) < 0:
                    declared.setdefault(f.name, f)
            problem = _misfit(schema, columns)
            if problem is not None:
                text = f"{schema.label}: {problem}"
                dead.extend(
                    DeadRecord(int(i), problem.reason, text, problem.column) for i in indices
                )
                continue
            self._decode_group(schema, bodies.take(pa.array(indices)), indices, target, parts, dead)
        dead.sort(key=lambda d: d.index)
        wanted = pa.schema(list(declared.values())) if declared else None
        if not parts:
            return Decoded(None, np.empty(0, np.int64), dead, wanted)
        table, ok = in_order(parts, columns)
        batch = with_source_columns(table, records.take(ok), target.schema, self._source_columns)
        return Decoded(batch, ok, dead, wanted)

    def _decode_group(
        self,
        schema: JsonSchema,
        bodies: Binary,
        indices: npt.NDArray[np.int64],
        target: Target,
        out: list[tuple[pa.RecordBatch, list[int]]],
        dead: list[DeadRecord],
    ) -> None:
        options = target.options
        columns = value_schema(target.schema, self._source_columns)
        body, good, screened = screened_values(bodies, self._max_bytes, options.max_depth)
        dead.extend(DeadRecord(int(indices[d.index]), d.reason, d.error) for d in screened)
        if not len(good):
            return
        result = decode_ndjson_lenient(body, columns, options)
        bad = {e.index for e in result.errors}
        dead.extend(dead_record(int(indices[good[e.index]]), e) for e in result.errors)
        if result.table is None:
            return
        kept = np.asarray([k for k in range(len(good)) if k not in bad], dtype=np.int64)
        positions = indices[good[kept]]
        failing = _failing(schema, result.table)
        if failing:
            for row, error in failing.items():
                dead.append(
                    DeadRecord(
                        int(positions[row]), "invalid", f"does not match {schema.label}: {error}"
                    )
                )
            keep = np.ones(len(positions), dtype=bool)
            keep[list(failing)] = False
            table = result.table.filter(pa.array(keep))
            positions = positions[keep]
        else:
            table = result.table
        if table.num_rows:
            out.append((table.combine_chunks().to_batches()[0], positions.tolist()))

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return new_columns_request(decoded)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        """The declared schema of the first value whose schema the registry knows (a
        table auto_create makes for a route)."""
        schemas = self._schemas()
        groups, _ = _split(records.values, [])
        for schema_id in groups:
            try:
                return schemas.get(schema_id).arrow_schema()
            except SchemaUnavailable:
                continue
        raise BadInputError("no value names a JSON Schema the registry knows")

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def _split(
    values: Binary, dead: list[DeadRecord]
) -> tuple[dict[int, npt.NDArray[np.int64]], Binary]:
    """The positions of the values by schema id, and every value without its header;
    values that are empty or not in the wire format are dead."""
    n = len(values)
    if not n:
        return {}, values
    offsets_type = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], offsets_type)[
        values.offset : values.offset + n + 1
    ]
    data_buffer = values.buffers()[2]
    data = (
        np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    )
    lengths = np.diff(offsets)
    present = lengths > 0
    if values.null_count:
        present &= values.is_valid().to_numpy(zero_copy_only=False)
    framed = present & (lengths >= HEADER)
    starts = offsets[:-1].astype(np.int64)
    framed[framed] = data[starts[framed]] == 0
    for i in np.flatnonzero(~present).tolist():
        dead.append(DeadRecord(i, "empty", EMPTY))
    for i in np.flatnonzero(present & ~framed).tolist():
        value = values[i].as_py()
        dead.append(DeadRecord(i, "invalid", bad_header(value) or "not the wire format"))
    at = np.flatnonzero(framed)
    first = starts[at]
    ids = (
        (data[first + 1].astype(np.int64) << 24)
        | (data[first + 2].astype(np.int64) << 16)
        | (data[first + 3].astype(np.int64) << 8)
        | data[first + 4].astype(np.int64)
    )
    groups: dict[int, npt.NDArray[np.int64]] = {}
    for schema_id in np.unique(ids).tolist():
        groups[int(schema_id)] = at[ids == schema_id].astype(np.int64)
    # An explicit stop: pyarrow 26's default one fails on binary arrays.
    bodies = pc.binary_slice(values, HEADER, 2**31 - 1)
    return groups, bodies


def _misfit(schema: JsonSchema, columns: pa.Schema) -> SchemaError | None:
    """Why no value of ``schema`` can fit the table's columns; None when they may."""
    for name, node in schema.properties.items():
        index = columns.get_field_index(name)
        if index < 0:
            return SchemaError(name, "JSON Schema property is not a column of the table")
        declared = natural_type(schema, node)
        if declared is not None and not _fits(declared, columns.field(index).type):
            return SchemaError(
                name, f"JSON Schema type {declared} does not convert to {columns.field(index).type}"
            )
    return None


def _fits(declared: pa.DataType, column: pa.DataType) -> bool:
    """Whether values of a declared type can be decoded into a column type (the decode
    checks each value; this refuses what none could pass)."""
    t = pa.types
    if t.is_struct(declared):
        return bool(t.is_struct(column)) and all(
            column.get_field_index(f.name) >= 0
            and _fits(f.type, column.field(column.get_field_index(f.name)).type)
            for f in declared
        )
    if t.is_list(declared):
        return bool(t.is_list(column) or t.is_large_list(column)) and _fits(
            declared.value_type, column.value_type
        )
    if t.is_map(declared):
        return bool(t.is_map(column)) and _fits(declared.item_type, column.item_type)
    if t.is_integer(declared):
        return bool(t.is_integer(column) or t.is_floating(column) or t.is_decimal(column))
    if t.is_floating(declared) or t.is_decimal(declared):
        return bool(t.is_floating(column) or t.is_decimal(column))
    if isinstance(declared, pa.BaseExtensionType):
        return isinstance(column, pa.BaseExtensionType) or bool(t.is_string(column))
    if t.is_string(declared):
        return bool(
            t.is_string(column)
            or t.is_decimal(column)
            or t.is_temporal(column)
            or isinstance(column, pa.BaseExtensionType)
        )
    if t.is_binary(declared):
        return bool(t.is_binary(column) or t.is_fixed_size_binary(column))
    if t.is_timestamp(declared):
        return bool(t.is_timestamp(column))
    if t.is_date(declared) or t.is_time(declared):
        return bool(declared == column or (t.is_timestamp(column) and t.is_date(declared)))
    return bool(declared == column)


def _failing(schema: JsonSchema, table: pa.Table) -> dict[int, str]:
    """Rows of ``table`` that fail one of the schema's checks, with the first failure."""
    failing: dict[int, str] = {}
    for name, fails, error in schema.checks:
        if name not in table.column_names:
            continue
        column = table.column(name).combine_chunks()
        try:
            mask = fails(column)
        except (pa.ArrowException, TypeError, ValueError):
            continue  # a check of no meaning for the column's type (the decode typed it)
        rows = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
        for row in rows.tolist():
            failing.setdefault(row, error)
    return failing
