"""Overrides ``_SnapshotProducer._commit``, ``new_manifest_writer`` and
``fetch_manifest_entry`` for format-v3 tables: the snapshot producers of the fence
(``MergeAppend``, ``MergeRowDelta``, ``ReplaceFiles``) commit to v3 tables, with the row
lineage v3 requires.

pyiceberg 0.12 cannot: ``write_manifest`` and ``write_manifest_list`` raise for v3, its
``_commit`` sets the snapshot's ``first-row-id`` but not its ``added-rows`` (so the
table's ``next-row-id`` is dropped to null by ``AddSnapshotUpdate``), and it reads every
manifest as v2 (a merge or rewrite of manifests would drop each data file's row ids and
each deletion vector's blob). ``RowLineage``, first in a producer's bases, gives v3
tables:

- manifests written by ``ManifestWriterV3`` / ``DeleteManifestWriterV3``, entries read
  back with their v3 fields and inherited row ids (``_v3_manifests.read_entries``), so
  merged and rewritten manifests keep them;
- the manifest list written by ``ManifestListWriterV3`` (each new data manifest gets a
  ``first_row_id``; the parent's keep theirs), the snapshot's ``first-row-id`` the
  table's ``next-row-id`` and its ``added-rows`` the row ids the list handed out (what
  ``AddSnapshotUpdate`` then adds to ``next-row-id``);
- ``first_row_ids``: after ``commit()``, the ``first_row_id`` each data file this
  snapshot added inherits (by path), for callers that must know a row's ``_row_id``.

Tables of format 1 and 2 take pyiceberg's path unchanged.

Relies on (checked by ``_contract``): ``_SnapshotProducer._commit``'s steps (pinned
exactly: this is a copy with the v3 list writer), ``_new_manifest_list_file_name``,
``fetch_manifest_entry(manifest, discard_deleted)`` being what ``_ManifestMergeManager``
reads merged manifests through, and the producer's ``_transaction``, ``_io``,
``_snapshot_id``, ``_parent_snapshot_id``, ``_compression``, ``_target_branch``,
``_written_manifest_lists`` and ``commit_uuid``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import ManifestEntry, ManifestFile, ManifestWriter
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    UpdatesAndRequirements,
)
from pyiceberg.table.update.snapshot import _new_manifest_list_file_name, _SnapshotProducer

from icespool.iceberg._upstream._delete_manifest import DeleteManifestWriter
from icespool.iceberg._upstream._v3_manifests import (
    DeleteManifestWriterV3,
    ManifestListWriterV3,
    ManifestWriterV3,
    inherited_row_ids,
    manifest_row_ids,
    read_entries,
)
from icespool.iceberg._upstream._v3_metadata import next_row_id

__all__ = ["RowLineage"]

#: The first format version with row lineage (and deletion vectors).
LINEAGE_FORMAT = 3


@dataclass
class _Lineage:
    """One producer's row-lineage state."""

    #: The first_row_id of each manifest of the parent snapshot (None: not read yet).
    row_ids: dict[str, int | None] | None = None
    #: The v3 manifests this producer wrote, in order.
    writers: list[ManifestWriterV3] = field(default_factory=list)
    #: After the commit: the first_row_id each added data file inherits, by path.
    first_row_ids: dict[str, int] = field(default_factory=dict)


class RowLineage(_SnapshotProducer[Any]):
    """A snapshot producer that commits to v3 tables too (module doc). Put it first in
    the bases of a subclass of one of pyiceberg's producers."""

    _lineage_state: _Lineage | None = None

    @property
    def _lineage(self) -> _Lineage:
        if self._lineage_state is None:
            self._lineage_state = _Lineage()
        return self._lineage_state

    @property
    def first_row_ids(self) -> dict[str, int]:
        """The ``first_row_id`` each data file this snapshot added inherits, by path
        (empty before ``commit()`` and for tables without row lineage)."""
        return self._lineage.first_row_ids

    def _has_lineage(self) -> bool:
        return self._transaction.table_metadata.format_version >= LINEAGE_FORMAT

    def _parent_row_ids(self) -> dict[str, int | None]:
        lineage = self._lineage
        if lineage.row_ids is None:
            metadata = self._transaction.table_metadata
            parent = (
                metadata.snapshot_by_id(self._parent_snapshot_id)
                if self._parent_snapshot_id is not None
                else None
            )
            lineage.row_ids = manifest_row_ids(self._io, parent)
        return lineage.row_ids

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        if not self._has_lineage():
            return super().new_manifest_writer(spec)
        writer = ManifestWriterV3(
            spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
        )
        self._lineage.writers.append(writer)
        return writer

    def delete_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        """A writer of a delete manifest (new output, tracked like the others)."""
        writer = DeleteManifestWriterV3 if self._has_lineage() else DeleteManifestWriter
        return writer(
            spec, self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
        )

    def fetch_manifest_entry(
        self, manifest: ManifestFile, discard_deleted: bool = True
    ) -> list[ManifestEntry]:
        if not self._has_lineage():
            return super().fetch_manifest_entry(manifest, discard_deleted)
        return read_entries(
            self._io,
            manifest,
            self._parent_row_ids().get(manifest.manifest_path),
            discard_deleted=discard_deleted,
        )

    def _commit(self) -> UpdatesAndRequirements:
        if not self._has_lineage():
            return super()._commit()
        # pyiceberg's _commit (pinned <0.13: the same steps), with the v3 list writer and
        # the snapshot's row ids.
        new_manifests = self._manifests()
        metadata = self._transaction.table_metadata
        next_sequence_number = metadata.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        file_name = _new_manifest_list_file_name(
            snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid
        )
        location_provider = self._transaction._table.location_provider()
        manifest_list_file_path = location_provider.new_metadata_location(file_name)
        self._written_manifest_lists.append(manifest_list_file_path)
        first_row_id = next_row_id(metadata)
        with ManifestListWriterV3(
            output_file=self._io.new_output(manifest_list_file_path),
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            sequence_number=next_sequence_number,
            first_row_id=first_row_id,
            compression=self._compression,
            row_ids=self._parent_row_ids(),
        ) as writer:
            writer.add_manifests(new_manifests)
        self._lineage.first_row_ids = inherited_row_ids(writer.assigned, self._lineage.writers)
        snapshot = Snapshot(
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=manifest_list_file_path,
            sequence_number=next_sequence_number,
            summary=summary,
            schema_id=metadata.current_schema_id,
            first_row_id=first_row_id,
            added_rows=writer.next_row_id - first_row_id,
        )
        add_snapshot_update = AddSnapshotUpdate(snapshot=snapshot)
        if self._target_branch is None:
            return (add_snapshot_update,), ()
        return (
            (
                add_snapshot_update,
                SetSnapshotRefUpdate(
                    snapshot_id=self._snapshot_id,
                    ref_name=self._target_branch,
                    type=SnapshotRefType.BRANCH,
                    max_ref_age_ms=None,
                    max_snapshot_age_ms=None,
                    min_snapshots_to_keep=None,
                ),
            ),
            (
                AssertRefSnapshotId(
                    snapshot_id=metadata.refs[self._target_branch].snapshot_id
                    if self._target_branch in metadata.refs
                    else None,
                    ref=self._target_branch,
                ),
            ),
        )
