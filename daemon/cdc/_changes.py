"""The change-batch contract every source and the writer share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa

from icespool.schema import OP_COLUMN

__all__ = ["DELETE", "OP_COLUMN", "UPSERT", "change_schema", "with_ops"]

UPSERT: Final = 0
DELETE: Final = 1
_OP_FIELD: Final = pa.field(OP_COLUMN, pa.int8(), nullable=False)


def change_schema(schema: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """``schema`` (a table's Arrow schema) as a change batch holds it: key columns as
    they are, every other column nullable (a delete has only its key), then the op."""
    keys = set(key)
    missing = keys.difference(schema.names)
    if missing:
        raise ValueError(f"key columns {sorted(missing)} are not in the schema")
    fields = [f if f.name in keys else f.with_nullable(True) for f in schema]
    return pa.schema([*fields, _OP_FIELD], metadata=schema.metadata)


def with_ops(batch: pa.RecordBatch | pa.Table, ops: pa.Array, key: Sequence[str]) -> pa.RecordBatch:
    """``batch`` (a table's columns, in its schema) plus ``ops`` (int8, one per row)
    as one change batch in `change_schema` order."""
    if len(ops) != batch.num_rows:
        raise ValueError(f"{len(ops)} ops for {batch.num_rows} rows")
    if isinstance(batch, pa.Table):
        batch = (
            batch.combine_chunks().to_batches()[0]
            if batch.num_rows
            else (pa.RecordBatch.from_pylist([], schema=batch.schema))
        )
    schema = change_schema(batch.schema, key)
    columns = [*batch.columns, ops.cast(pa.int8())]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
