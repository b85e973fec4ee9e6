"""Subclasses ``_OverwriteFiles``: the producer of a ``replace`` snapshot (compaction),
which pyiceberg 0.12 cannot commit; what it changes is in ``ReplaceFiles``' doc.

Relies on (checked by ``_contract``): ``_OverwriteFiles`` with ``_summary(snapshot_properties)``
and ``_manifests()`` to override; the producer's ``_transaction``, ``_target_branch``,
``_io``, ``_snapshot_id``, ``_compression``, ``_added_data_files`` and
``_deleted_data_files``.
"""

from __future__ import annotations

from collections import defaultdict

from pyiceberg.exceptions import (
    ValidationException,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table.snapshots import (
    OPERATION,
    Operation,
    Summary,
)
from pyiceberg.table.update.snapshot import (
    _OverwriteFiles,
)
from pyiceberg.typedef import EMPTY_DICT

from icespool.iceberg._upstream._delete_manifest import DeleteManifestWriter

__all__ = ["ReplaceFiles"]


class ReplaceFiles(_OverwriteFiles):
    """pyiceberg's overwrite producer, committing a snapshot with operation ``replace``.

    A rewrite that keeps every row must be a ``replace``: Spark Structured Streaming
    skips ``replace`` snapshots but fails on ``overwrite`` ones. pyiceberg 0.12's
    ``update_snapshot_summaries`` refuses REPLACE, so the summary (totals, partition
    summaries) is computed as for an overwrite, then relabelled.

    What it changes in ``_OverwriteFiles`` (pinned <0.13; tests/maintenance cover it):

    - files to remove may be delete files: their entries go to delete manifests, and a
      delete manifest holding one is rewritten as a delete manifest (pyiceberg writes
      every manifest as a data manifest and only removes data files);
    - the added files may carry an explicit data sequence number
      (``data_sequence_number``, what Iceberg's ``use-starting-sequence-number`` does
      for Spark's rewrites): the sequence number of the snapshot the rewrite read, so
      equality deletes committed since still apply to the rewritten rows;
    - every manifest is read (no partition pruning: pyiceberg's prunes everything away
      on an unpartitioned spec once a delete file is removed), and manifests left with
      only removed entries by an earlier rewrite are not carried on.

    "Missing required files to delete" (ValidationException) is raised when a file to
    remove is not live in the parent snapshot.
    """

    data_sequence_number: int | None = None
    #: The snapshot's operation: ``replace`` for rewrites that keep every row; an upsert
    #: that rewrites a file with its changes applied is an ``overwrite``.
    label: Operation = Operation.REPLACE

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        overwrite = super()._summary(snapshot_properties).model_dump()
        overwrite.pop(OPERATION)
        return Summary(self.label, **overwrite)

    def _writer(self, spec_id: int, content: ManifestContent) -> ManifestWriter:
        if content == ManifestContent.DATA:
            return self.new_manifest_writer(self.spec(spec_id))
        metadata = self._transaction.table_metadata
        return (
            DeleteManifestWriter(
                spec=self.spec(spec_id),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            )
            if metadata.format_version == 2
            else self.new_manifest_writer(self.spec(spec_id))
        )

    def _live_manifests(self) -> list[ManifestFile]:
        snapshot = self._transaction.table_metadata.snapshot_by_name(name=self._target_branch)
        if snapshot is None:
            return []
        return [
            m
            for m in snapshot.manifests(io=self._io)
            if m.has_added_files() or m.has_existing_files()
        ]

    def _manifests(self) -> list[ManifestFile]:
        manifests = self._live_manifests()
        kept: list[ManifestFile] = []
        removed: dict[tuple[int, ManifestContent], list[ManifestEntry]] = defaultdict(list)
        for manifest in manifests:
            entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            staying = [e for e in entries if e.data_file not in self._deleted_data_files]
            if len(staying) == len(entries):
                kept.append(manifest)
                continue
            key = (manifest.partition_spec_id, manifest.content)
            removed[key] += [e for e in entries if e.data_file in self._deleted_data_files]
            if staying:
                with self._writer(*key) as writer:
                    for entry in staying:
                        writer.add_entry(
                            ManifestEntry.from_args(
                                status=ManifestEntryStatus.EXISTING,
                                snapshot_id=entry.snapshot_id,
                                sequence_number=entry.sequence_number,
                                file_sequence_number=entry.file_sequence_number,
                                data_file=entry.data_file,
                            )
                        )
                kept.append(writer.to_manifest_file())
        found = {entry.data_file.file_path for entries in removed.values() for entry in entries}
        if missing := sorted(
            f.file_path for f in self._deleted_data_files if f.file_path not in found
        ):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        written: list[ManifestFile] = []
        # Added data files go to a manifest of the current spec; added delete files
        # (equality deletes turned into position deletes) to delete manifests of the
        # spec of the data files they name.
        added: dict[tuple[int, ManifestContent], list[DataFile]] = defaultdict(list)
        current = self._transaction.table_metadata.default_spec_id
        for data_file in self._added_data_files:
            if data_file.content == DataFileContent.DATA:
                added[(current, ManifestContent.DATA)].append(data_file)
            else:
                added[(data_file.spec_id, ManifestContent.DELETES)].append(data_file)
        for (spec_id, content), files in added.items():
            with self._writer(spec_id, content) as writer:
                for data_file in files:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=(
                                self.data_sequence_number
                                if content == ManifestContent.DATA
                                else None
                            ),
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            written.append(writer.to_manifest_file())
        for (spec_id, content), entries in removed.items():
            with self._writer(spec_id, content) as writer:
                for entry in entries:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.DELETED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
            written.append(writer.to_manifest_file())
        return written + kept
