"""Manifests and manifest lists of format-v3 tables: read with their v3 fields, written
with them (pyiceberg 0.12 reads every manifest as v2, dropping them, and refuses to write
v3 ones: ``write_manifest`` / ``write_manifest_list`` raise).

A v3 data file carries ``first_row_id`` (the ``_row_id`` of its first row), a deletion
vector ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes`` (where
its blob lies in a Puffin file several vectors may share); a v3 manifest list gives each
data manifest a ``first_row_id``. pyiceberg reads manifests and lists with its v2
schemas (``DEFAULT_READ_VERSION``): rewritten from such a read, a v3 table's manifests
would lose every file's row ids and every vector's blob. Here:

- `read_entries`: ``ManifestFile.fetch_manifest_entry`` with the v3 schema, and each data
  file's ``first_row_id`` inherited as the spec says (the manifest's, plus the record
  counts of the files before it that had none); `manifest_row_ids`: the ``first_row_id``
  of each manifest of a snapshot (its v3 manifest list).
- `ManifestWriterV3` / `DeleteManifestWriterV3`: ``ManifestWriterV2`` writing the v3
  schema with every v3 field, and noting, per manifest, the data files whose row ids are
  inherited (`unassigned`), so a commit knows each added file's ``first_row_id``.
- `ManifestListWriterV3`: ``ManifestListWriterV2`` writing the v3 list, assigning a
  ``first_row_id`` to each data manifest without one (Java's rule: the next id, then
  added plus existing rows on).
- `v3_value` / `with_v3_values`: a data file's v3 fields. pyiceberg builds a DataFile by
  position from its struct (``Record._bind``), v2 files with 16 values, v3 ones with 20;
  positions are looked up by name in ``DATA_FILE_TYPE[3]``.

Relies on (checked by ``_contract``): ``DEFAULT_READ_VERSION`` being 2 (pyiceberg reading
v3 itself makes these readers moot), ``fetch_manifest_entry`` / ``read_manifest_list``
reading through ``AvroFile`` with ``MANIFEST_ENTRY_SCHEMAS`` / ``MANIFEST_LIST_FILE_SCHEMAS``,
``_inherit_from_manifest(entry, manifest)``, ``ManifestWriter.new_writer`` writing
``_with_partition`` records, ``ManifestListWriter(format_version, output_file, meta)``
and ``ManifestListWriterV2.prepare_manifest``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, AvroCompressionCodec
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV2,
    ManifestWriterV2,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import TableVersion

from icespool.iceberg._upstream._delete_manifest import DeleteContent

__all__ = [
    "V3_FILE_FIELDS",
    "DeleteManifestWriterV3",
    "ManifestListWriterV3",
    "ManifestWriterV3",
    "file_key",
    "inherited_row_ids",
    "manifest_row_ids",
    "read_entries",
    "snapshot_entries",
    "v3_value",
    "with_v3_values",
]

_V3: Final = 3
_FILE_FIELDS: Final = {field.name: i for i, field in enumerate(DATA_FILE_TYPE[_V3].fields)}
_LIST_FIELDS: Final = {
    field.name: i for i, field in enumerate(MANIFEST_LIST_FILE_SCHEMAS[_V3].fields)
}
_V3_FILE_LENGTH: Final = len(DATA_FILE_TYPE[_V3].fields)
_V3_LIST_LENGTH: Final = len(MANIFEST_LIST_FILE_SCHEMAS[_V3].fields)
#: The v3-only fields of a data file (after the 16 of v2).
V3_FILE_FIELDS: Final = (
    "first_row_id",
    "referenced_data_file",
    "content_offset",
    "content_size_in_bytes",
)


def v3_value(data_file: DataFile, name: str) -> Any:
    """The v3 field ``name`` of ``data_file`` (None when it was built or read as v2)."""
    position = _FILE_FIELDS[name]
    return data_file[position] if len(data_file) > position else None


def with_v3_values(data_file: DataFile, **values: Any) -> DataFile:
    """``data_file`` with all 20 v3 fields (those given set, the others kept or None),
    its partition spec id kept."""
    unknown = set(values) - set(V3_FILE_FIELDS)
    if unknown:
        raise ValueError(f"not v3 data file fields: {sorted(unknown)}")
    data = [data_file[i] for i in range(len(data_file))]
    data += [None] * (_V3_FILE_LENGTH - len(data))
    for name, value in values.items():
        data[_FILE_FIELDS[name]] = value
    copy = DataFile(*data)
    with contextlib.suppress(AttributeError):  # built without one: nothing to keep
        copy.spec_id = data_file.spec_id
    return copy


def file_key(data_file: DataFile) -> tuple[str, int | None]:
    """What tells ``data_file`` apart in a snapshot: its path, and for a deletion vector
    its blob's offset (the vectors of several data files may share one Puffin file)."""
    return data_file.file_path, v3_value(data_file, "content_offset")


def _list_value(manifest: ManifestFile, name: str) -> Any:
    position = _LIST_FIELDS[name]
    return manifest[position] if len(manifest) > position else None


def manifest_row_ids(io: FileIO, snapshot: Snapshot | None) -> dict[str, int | None]:
    """Each manifest of ``snapshot``'s (v3) manifest list, by path: its ``first_row_id``
    (None for delete manifests and those written before the table had row lineage)."""
    if snapshot is None:
        return {}
    with AvroFile[ManifestFile](
        io.new_input(snapshot.manifest_list),
        MANIFEST_LIST_FILE_SCHEMAS[_V3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return {m.manifest_path: _list_value(m, "first_row_id") for m in reader}


def read_entries(
    io: FileIO, manifest: ManifestFile, first_row_id: int | None, *, discard_deleted: bool = True
) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)`` with every v3 field, and the
    ``first_row_id`` of each data file without one inherited from ``first_row_id`` (the
    manifest's, from its manifest list: `manifest_row_ids`): that value plus the record
    counts of the live data files before it that had none (what Java's reader does)."""
    next_row_id = first_row_id
    entries: list[ManifestEntry] = []
    with AvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[_V3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        for entry in reader:
            deleted = entry.status == ManifestEntryStatus.DELETED
            data_file = entry.data_file
            if (
                next_row_id is not None
                and not deleted
                and data_file.content == DataFileContent.DATA
                and v3_value(data_file, "first_row_id") is None
            ):
                data_file[_FILE_FIELDS["first_row_id"]] = next_row_id
                next_row_id += data_file.record_count
            if not discard_deleted or not deleted:
                entries.append(_inherit_from_manifest(entry, manifest))
    return entries


def snapshot_entries(
    io: FileIO,
    snapshot: Snapshot,
    format_version: int,
    *,
    discard_deleted: bool = True,
    added_by: int | None = None,
) -> Iterator[tuple[ManifestFile, list[ManifestEntry]]]:
    """Each manifest of ``snapshot`` (of a table of ``format_version``) with its
    entries: pyiceberg's read below v3, `read_entries` from v3 on (every v3 field, row
    ids inherited). ``added_by``: only the manifests that snapshot added."""
    row_ids = manifest_row_ids(io, snapshot) if format_version >= _V3 else None
    for manifest in snapshot.manifests(io):
        if added_by is not None and manifest.added_snapshot_id != added_by:
            continue
        if row_ids is None:
            entries = manifest.fetch_manifest_entry(io, discard_deleted=discard_deleted)
        else:
            first_row_id = row_ids.get(manifest.manifest_path)
            entries = read_entries(io, manifest, first_row_id, discard_deleted=discard_deleted)
        yield manifest, entries


class ManifestWriterV3(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing the v3 schema with every v3 field of the
    files it is given (v2-shaped ones get them as None).

    ``unassigned``: the data files this manifest gives row ids by inheritance (no
    ``first_row_id`` of their own, not deleted), as (path, record count) in file order:
    with the manifest's ``first_row_id`` they give each file's."""

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        avro_compression: AvroCompressionCodec,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, avro_compression)
        self.path = output_file.location
        self.unassigned: list[tuple[str, int]] = []

    @property
    def version(self) -> TableVersion:
        return _V3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        schema = self._with_partition(_V3)
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=schema,
            record_schema=schema,
            schema_name="manifest_entry",
            metadata=self._meta,
        )

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        entry = super().prepare_entry(entry)
        data_file = entry.data_file
        if len(data_file) < _V3_FILE_LENGTH:
            entry = ManifestEntry.from_args(
                status=entry.status,
                snapshot_id=entry.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=with_v3_values(data_file),
            )
        if (
            entry.status != ManifestEntryStatus.DELETED
            and data_file.content == DataFileContent.DATA
            and v3_value(data_file, "first_row_id") is None
        ):
            self.unassigned.append((data_file.file_path, data_file.record_count))
        return entry


class DeleteManifestWriterV3(DeleteContent, ManifestWriterV3):
    """A v3 manifest of delete files: equality deletes and deletion vectors (with their
    ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes``)."""


class ManifestListWriterV3(ManifestListWriterV2):
    """pyiceberg's v2 manifest list writer, writing the v3 list: each data manifest
    without a ``first_row_id`` gets the next row id, which then moves on by the
    manifest's added and existing rows (Java's assignment; the spec's "simple and valid
    approach"). ``row_ids``: the ``first_row_id`` of the manifests the parent snapshot
    listed (`manifest_row_ids`: pyiceberg's ManifestFile lost it), kept.

    After writing: ``next_row_id`` is the table's next row id, ``assigned`` the
    ``first_row_id`` given to each manifest (by path)."""

    def __init__(
        self,
        output_file: OutputFile,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int,
        compression: AvroCompressionCodec,
        row_ids: Mapping[str, int | None],
    ) -> None:
        ManifestListWriter.__init__(
            self,
            format_version=_V3,
            output_file=output_file,
            meta={
                "snapshot-id": str(snapshot_id),
                "parent-snapshot-id": str(parent_snapshot_id)
                if parent_snapshot_id is not None
                else "null",
                "sequence-number": str(sequence_number),
                "first-row-id": str(first_row_id),
                "format-version": str(_V3),
                AVRO_CODEC_KEY: compression,
            },
        )
        self._commit_snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self._row_ids = row_ids
        self.next_row_id = first_row_id
        self.assigned: dict[str, int] = {}

    def __enter__(self) -> ManifestListWriterV3:
        schema = MANIFEST_LIST_FILE_SCHEMAS[_V3]
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=schema,
            file_schema=schema,
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        prepared = super().prepare_manifest(manifest_file)
        data = [prepared[i] for i in range(len(prepared))]
        data += [None] * (_V3_LIST_LENGTH - len(data))
        first_row_id = self._row_ids.get(prepared.manifest_path)
        if prepared.content == ManifestContent.DATA and first_row_id is None:
            first_row_id = self.next_row_id
            self.assigned[prepared.manifest_path] = first_row_id
            self.next_row_id += (prepared.added_rows_count or 0) + (
                prepared.existing_rows_count or 0
            )
        elif prepared.content != ManifestContent.DATA:
            first_row_id = None
        data[_LIST_FIELDS["first_row_id"]] = first_row_id
        return ManifestFile(*data)


def inherited_row_ids(
    assigned: Mapping[str, int], written: Sequence[ManifestWriterV3]
) -> dict[str, int]:
    """The ``first_row_id`` each data file of the ``written`` manifests inherits, by its
    path, once the manifest list gave those manifests theirs (``assigned``)."""
    found: dict[str, int] = {}
    for writer in written:
        next_row_id = assigned.get(writer.path)
        if next_row_id is None:
            continue  # merged away, or never listed
        for path, count in writer.unassigned:
            found[path] = next_row_id
            next_row_id += count
    return found
