"""An upsert table's way into the spool: plain rows (all upserts) or change batches,
checked whole-batch before anything is acked."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from icespool.cdc._changes import DELETE, OP_COLUMN, UPSERT, change_schema
from icespool.errors import BackpressureError, BadInputError, SchemaError
from icespool.schema import conform, find_out_of_range

__all__ = ["conform_changes", "spoolable"]


def spoolable(
    data: pa.RecordBatch | pa.Table, schema: pa.Schema, key: Sequence[str]
) -> pa.RecordBatch:
    """``data`` as a batch to spool for a table of Arrow ``schema`` (an upsert table's
    when ``key``: `conform_changes`), every temporal and decimal value checked against
    what readers hold. Blocking. Raises what `conform` / `conform_changes` raise, and
    `SchemaError` naming the column of a value out of range."""
    batch = conform_changes(data, schema, key) if key else conform(data, schema)
    # HTTP and Kafka refused such values per record at decode; this is the one check
    # the in-process API passes through (one min/max per temporal leaf).
    for name, values in zip(batch.schema.names, batch.columns, strict=True):
        if name == OP_COLUMN:
            continue
        found = find_out_of_range(values)
        if found is not None:
            raise SchemaError(found.column(name), found.problem)
    return batch


def conform_changes(
    data: pa.RecordBatch | pa.Table, schema: pa.Schema, key: Sequence[str]
) -> pa.RecordBatch:
    """``data`` for an upsert table of Arrow ``schema`` and ``key``, ready to spool.

    A batch without the op column is rows of the table (every row an upsert) and is
    conformed to ``schema``; one with it is a change batch, conformed to
    `change_schema`. Raises `BadInputError` naming the key column when a row has no
    key, or the op column when an op is neither UPSERT nor DELETE; `SchemaError`
    naming the column when an upsert lacks a required column (as an append would).
    """
    absent = [column for column in key if column not in schema.names]
    if absent:
        # The table's fault (another writer renamed or dropped a key column), not the
        # input's: refused as unavailable until the table or the key is fixed.
        raise BackpressureError(
            f"the table has no column {absent[0]!r} of its key {list(key)} (renamed or "
            "dropped by another writer?); rename it back, or change [[tables]] key and "
            "restart",
            retry_after=10.0,
        )
    names = data.schema.names
    for column in key:
        if column in names and (nulls := data.column(column).null_count):
            first = _first_true(data.column(column).is_null())
            raise BadInputError(
                f"key column {column!r} is null in {nulls} of {data.num_rows} rows (first: row "
                f"{first}); every upsert and delete needs its whole key"
            )
    if OP_COLUMN not in names:
        return conform(data, schema)
    ops = data.column(OP_COLUMN)
    if not (pa.types.is_integer(ops.type)):
        raise BadInputError(
            f"column {OP_COLUMN!r} must be integers ({UPSERT} upsert, {DELETE} delete), "
            f"not {ops.type}"
        )
    bad = pc.invert(pc.fill_null(pc.is_in(ops, pa.array([UPSERT, DELETE], ops.type)), False))
    if pc.any(bad).as_py():
        first = _first_true(bad)
        raise BadInputError(
            f"column {OP_COLUMN!r} holds {ops[first].as_py()!r} at row {first}; each change is "
            f"{UPSERT} (upsert) or {DELETE} (delete)"
        )
    target = change_schema(schema, key)
    batch = conform(_typed_nulls(data, target), target)
    upserts = pc.equal(batch.column(OP_COLUMN), UPSERT)
    keys = set(key)
    for field in schema:
        if field.nullable or field.name in keys:
            continue
        missing = pc.and_(upserts, batch.column(field.name).is_null())
        if pc.any(missing).as_py():
            raise SchemaError(
                field.name,
                f"required column is null in the upsert at row {_first_true(missing)} "
                "(only a delete may leave non-key columns out)",
            )
    return batch


def _typed_nulls(data: pa.RecordBatch | pa.Table, target: pa.Schema) -> pa.RecordBatch | pa.Table:
    """Columns that are all nulls of Arrow's null type (a delete's values left out,
    as Python ``None`` builds them) as nulls of the column's type: conform converts
    only values, and null is no value of any type."""
    for index, field in enumerate(data.schema):
        if pa.types.is_null(field.type) and field.name in target.names:
            typed = target.field(field.name).type
            data = data.set_column(
                index, pa.field(field.name, typed), pa.nulls(data.num_rows, typed)
            )
    return data


def _first_true(mask: pa.Array | pa.ChunkedArray) -> int:
    found = pc.indices_nonzero(pc.fill_null(mask, False))
    return int(found[0].as_py())
