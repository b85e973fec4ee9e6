"""The merged state of rows that Iceberg delete files apply to, vectorized.

Readers that apply deletes themselves (the daemon's compaction; pyiceberg 0.12's
``scan()`` refuses equality deletes) use these two masks, whole-batch pyarrow:

- `equality_delete_mask`: rows of data files (each row with its file's data sequence
  number) that equality deletes remove: a delete row of sequence number N removes the
  rows with equal values in its equality columns whose data sequence number is
  below N (Iceberg's rule; the scoping by partition is the caller's). Null equals null
  in equality deletes, as in Iceberg's Java readers.
- `position_delete_mask`: rows of ONE data file that position deletes name.

Both return a boolean "keep" mask the caller filters with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["DELETE_SEQUENCE_COLUMN", "equality_delete_mask", "position_delete_mask"]

#: Column of the delete table passed to `equality_delete_mask`: each delete row's
#: sequence number (int64).
DELETE_SEQUENCE_COLUMN: Final = "_icespool_delete_seq"
_ROW: Final = "_icespool_row"
_DATA_SEQ: Final = "_icespool_data_seq"
_NULL_FLAG: Final = "_icespool_null_"


def _null_safe_keys(
    data: pa.Table, deletes: pa.Table, key: Sequence[str]
) -> tuple[pa.Table, pa.Table, list[str]]:
    """Key columns a hash join can match null to null with: a column holding nulls on
    either side becomes (null flag, value filled with some value of the column)."""
    keys: list[str] = []
    for name in key:
        left, right = data.column(name), deletes.column(name)
        if not (left.null_count or right.null_count):
            keys.append(name)
            continue
        flag = f"{_NULL_FLAG}{name}"
        data = data.append_column(flag, pc.is_null(left))
        deletes = deletes.append_column(flag, pc.is_null(right))
        keys.append(flag)
        filler = pc.min(pa.chunked_array([*left.chunks, *right.chunks], type=left.type))
        if filler.is_valid:  # else every value is null: the flag alone is the key
            at = data.schema.get_field_index(name)
            data = data.set_column(at, name, pc.fill_null(left, filler))
            at = deletes.schema.get_field_index(name)
            deletes = deletes.set_column(at, name, pc.fill_null(right, filler))
            keys.append(name)
    return data, deletes, keys


def equality_delete_mask(
    data: pa.Table, data_sequence: pa.Array, deletes: pa.Table, key: Sequence[str]
) -> pa.Array:
    """Keep-mask of ``data`` (whose row i has data sequence number ``data_sequence[i]``)
    after the equality deletes ``deletes`` (columns ``key`` plus
    `DELETE_SEQUENCE_COLUMN`). Key columns must have the same types on both sides."""
    if len(data_sequence) != data.num_rows:
        raise ValueError(f"{len(data_sequence)} sequence numbers for {data.num_rows} rows")
    if not data.num_rows or not deletes.num_rows:
        return pa.array(np.ones(data.num_rows, dtype=bool))
    left = data.select(list(key)).append_column(_ROW, pa.array(np.arange(data.num_rows)))
    left = left.append_column(_DATA_SEQ, data_sequence.cast(pa.int64()))
    right = deletes.select([*key, DELETE_SEQUENCE_COLUMN])
    left, right, keys = _null_safe_keys(left, right, key)
    # One row per deleted key (its newest delete): the join then yields at most one
    # match per data row, whatever the number of delete files naming the key.
    newest = right.group_by(keys, use_threads=False).aggregate([(DELETE_SEQUENCE_COLUMN, "max")])
    newest = newest.rename_columns(
        [DELETE_SEQUENCE_COLUMN if c.endswith("_max") else c for c in newest.column_names]
    )
    joined = left.select([*keys, _ROW, _DATA_SEQ]).join(
        newest, keys, join_type="inner", use_threads=False
    )
    hit = pc.greater(joined.column(DELETE_SEQUENCE_COLUMN), joined.column(_DATA_SEQ))
    removed = pc.filter(joined.column(_ROW), hit).to_numpy()
    keep = np.ones(data.num_rows, dtype=bool)
    keep[removed] = False
    return pa.array(keep)


def position_delete_mask(num_rows: int, positions: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Keep-mask of a data file of ``num_rows`` rows after deleting row ``positions``
    (0-based positions in the file; out-of-range ones are ignored, as Iceberg does)."""
    keep = np.ones(num_rows, dtype=bool)
    if len(positions):
        values = np.asarray(positions.to_numpy(zero_copy_only=False), dtype=np.int64)
        values = values[(values >= 0) & (values < num_rows)]
        keep[values] = False
    return pa.array(keep)
