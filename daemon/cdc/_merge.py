"""Keyed changes -> the state they leave: last change per key, equality deletes applied.

Both are whole-batch pyarrow (group-by and joins), never a Python loop per row: a
flush of a million changes resolves in the time Arrow hashes its keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icespool.cdc._changes import OP_COLUMN, UPSERT, change_schema
from icespool.schema import conform

__all__ = ["Resolved", "apply_equality_deletes", "last_changes"]

_ROW = "_icespool_row"


@dataclass(frozen=True, slots=True)
class Resolved:
    """What one commit of an upsert table writes.

    ``upserts``: the surviving upserts (the last change of their key was an upsert),
    in the table's columns, in spool order of their last change. ``keys``: the key
    columns of EVERY key the changes touched, one row per key (each gets an equality
    delete, so every older row of the key goes, whatever its last change).
    ``changes``: how many changes were resolved (what the commit counts as records).
    """

    upserts: pa.Table
    keys: pa.Table
    changes: int


def last_changes(
    batches: Sequence[pa.RecordBatch], schema: pa.Schema, key: Sequence[str]
) -> Resolved:
    """Resolve ``batches`` (in spool order; rows of the table = upserts, or change
    batches) of an upsert table with Arrow ``schema`` and ``key``: per key, the last
    change wins.

    Batches spooled before a schema change are conformed by field id first (as the
    encoder does), so batches of several schema versions resolve together.
    """
    target = change_schema(schema, key)
    conformed = [
        conform(_with_op(batch), target, match_field_ids=True, drop_extra=True)
        for batch in batches
        if batch.num_rows
    ]
    changes = pa.Table.from_batches(conformed, schema=target)
    count = changes.num_rows
    if count == 0:
        empty = changes.drop_columns([OP_COLUMN])
        return Resolved(empty, empty.select(list(key)), 0)
    grouping = pa.table(
        {
            **{f"_k{i}": _groupable(changes.column(column)) for i, column in enumerate(key)},
            _ROW: _positions(count),
        }
    )
    names = [f"_k{i}" for i in range(len(key))]
    last = grouping.group_by(names, use_threads=False).aggregate([(_ROW, "max")])
    # Sorted: the output keeps spool order (deterministic files for a retried encode).
    rows = last.column(f"{_ROW}_max")
    winners = changes.take(rows.take(pc.sort_indices(rows)))
    upserts = winners.filter(pc.equal(winners.column(OP_COLUMN), UPSERT))
    return Resolved(
        upserts=upserts.drop_columns([OP_COLUMN]),
        keys=winners.select(list(key)),
        changes=count,
    )


def apply_equality_deletes(data: pa.Table, deletes: pa.Table, key: Sequence[str]) -> pa.Table:
    """The rows of ``data`` whose ``key`` columns match no row of ``deletes``.

    Only the set logic: which deletes apply to which data (Iceberg: equality deletes
    of sequence number N apply to data files of sequence number < N, in the same
    partition or anywhere for an unpartitioned spec) is the caller's choice. Key
    columns are required, so null-safe matching is not needed. Row order of ``data``
    is kept.
    """
    if data.num_rows == 0 or deletes.num_rows == 0:
        return data
    names = [f"_k{i}" for i in range(len(key))]
    left = pa.table(
        {
            **{n: _groupable(data.column(c)) for n, c in zip(names, key, strict=True)},
            _ROW: _positions(data.num_rows),
        }
    )
    right = pa.table(
        {
            n: _groupable(deletes.column(c)).cast(left.column(n).type)
            for n, c in zip(names, key, strict=True)
        }
    )
    kept = left.join(right, keys=names, join_type="left anti", use_threads=False)
    # A mask rather than take(kept rows): the join does not keep row order.
    survivors = pc.is_in(left.column(_ROW), value_set=kept.column(_ROW).combine_chunks())
    return data.filter(survivors)


def _with_op(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A spooled batch as a change batch: rows without an op column are upserts."""
    if OP_COLUMN in batch.schema.names:
        return batch
    ops = pa.array(np.full(batch.num_rows, UPSERT, dtype=np.int8))
    return batch.append_column(pa.field(OP_COLUMN, pa.int8(), nullable=False), ops)


def _positions(count: int) -> pa.Array:
    return pa.array(np.arange(count, dtype=np.int64))


def _groupable(column: pa.ChunkedArray) -> pa.ChunkedArray:
    # Hash kernels have no extension-type (uuid) kernels; the storage compares the same.
    if isinstance(column.type, pa.BaseExtensionType):
        return pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)
    return column
