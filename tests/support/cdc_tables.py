"""Upsert tables with equality and position deletes, and their merged state, for tests.

``commit_changes`` commits one change set the way an upsert commit does (design: CDC.md),
through the daemon's own encoders and ``commit_files``: data files of the surviving
upserts plus equality-delete files on the key columns for EVERY key the change set
touched, in ONE snapshot, so the set's own rows survive (same sequence number) and
every older row of those keys is deleted. ``commit_position_deletes`` commits a
position-delete file (written here with pyarrow: the daemon writes none) naming rows
of data files.

``merged_rows`` is the test's independent reader: plain Python over every live file,
applying Iceberg's rules row by row (no code shared with the daemon's vectorized
apply). It refuses a key that is live twice.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from icespool.cdc import KeyIndex, key_values, live_files
from icespool.iceberg import (
    DELETE_FILE_MARK,
    commit_files,
    encode_data_files,
    encode_equality_deletes,
    refresh_table,
)
from icespool.schema import arrow_schema_for, conform
from icespool.spool import new_uuid7
from support.maintenance_helpers import ENCODE, local_path

__all__ = [
    "assert_index_exact",
    "commit_changes",
    "commit_position_delete_across",
    "commit_position_deletes",
    "delete_files",
    "merged_rows",
    "write_position_delete",
]


# The spec's position delete schema (pyiceberg's POSITIONAL_DELETE_SCHEMA types pos as int).
_POSITION_SCHEMA = Schema(
    NestedField(2147483546, "file_path", StringType(), required=True),
    NestedField(2147483545, "pos", LongType(), required=True),
)


def _commit(table: Table, files: Sequence[DataFile], segment: str) -> int:
    """One snapshot adding ``files`` (data and delete files) through the daemon's commit."""
    refresh_table(table)
    return commit_files(table, list(files), segment_ids=[segment], summary={}).snapshot_id


def _write_delete_file(
    table: Table,
    rows: pa.Table,
    schema: Schema,
    *,
    content: DataFileContent,
    partition: Record,
    partition_key: Any,
    name: str,
    equality_ids: list[int] | None,
) -> DataFile:
    path = table.location_provider().new_data_location(
        data_file_name=name, partition_key=partition_key
    )
    with table.io.new_output(path).create(overwrite=True) as stream:
        with pq.ParquetWriter(stream, rows.schema) as writer:
            writer.write_table(rows)
        metadata = writer.writer.metadata
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, {}),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    data_file = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=equality_ids,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    data_file.spec_id = table.metadata.default_spec_id
    return data_file


def commit_changes(
    table: Table,
    upserts: pa.Table | None,
    deletes: pa.Table | None,
    key: Sequence[str],
) -> int:
    """Commit upserts (full rows) and deletes (key columns) as one upsert snapshot, the
    way the daemon's upsert commit does (its encoders and ``commit_files``); return its
    id. A key in both counts as upserted (the upsert came last)."""
    schema = table.metadata.schema()
    target = arrow_schema_for(table)
    segment = new_uuid7()
    files: list[DataFile] = []
    touched: list[pa.Table] = []
    if upserts is not None and upserts.num_rows:
        upserts = pa.Table.from_batches([conform(upserts, target)])
        files += encode_data_files(table, upserts.to_batches(), file_prefix=segment, **ENCODE)
        touched.append(upserts.select(list(key)))
    if deletes is not None and deletes.num_rows:
        touched.append(deletes.select(list(key)))
    key_arrow = arrow_schema_for(schema.select(*key))
    keys = pa.concat_tables([pa.Table.from_batches([conform(t, key_arrow)]) for t in touched])
    # Distinct keys (by row: Arrow's hash kernels take no extension type such as uuid).
    seen: set[tuple[Any, ...]] = set()
    unique = [
        row
        for row in keys.to_pylist()
        if (k := tuple(row.values())) not in seen and not seen.add(k)
    ]
    keys = pa.Table.from_pylist(unique, schema=keys.schema)
    files += encode_equality_deletes(
        table,
        [conform(keys, key_arrow)],
        key,
        file_prefix=f"{segment}{DELETE_FILE_MARK}",
        **ENCODE,
    )
    return _commit(table, files, segment)


def write_position_delete(table: Table, data_file: DataFile, positions: Iterable[int]) -> DataFile:
    """A position-delete file (file-scoped: one data file) deleting ``positions``."""
    arrow = arrow_schema_for(_POSITION_SCHEMA)
    values = sorted(positions)
    rows = pa.Table.from_arrays(
        [pa.array([data_file.file_path] * len(values), pa.string()), pa.array(values, pa.int64())],
        schema=arrow,
    )
    spec = table.metadata.spec()
    key = None
    if not spec.is_unpartitioned():
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

        key = PartitionKey(
            field_values=[
                PartitionFieldValue(field=f, value=v)
                for f, v in zip(spec.fields, data_file.partition, strict=True)
            ],
            partition_spec=spec,
            schema=table.metadata.schema(),
        )
    return _write_delete_file(
        table,
        rows,
        _POSITION_SCHEMA,
        content=DataFileContent.POSITION_DELETES,
        partition=data_file.partition,
        partition_key=key,
        name=f"{new_uuid7()}{DELETE_FILE_MARK}-00000-00000.parquet",
        equality_ids=None,
    )


def commit_position_delete_across(table: Table, deletes: Mapping[str, Iterable[int]]) -> int:
    """Commit ONE position-delete file naming rows of several data files (in one
    partition), as an engine writing partition-scoped deletes does."""
    table.refresh()
    live = live_files(table.io, table.metadata, table.metadata.current_snapshot())  # type: ignore[arg-type]
    arrow = arrow_schema_for(_POSITION_SCHEMA)
    pairs = sorted((path, pos) for path, positions in deletes.items() for pos in positions)
    rows = pa.Table.from_arrays(
        [pa.array([p for p, _ in pairs], pa.string()), pa.array([q for _, q in pairs], pa.int64())],
        schema=arrow,
    )
    first = live.data[pairs[0][0]].file
    written = _write_delete_file(
        table,
        rows,
        _POSITION_SCHEMA,
        content=DataFileContent.POSITION_DELETES,
        partition=first.partition,
        partition_key=None,
        name=f"{new_uuid7()}{DELETE_FILE_MARK}-00000-00000.parquet",
        equality_ids=None,
    )
    return _commit(table, [written], new_uuid7())


def commit_position_deletes(table: Table, deletes: Mapping[str, Iterable[int]]) -> int:
    """Commit one position-delete file per data file path in ``deletes``."""
    table.refresh()
    live = live_files(table.io, table.metadata, table.metadata.current_snapshot())  # type: ignore[arg-type]
    written = [write_position_delete(table, live.data[p].file, pos) for p, pos in deletes.items()]
    return _commit(table, written, new_uuid7())


def delete_files(table: Table) -> list[DataFile]:
    """The live delete files of ``main``."""
    table.refresh()
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return []
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def merged_rows(table: Table, key: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table's merged state by key, row by row (the test's independent reader)."""
    table.refresh()
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return {}
    schema = table.metadata.schema()
    specs = table.metadata.specs()
    data: list[tuple[DataFile, int, int]] = []
    equality: list[tuple[int, int, Record, bool, list[str], set[tuple[Any, ...]]]] = []
    positions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for manifest in snapshot.manifests(table.io):
        spec_id = manifest.partition_spec_id
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            seq = entry.sequence_number or 0
            if f.content == DataFileContent.DATA:
                data.append((f, seq, spec_id))
                continue
            with table.io.new_input(f.file_path).open() as stream:
                rows = pq.read_table(stream).to_pylist()
            if f.content == DataFileContent.POSITION_DELETES:
                for row in rows:
                    positions[row["file_path"]].append((row["pos"], seq))
            else:
                names = [schema.find_column_name(i) or "" for i in f.equality_ids or ()]
                keys = {tuple(row[n] for n in names) for row in rows}
                is_global = specs[spec_id].is_unpartitioned()
                equality.append((seq, spec_id, f.partition, is_global, names, keys))
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f, seq, spec_id in data:
        with table.io.new_input(f.file_path).open() as stream:
            rows = pq.read_table(stream).to_pylist()
        gone = {pos for pos, dseq in positions.get(f.file_path, ()) if seq <= dseq}
        for pos, row in enumerate(rows):
            if pos in gone:
                continue
            if any(
                eseq > seq
                and (is_global or (espec == spec_id and epart == f.partition))
                and tuple(row[n] for n in names) in keys
                for eseq, espec, epart, is_global, names, keys in equality
            ):
                continue
            k = tuple(row[n] for n in key)
            if k in state:
                raise AssertionError(f"key {k} is live twice: {state[k]} and {row}")
            state[k] = row
    return state


def assert_index_exact(index: KeyIndex, table: Table, key: Sequence[str]) -> None:
    """The index holds one row per live row of the table, and each row it names holds
    the key it is found under."""
    table.refresh()
    index.sync(table)
    expected = merged_rows(table, key)
    wanted = [tuple(k) for k in expected]
    located = index.locate(key_values([pa.array([k[i] for k in wanted]) for i in range(len(key))]))
    assert located.rows == len(expected) == index.rows()
    seen: Counter[tuple[Any, ...]] = Counter()
    for path, positions in located.positions.items():
        read = pq.read_table(local_path(path)).take(pa.array(positions))
        for row in read.to_pylist():
            seen[tuple(row[c] for c in key)] += 1
    assert seen == Counter(wanted)
