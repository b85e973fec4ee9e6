"""A table's merged state as Spark reads it: data files minus the deletes that apply.

pyiceberg 0.12's scan refuses tables with equality deletes, so the daemon's own
readers (tests, tools) read through this instead. Which delete applies to which data
file is `icespool.cdc._deletes`' (Iceberg's scoping rules, shared with compaction);
this applies them to the rows: position deletes and deletion vectors by (file,
position), equality deletes by key, each as one join over the whole table. Blocking;
the whole table is read into memory (a reader for checks and small tables, not a
query engine).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from icespool.cdc._deletes import LiveDelete, live_files
from icespool.cdc._files import read_positions
from icespool.iceberg import LiveData
from icespool.schema import arrow_schema_for, conform

__all__ = ["read_merged"]

_ROW = "_icespool_row"
_DATA = "_icespool_data"
_DELETE = "_icespool_delete"
_POS = "_icespool_pos"


def read_merged(table: Table) -> pa.Table:
    """The rows of ``table``'s current snapshot with every delete applied, in the
    table's current Arrow schema (columns matched by field id)."""
    schema = arrow_schema_for(table)
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return schema.empty_table()
    live = live_files(table.io, table.metadata, snapshot)
    data = list(live.data.values())
    if not data:
        return schema.empty_table()
    batches = [
        conform(_read(table, d.file.file_path), schema, match_field_ids=True, drop_extra=True)
        for d in data
    ]
    merged = pa.concat_tables([pa.Table.from_batches([b], schema=schema) for b in batches])
    counts = [b.num_rows for b in batches]
    rows = pa.table(
        {
            _DATA: pa.array(np.repeat(np.arange(len(data), dtype=np.int64), counts)),
            _POS: pa.array(
                np.arange(merged.num_rows) - np.repeat(np.cumsum([0, *counts[:-1]]), counts)
            ),
            _ROW: pa.array(np.arange(merged.num_rows, dtype=np.int64)),
        }
    )
    index = {d.key: j for j, d in enumerate(live.deletes)}
    # The (data file, delete file) pairs Iceberg's rules say apply.
    pairs = [(i, index[d.key]) for i, one in enumerate(data) for d in live.deletes_for(one)]
    if not pairs:
        return merged
    applying = pa.table(
        {
            _DATA: pa.array([i for i, _ in pairs], pa.int64()),
            _DELETE: pa.array([j for _, j in pairs], pa.int64()),
        }
    )
    keep = np.ones(merged.num_rows, dtype=bool)
    used = sorted({j for _, j in pairs})
    positions = [j for j in used if not live.deletes[j].is_equality]
    equality = [j for j in used if live.deletes[j].is_equality]
    _apply_positions(table, data, live.deletes, positions, rows, applying, keep)
    _apply_equality(table, merged, live.deletes, equality, rows, applying, keep)
    return merged.filter(pa.array(keep))


def _read(table: Table, path: str) -> pa.RecordBatch:
    with table.io.new_input(path).open() as stream:
        read = pq.read_table(stream)
    if read.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=read.schema)
    return read.combine_chunks().to_batches()[0]


def _drop(hits: pa.Table, applying: pa.Table, keep: np.ndarray) -> None:
    """Unkeep the rows of ``hits`` whose (data file, delete file) pair applies."""
    applied = hits.join(applying, keys=[_DATA, _DELETE], join_type="inner", use_threads=False)
    keep[applied.column(_ROW).to_numpy()] = False


def _apply_positions(
    table: Table,
    data: list[LiveData],
    deletes: list[LiveDelete],
    which: list[int],
    rows: pa.Table,
    applying: pa.Table,
    keep: np.ndarray,
) -> None:
    if not which:
        return
    files = {d.file.file_path: i for i, d in enumerate(data)}
    pieces = []
    for j in which:
        for path, positions in read_positions(table.io, deletes[j].file).items():
            pieces.append(
                pa.table(
                    {
                        _DATA: pa.array(np.full(len(positions), files.get(path, -1), np.int64)),
                        _POS: pa.array(positions, pa.int64()),
                        _DELETE: pa.array(np.full(len(positions), j, np.int64)),
                    }
                )
            )
    if not pieces:
        return
    named = pa.concat_tables(pieces)
    hits = rows.join(named, keys=[_DATA, _POS], join_type="inner", use_threads=False)
    _drop(hits, applying, keep)


def _apply_equality(
    table: Table,
    merged: pa.Table,
    deletes: list[LiveDelete],
    which: list[int],
    rows: pa.Table,
    applying: pa.Table,
    keep: np.ndarray,
) -> None:
    schema = table.schema()
    by_ids: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for j in which:
        by_ids[tuple(deletes[j].file.equality_ids or ())].append(j)
    for ids, group in by_ids.items():
        names = [schema.find_column_name(field_id) for field_id in ids]
        columns = [name for name in names if name is not None]
        if len(columns) != len(ids):  # pragma: no cover - a dropped key column
            raise ValueError(f"equality delete columns {ids} are not all in the table")
        key_schema = pa.schema([merged.schema.field(c) for c in columns])
        pieces = []
        for j in group:
            read = pa.Table.from_batches([_read(table, deletes[j].path)])
            keys = conform(read, key_schema, match_field_ids=True, drop_extra=True)
            pieces.append(
                pa.Table.from_batches([keys]).append_column(
                    _DELETE, pa.array(np.full(keys.num_rows, j, np.int64))
                )
            )
        left = merged.select(columns)
        for name in (_DATA, _ROW):
            left = left.append_column(name, rows.column(name))
        hits = left.join(
            pa.concat_tables(pieces), keys=columns, join_type="inner", use_threads=False
        )
        _drop(hits.select([_DATA, _DELETE, _ROW]), applying, keep)
