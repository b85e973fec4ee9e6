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
apply; format-v3 manifests read with pyiceberg's own v3 schema, deletion vectors with
pyiceberg's Puffin reader). It refuses a key that is live twice.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import Footer, PuffinFile
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from icespool.cdc import UPSERT, KeyIndex, key_values, live_files, with_ops
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
    "entries",
    "feed_change_set",
    "merged_rows",
    "v3_field",
    "vector_positions",
    "versioned_row",
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


def entries(table: Table, manifest: ManifestFile) -> list[ManifestEntry]:
    """The live entries of ``manifest``, read with pyiceberg's schema of the table's
    format version (v3: with referenced_data_file, content_offset...; pyiceberg's own
    read drops them), sequence numbers inherited from the manifest."""
    version = table.metadata.format_version
    with AvroFile[ManifestEntry](
        table.io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[version],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        found = [e for e in reader if e.status != ManifestEntryStatus.DELETED]
    for entry in found:
        if entry.sequence_number is None:
            entry.sequence_number = manifest.sequence_number
    return found


def v3_field(data_file: DataFile, name: str) -> Any:
    """A v3 field of an entry read by `entries` (None when absent)."""
    position = [f.name for f in DATA_FILE_TYPE[3].fields].index(name)
    return data_file[position] if len(data_file) > position else None


def vector_positions(table: Table, delete_file: DataFile) -> tuple[str, list[int]]:
    """The data file a deletion vector names and the positions it deletes, through
    pyiceberg's Puffin reader: the blob at the entry's content offset, alone in a
    Puffin file of its own."""
    with table.io.new_input(delete_file.file_path).open() as stream:
        content = stream.read()
    offset = v3_field(delete_file, "content_offset")
    length = v3_field(delete_file, "content_size_in_bytes")
    (blob,) = [b for b in PuffinFile(content).footer.blobs if b.offset == offset]
    assert blob.length == length and blob.type == "deletion-vector-v1"
    footer = Footer(blobs=[blob.model_copy(update={"offset": 4})]).model_dump_json().encode()
    alone = b"PFA1" + content[offset : offset + length] + b"PFA1" + footer
    alone += len(footer).to_bytes(4, "little") + bytes(4) + b"PFA1"
    (vector,) = deletion_vectors_from_puffin_file(PuffinFile(alone))
    assert vector.referenced_data_file == v3_field(delete_file, "referenced_data_file")
    return vector.referenced_data_file, [int(p) for p in vector.to_vector().to_pylist()]


def delete_files(table: Table) -> list[DataFile]:
    """The live delete files of ``main`` (v3 ones with their v3 fields)."""
    table.refresh()
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return []
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DELETES
        for entry in entries(table, manifest)
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
    vectors: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for manifest in snapshot.manifests(table.io):
        spec_id = manifest.partition_spec_id
        for entry in entries(table, manifest):
            f = entry.data_file
            seq = entry.sequence_number or 0
            if f.content == DataFileContent.DATA:
                data.append((f, seq, spec_id))
                continue
            if f.file_format == FileFormat.PUFFIN:
                referenced, deleted = vector_positions(table, f)
                assert referenced not in vectors, f"two deletion vectors name {referenced}"
                vectors[referenced] = [(pos, seq) for pos in deleted]
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
        # Where a deletion vector applies, position delete files do not (it holds theirs).
        named = vectors.get(f.file_path) or positions.get(f.file_path, ())
        gone = {pos for pos, dseq in named if seq <= dseq}
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


def versioned_row(region: str, key: int, version: int) -> dict[str, Any]:
    """A row of the (region, id, payload, version) upsert tables the Spark tests feed."""
    return {
        "region": region,
        "id": key,
        "payload": f"{region}-{key}-v{version}",
        "version": version,
    }


async def feed_change_set(
    writer: Any,
    touched: Sequence[tuple[str, int]],
    ops: Sequence[int],
    version: int,
    state: dict[tuple[Any, ...], dict[str, Any]],
) -> None:
    """One change set through the daemon's table ``writer`` (append, then flush: one
    commit): each touched (region, id) upserted as `versioned_row` or deleted, by
    ``ops``; ``state`` follows it (the last change per key wins)."""
    rows = pa.Table.from_pylist([versioned_row(r, i, version) for r, i in touched])
    await writer.append(with_ops(rows, pa.array(ops, pa.int8()), ["region", "id"]))
    result = await writer.flush()
    assert result.records == len(touched), result
    for (r, i), op in zip(touched, ops, strict=True):
        if op == UPSERT:
            state[(r, i)] = versioned_row(r, i, version)
        else:
            state.pop((r, i), None)


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
