"""A table's merged state as Spark reads it: data files minus the deletes that apply.

pyiceberg 0.12's scan refuses tables with equality deletes, so the daemon's own
readers (tests, tools, the `icespool` CLI one day) read through this instead. It
follows Iceberg's rules: an equality delete of sequence number N removes the rows of
matching key in data files of sequence number < N; a position delete of sequence
number N removes a (file, position) of a data file of sequence number <= N.
Blocking; the whole table is read into memory (a reader for checks and small tables,
not a query engine).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

from daemon.schema import arrow_schema_for, conform

__all__ = ["read_merged"]

_SEQ = "_icespool_seq"
_ROW = "_icespool_row"
_FILE = "_icespool_file"
_POS = "_icespool_pos"


@dataclass(frozen=True, slots=True)
class _Live:
    file: DataFile
    sequence_number: int


def read_merged(table: Table) -> pa.Table:
    """The rows of ``table``'s current snapshot with every delete applied, in the
    table's current Arrow schema (columns matched by field id)."""
    schema = arrow_schema_for(table)
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return schema.empty_table()
    data: list[_Live] = []
    equality: list[_Live] = []
    positions: list[_Live] = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            sequence = entry.sequence_number
            if sequence is None:  # pragma: no cover - committed entries have one
                raise ValueError(f"{entry.data_file.file_path} has no sequence number")
            live = _Live(entry.data_file, sequence)
            content = entry.data_file.content
            if content == DataFileContent.DATA:
                data.append(live)
            elif content == DataFileContent.EQUALITY_DELETES:
                equality.append(live)
            else:
                positions.append(live)
    if not data:
        return schema.empty_table()
    batches = [
        conform(_read(table, live.file.file_path), schema, match_field_ids=True, drop_extra=True)
        for live in data
    ]
    parts = [pa.Table.from_batches([batch], schema=schema) for batch in batches]
    merged = pa.concat_tables(parts)
    counts = [batch.num_rows for batch in batches]
    seqs = np.repeat(np.array([live.sequence_number for live in data], np.int64), counts)
    files = np.repeat(np.arange(len(data), dtype=np.int64), counts)
    starts = np.repeat(np.cumsum([0, *counts[:-1]]), counts)
    keep = np.ones(merged.num_rows, dtype=bool)
    rows = np.arange(merged.num_rows, dtype=np.int64)
    _apply_positions(table, data, positions, files, rows - starts, seqs, keep)
    _apply_equality(table, merged, equality, seqs, rows, keep)
    return merged.filter(pa.array(keep))


def _read(table: Table, path: str) -> pa.RecordBatch:
    with table.io.new_input(path).open() as stream:
        read = pq.read_table(stream)
    if read.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=read.schema)
    return read.combine_chunks().to_batches()[0]


def _apply_equality(
    table: Table,
    merged: pa.Table,
    deletes: list[_Live],
    seqs: np.ndarray,
    rows: np.ndarray,
    keep: np.ndarray,
) -> None:
    schema = table.schema()
    by_ids: dict[tuple[int, ...], list[_Live]] = defaultdict(list)
    for live in deletes:
        by_ids[tuple(live.file.equality_ids or ())].append(live)
    for ids, group in by_ids.items():
        names = [schema.find_column_name(field_id) for field_id in ids]
        columns = [name for name in names if name is not None]
        if len(columns) != len(ids):  # pragma: no cover - a dropped key column
            raise ValueError(f"equality delete columns {ids} are not all in the table")
        key_schema = pa.schema([merged.schema.field(c) for c in columns])
        pieces = []
        for live in group:
            read = pa.Table.from_batches([_read(table, live.file.file_path)])
            keys = conform(read, key_schema, match_field_ids=True, drop_extra=True)
            pieces.append(
                pa.Table.from_batches([keys]).append_column(
                    _SEQ, pa.array(np.full(keys.num_rows, live.sequence_number, np.int64))
                )
            )
        right = pa.concat_tables(pieces)
        left = merged.select(columns).append_column(_ROW, pa.array(rows))
        left = left.append_column("_data_seq", pa.array(seqs))
        hits = left.join(right, keys=columns, join_type="inner", use_threads=False)
        # Iceberg: an equality delete applies to data of a LOWER sequence number.
        applied = hits.filter(pc.greater(hits.column(_SEQ), hits.column("_data_seq")))
        keep[applied.column(_ROW).to_numpy()] = False


def _apply_positions(
    table: Table,
    data: list[_Live],
    deletes: list[_Live],
    files: np.ndarray,
    positions: np.ndarray,
    seqs: np.ndarray,
    keep: np.ndarray,
) -> None:
    if not deletes:
        return
    index = {live.file.file_path: i for i, live in enumerate(data)}
    pieces = []
    for live in deletes:
        read = pa.Table.from_batches([_read(table, live.file.file_path)])
        paths = read.column("file_path").to_pylist()  # per delete, tests and tools only
        pieces.append(
            pa.table(
                {
                    _FILE: pa.array([index.get(p, -1) for p in paths], pa.int64()),
                    _POS: read.column("pos").cast(pa.int64()),
                    _SEQ: pa.array(np.full(read.num_rows, live.sequence_number, np.int64)),
                }
            )
        )
    right = pa.concat_tables(pieces)
    left = pa.table(
        {
            _FILE: pa.array(files),
            _POS: pa.array(positions),
            _ROW: pa.array(np.arange(len(files), dtype=np.int64)),
            "_data_seq": pa.array(seqs),
        }
    )
    hits = left.join(right, keys=[_FILE, _POS], join_type="inner", use_threads=False)
    # A position delete applies to data of a lower or EQUAL sequence number.
    applied = hits.filter(pc.greater_equal(hits.column(_SEQ), hits.column("_data_seq")))
    keep[applied.column(_ROW).to_numpy()] = False
