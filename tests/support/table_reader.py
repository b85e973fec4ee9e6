"""Iceberg tables read back without the daemon's code: append tables by pyiceberg's scan,
upsert tables by a merge-on-read written here from Iceberg's spec (pyiceberg 0.12 plans
no scan over equality deletes), on pyiceberg's manifests and pyarrow's Parquet reader.

The spec's rules: a data file's live rows are its rows minus the positions that position
delete files of a data sequence number at least its own name for it, minus the rows whose
equality-field values an equality delete file of a greater data sequence number holds,
where that delete file is in the data file's partition (spec and values) or unpartitioned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

__all__ = ["MergedRows", "append_ids", "merged_rows"]


def append_ids(catalog: Catalog, name: str) -> Counter[int]:
    """How many times each id is in the table (a full scan: a missing file fails it)."""
    table = catalog.load_table(name)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    return Counter(int(i) for i in ids)


@dataclass(frozen=True)
class _Entry:
    file: DataFile
    sequence: int
    spec: int


@dataclass(frozen=True)
class MergedRows:
    """An upsert table's live rows by key, and the keys found more than once."""

    rows: dict[int, dict[str, Any]]
    doubled: list[int]


def merged_rows(catalog: Catalog, name: str) -> MergedRows:
    table = catalog.load_table(name)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return MergedRows({}, [])
    entries: dict[DataFileContent, list[_Entry]] = {c: [] for c in DataFileContent}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            sequence = entry.sequence_number
            assert sequence is not None, entry
            entries[entry.data_file.content].append(
                _Entry(entry.data_file, sequence, manifest.partition_spec_id)
            )
    positions = _position_deletes(table, entries[DataFileContent.POSITION_DELETES])
    equality = [
        (e, _read(table, e.file.file_path)) for e in entries[DataFileContent.EQUALITY_DELETES]
    ]
    rows: dict[int, dict[str, Any]] = {}
    doubled: list[int] = []
    for data in entries[DataFileContent.DATA]:
        live = _read(table, data.file.file_path)
        dead = {
            pos
            for sequence, pos in positions.get(data.file.file_path, ())
            if sequence >= data.sequence
        }
        keep = [i not in dead for i in range(live.num_rows)]
        for delete, keys in equality:
            if delete.sequence > data.sequence and _applies(delete, data):
                names = [table.schema().find_column_name(i) for i in delete.file.equality_ids or []]
                gone = pc.is_in(live.column(names[0]), keys.column(names[0]))
                keep = [k and not g for k, g in zip(keep, gone.to_pylist(), strict=True)]
        for row in live.filter(pa.array(keep, pa.bool_())).to_pylist():
            key = int(row["id"])
            if key in rows:
                doubled.append(key)
            rows[key] = {"id": key, "v": row.get("v"), "seq": row.get("seq")}
    return MergedRows(rows, sorted(doubled))


def _applies(delete: _Entry, data: _Entry) -> bool:
    if len(delete.file.partition) == 0:
        return True  # an unpartitioned (global) equality delete
    return delete.spec == data.spec and delete.file.partition == data.file.partition


def _position_deletes(table: Table, deletes: list[_Entry]) -> dict[str, list[tuple[int, int]]]:
    """Data file path -> (the delete file's data sequence number, position) it names."""
    found: dict[str, list[tuple[int, int]]] = {}
    for delete in deletes:
        read = _read(table, delete.file.file_path)
        paths, positions = read.column("file_path").to_pylist(), read.column("pos").to_pylist()
        for path, pos in zip(paths, positions, strict=True):
            found.setdefault(str(path), []).append((delete.sequence, int(pos)))
    return found


def _read(table: Table, path: str) -> pa.Table:
    with table.io.new_input(path).open() as stream:
        return pq.read_table(stream)
