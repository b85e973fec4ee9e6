"""The fence's format-v3 writes (daemon/iceberg/_upstream/_v3_metadata.py,
_v3_manifests.py, _row_lineage.py): what blocks pyiceberg 0.12, what the fence does
instead, and that a change upstream turns red.

- Each private name or copied step the v3 modules rely on is pinned: breaking it (the
  module objects monkeypatched here; production has no hook) fails the contract in one
  line naming the fence module, and so does pyiceberg starting to write v3 itself (the
  fence's copies would then be moot).
- What pyiceberg blocks, seen on the installed version: v3 metadata, manifests and
  manifest lists refused; a v3 snapshot without ``added-rows`` drops the table's
  ``next-row-id``; manifests read as v2 lose every v3 field.
- The replacements: v3 metadata round-trips through pyiceberg's parser; the manifest
  list assigns row ids as the spec's example does; entries inherit their first_row_id
  as the spec says; merged and rewritten manifests keep row ids and vectors' blobs.

Real SQLite SQL catalog and local warehouse for the commits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyiceberg
import pyiceberg.manifest as manifest_module
import pyiceberg.serializers as serializers_module
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataV3, new_table_metadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, update_table_metadata
from pyiceberg.table.update.snapshot import _SnapshotProducer
from pyiceberg.types import LongType, NestedField, StringType
from support.maintenance_helpers import ENCODE, sql_catalog

from icespool.iceberg import (
    commit_files,
    encode_data_files,
    file_key,
    snapshot_entries,
    v3_value,
)
from icespool.iceberg._catalog import ensure_table
from icespool.iceberg._upstream import _contract
from icespool.iceberg._upstream._contract import UpstreamContractError, check_contract
from icespool.iceberg._upstream._v3_manifests import (
    ManifestListWriterV3,
    ManifestWriterV3,
    manifest_row_ids,
    read_entries,
)
from icespool.iceberg._upstream._v3_metadata import write_metadata

VERSION = pyiceberg.__version__
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
)


def _raised() -> str:
    with pytest.raises(UpstreamContractError) as caught:
        check_contract()
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- the pins turn red


def _commit_with_a_new_step(self: Any) -> Any:
    self.validate_row_lineage()  # a step _row_lineage's copy does not take
    return None


BREAKS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str, str]] = {
    "a step added to the snapshot commit": (
        lambda m: m.setattr(_SnapshotProducer, "_commit", _commit_with_a_new_step),
        "pyiceberg.table.update.snapshot._SnapshotProducer._commit changed its steps",
        "_row_lineage.py",
    ),
    "pyiceberg writing v3 metadata itself": (
        lambda m: m.setattr(TableMetadataV3, "model_dump_json", lambda self, **kw: "{}"),
        "pyiceberg.table.metadata.TableMetadataV3.model_dump_json no longer says",
        "_v3_metadata.py",
    ),
    "a step added to writing metadata files": (
        lambda m: m.setattr(
            serializers_module.ToOutputFile,
            "table_metadata",
            staticmethod(
                lambda metadata, output_file, overwrite=False: metadata.validate()  # type: ignore[attr-defined]
            ),
        ),
        "pyiceberg.serializers.ToOutputFile.table_metadata changed its steps",
        "_v3_metadata.py",
    ),
    "pyiceberg reading manifests as v3": (
        lambda m: m.setattr(manifest_module, "DEFAULT_READ_VERSION", 3),
        "pyiceberg.manifest.DEFAULT_READ_VERSION is 3, no longer 2",
        "_v3_manifests.py",
    ),
    "v3 data files laid out otherwise": (
        lambda m: m.setitem(
            manifest_module.DATA_FILE_TYPE,
            3,
            manifest_module.DATA_FILE_TYPE[2],
        ),
        "pyiceberg.manifest.DATA_FILE_TYPE gives v3 data files the fields",
        "_v3_manifests.py",
    ),
    "entry inheritance renamed": (
        lambda m: m.delattr(manifest_module, "_inherit_from_manifest"),
        "pyiceberg.manifest._inherit_from_manifest is gone",
        "_v3_manifests.py",
    ),
    "the list writer constructed otherwise": (
        lambda m: m.setattr(
            manifest_module.ManifestListWriter,
            "__init__",
            lambda self, output_file, meta: None,
        ),
        "pyiceberg.manifest.ManifestListWriter.__init__ no longer takes",
        "_v3_manifests.py",
    ),
    "merges reading entries otherwise": (
        lambda m: m.setattr(
            pyiceberg.table.update.snapshot._ManifestMergeManager,
            "_create_manifest",
            # Writes through the producer, reads the manifests by itself.
            lambda self, spec_id, manifest_bin: self._snapshot_producer.new_manifest_writer(
                [m.fetch_entries_as_v2() for m in manifest_bin]
            ),
        ),
        "_ManifestMergeManager._create_manifest no longer uses fetch_manifest_entry",
        "_row_lineage.py",
    ),
    "snapshots without added-rows": (
        lambda m: m.delitem(Snapshot.model_fields, "added_rows"),
        "pyiceberg.table.snapshots.Snapshot has no field added_rows",
        "_row_lineage.py",
    ),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_v3_pin_turns_red_when_pyiceberg_changes(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    assert _contract.problems() == []
    breaking, what, module = BREAKS[name]
    breaking(monkeypatch)
    message = _raised()
    assert message.startswith(f"pyiceberg {VERSION}: "), message
    assert what in message, message
    assert f"icespool's fence daemon/iceberg/_upstream/{module} needs an update" in message


# ---------------------------------------------------------------- what pyiceberg blocks


def _v3_metadata() -> Any:
    metadata = new_table_metadata(
        SCHEMA,
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "file:///tmp/v3",
        {"format-version": "3"},
    )
    assert isinstance(metadata, TableMetadataV3)
    return metadata


def test_what_blocks_pyiceberg_writing_v3(tmp_path: Path) -> None:
    """The installed pyiceberg refuses each piece a v3 commit writes, and a v3 snapshot
    it builds (no added-rows) drops the table's next-row-id."""
    metadata = _v3_metadata()
    assert metadata.next_row_id is None  # created without the field v3 requires
    with pytest.raises(NotImplementedError, match="Writing V3 is not yet supported"):
        metadata.model_dump_json()
    io = PyArrowFileIO()
    with pytest.raises(ValueError, match="Cannot write manifest for table version: 3"):
        write_manifest(
            3, UNPARTITIONED_PARTITION_SPEC, SCHEMA, io.new_output(f"{tmp_path}/m"), 1, "null"
        )
    with pytest.raises(ValueError, match="Cannot write manifest list for table version: 3"):
        write_manifest_list(3, io.new_output(f"{tmp_path}/l"), 1, None, 1, "null")
    with_id = metadata.model_copy(update={"next_row_id": 10})
    snapshot = Snapshot(
        snapshot_id=1, sequence_number=1, manifest_list="x", first_row_id=10, timestamp_ms=1
    )
    updated = update_table_metadata(with_id, (AddSnapshotUpdate(snapshot=snapshot),))
    assert updated.next_row_id is None  # type: ignore[union-attr]


def test_v3_metadata_round_trips_through_pyiceberg(tmp_path: Path) -> None:
    metadata = _v3_metadata()
    path = f"file://{tmp_path}/00000-x.metadata.json"
    write_metadata(metadata, PyArrowFileIO(), path)
    read = FromInputFile.table_metadata(PyArrowFileIO().new_input(path))
    assert isinstance(read, TableMetadataV3)
    assert read.next_row_id == 0  # the spec requires it; a new table starts at 0
    assert read.model_copy(update={"next_row_id": None}) == metadata


def test_the_manifest_list_assigns_row_ids_as_the_specs_example(tmp_path: Path) -> None:
    """The spec's Row Lineage example: next-row-id 1000; an existing manifest keeps its
    first_row_id (925); added1 (100 added, 25 existing) gets 1000, added2 (0, 100)
    1125, added3 (125, 25) 1225; the table's next-row-id becomes 1375."""

    def manifest(path: str, added: int, existing: int, snapshot: int) -> ManifestFile:
        return ManifestFile.from_args(
            manifest_path=path,
            manifest_length=1,
            partition_spec_id=0,
            content=ManifestContent.DATA,
            sequence_number=-1 if snapshot == 9 else 1,
            min_sequence_number=-1 if snapshot == 9 else 1,
            added_snapshot_id=snapshot,
            added_files_count=1,
            existing_files_count=1,
            deleted_files_count=0,
            added_rows_count=added,
            existing_rows_count=existing,
            deleted_rows_count=0,
        )

    deletes = manifest("deletes", 5, 0, 9)
    deletes = ManifestFile.from_args(**{**_fields(deletes), "content": ManifestContent.DELETES})
    listed = [
        manifest("existing", 75, 0, 1),
        manifest("added1", 100, 25, 9),
        deletes,
        manifest("added2", 0, 100, 9),
        manifest("added3", 125, 25, 9),
    ]
    output = PyArrowFileIO().new_output(f"file://{tmp_path}/snap.avro")
    with ManifestListWriterV3(output, 9, 1, 2, 1000, "null", {"existing": 925}) as writer:
        writer.add_manifests(listed)
    assert writer.assigned == {"added1": 1000, "added2": 1125, "added3": 1225}
    assert writer.next_row_id == 1375
    snapshot = Snapshot(
        snapshot_id=9, sequence_number=2, manifest_list=output.location, timestamp_ms=1
    )
    assert manifest_row_ids(PyArrowFileIO(), snapshot) == {
        "existing": 925,
        "added1": 1000,
        "deletes": None,
        "added2": 1125,
        "added3": 1225,
    }


def _fields(manifest: ManifestFile) -> dict[str, Any]:
    names = [f.name for f in manifest_module.MANIFEST_LIST_FILE_SCHEMAS[2].fields]
    return {name: manifest[i] for i, name in enumerate(names)}


def _data_file(path: str, count: int, **v3: Any) -> DataFile:
    data_file = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=pyiceberg.typedef.Record(),
        record_count=count,
        file_size_in_bytes=10,
        **v3,
    )
    data_file.spec_id = 0
    return data_file


def test_entries_inherit_their_first_row_id_as_the_spec_says(tmp_path: Path) -> None:
    """The spec's example manifest: data1 (EXISTING, first_row_id 800) keeps it; data2
    and data3 (ADDED, none) inherit 1000 and 1050; pyiceberg's own read loses them."""
    io = PyArrowFileIO()
    output = io.new_output(f"file://{tmp_path}/m.avro")
    writer = ManifestWriterV3(UNPARTITIONED_PARTITION_SPEC, SCHEMA, output, 9, "null")
    with writer:
        writer.add_entry(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.EXISTING,
                snapshot_id=1,
                sequence_number=1,
                file_sequence_number=1,
                data_file=_data_file("data1", 25, first_row_id=800),
            )
        )
        for path in ("data2", "data3"):
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=9, data_file=_data_file(path, 50)
                )
            )
    assert writer.unassigned == [("data2", 50), ("data3", 50)]
    manifest = writer.to_manifest_file()
    found = {
        e.data_file.file_path: v3_value(e.data_file, "first_row_id")
        for e in read_entries(io, manifest, 1000)
    }
    assert found == {"data1": 800, "data2": 1000, "data3": 1050}
    theirs = manifest.fetch_manifest_entry(io)
    assert all(v3_value(e.data_file, "first_row_id") is None for e in theirs)


@pytest.fixture
def v3_table(tmp_path: Path) -> Table:
    catalog = sql_catalog(tmp_path)
    schema = Schema(*SCHEMA.fields)
    properties = {"format-version": "3", "commit.manifest.min-count-to-merge": "2"}
    return ensure_table(catalog, "f.v3", schema, UNPARTITIONED_PARTITION_SPEC, properties, True)


def test_merged_manifests_keep_row_ids_and_vector_blobs(v3_table: Table) -> None:
    """Appends merging their manifests every commit, beside delete manifests of
    deletion vectors sharing one Puffin file: each file keeps the first_row_id it got,
    each vector its offset; the snapshots' row ids follow on."""
    from icespool.cdc import LiveData, Located
    from icespool.iceberg import encode_deletion_vectors

    table = v3_table
    given: dict[str, int] = {}
    for n in range(4):
        rows = pa.table({"id": list(range(n * 10, n * 10 + 10)), "name": ["x"] * 10})
        files = encode_data_files(table, rows.to_batches(), file_prefix=f"s{n}", **ENCODE)
        commit_files(table, files, segment_ids=[f"s{n}"], summary={})
        snapshot = table.metadata.current_snapshot()
        assert snapshot is not None and snapshot.first_row_id is not None
        for manifest, entries in snapshot_entries(table.io, snapshot, 3):
            if manifest.content != ManifestContent.DATA:
                continue
            for entry in entries:
                path = entry.data_file.file_path
                first = v3_value(entry.data_file, "first_row_id")
                assert given.setdefault(path, first) == first, "a file's row ids changed"
        if n == 1:
            live = {
                e.data_file.file_path: e.data_file
                for _, es in snapshot_entries(table.io, snapshot, 3)
                for e in es
            }
            located = Located(
                {path: pa.array([1, 2]).to_numpy() for path in live},
                {path: LiveData(f, 1, 0) for path, f in live.items()},
            )
            vectors = encode_deletion_vectors(table, located, file_prefix="s1-dv0")
            commit_files(table, list(vectors.values()), segment_ids=["dv"], summary={})
            written = {file_key(v) for v in vectors.values()}
    # The delete manifest was carried (and merged) on: both vectors, offsets intact.
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    vectors_now = {
        file_key(e.data_file)
        for m, es in snapshot_entries(table.io, snapshot, 3)
        if m.content == ManifestContent.DELETES
        for e in es
    }
    assert vectors_now == written and len(written) == 2
    assert sorted(given.values()) == [0, 10, 30, 60]
    assert table.metadata.next_row_id == 100  # type: ignore[union-attr]
