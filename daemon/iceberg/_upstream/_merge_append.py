"""Subclasses ``_MergeAppendFiles`` (and drives ``_ManifestMergeManager``): the append
every daemon commit makes, with merge properties read as Iceberg reads them, and a row
delta (data and equality-delete files in one snapshot) pyiceberg 0.12 does not have.

Relies on (checked by ``_contract``): ``_FastAppendFiles.__init__(operation, transaction,
io, branch, snapshot_properties)``; ``_MergeAppendFiles.__init__`` setting
``_merge_enabled``, ``_min_count_to_merge`` and ``_target_size_bytes``, then merging in
``_manifests()``; ``_ManifestMergeManager(target_size_bytes, min_count_to_merge,
merge_enabled, snapshot_producer)`` asking its producer only for ``new_manifest_writer``;
the producer's ``_added_data_files``, ``_snapshot_id``, ``_compression`` and
``_transaction``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final, cast

from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
)
from pyiceberg.table.update.snapshot import (
    _FastAppendFiles,
    _ManifestMergeManager,
    _MergeAppendFiles,
)
from pyiceberg.utils.properties import property_as_bool

from icespool.iceberg._properties import int_property, warn_bad_property
from icespool.iceberg._upstream._delete_manifest import DeleteManifestWriter

__all__ = ["DeleteMerging", "MergeAppend", "MergeRowDelta"]


# Iceberg's defaults for the merge properties (Java's TableProperties: what Spark's
# commits to the same table apply). pyiceberg 0.12 leaves merging off by default.
_MERGE_ENABLED_DEFAULT: Final = True
_MIN_MERGE_COUNT_DEFAULT: Final = TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT
_MERGE_TARGET_DEFAULT: Final = TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT


class MergeAppend(_MergeAppendFiles):
    """pyiceberg's merge append, with the merge properties read as Iceberg reads them.

    Unset ``commit.manifest-merge.enabled`` means merging, as in Java and Spark
    (pyiceberg 0.12's default is off: a table another engine created, which lacks the
    key, would get one more manifest per daemon commit for ever). A value that is no
    value (``min-count-to-merge = "abc"``; any engine may set any string, Iceberg
    parses them only when it commits) means the default: these properties only tune
    merging, and pyiceberg's ValueError would reject every commit of the table as the
    data's fault (its segments struck and quarantined).
    """

    def __init__(
        self,
        transaction: Transaction,
        io: FileIO,
        snapshot_properties: dict[str, str],
        operation: Operation = Operation.APPEND,
    ) -> None:
        # _MergeAppendFiles.__init__ is this, then its strict parsing of the three.
        _FastAppendFiles.__init__(
            self,
            operation=operation,
            transaction=transaction,
            io=io,
            snapshot_properties=snapshot_properties,
            branch=MAIN_BRANCH,
        )
        metadata = transaction.table_metadata
        key = TableProperties.MANIFEST_MERGE_ENABLED
        try:
            enabled = property_as_bool(metadata.properties, key, _MERGE_ENABLED_DEFAULT)
        except ValueError:
            enabled = _MERGE_ENABLED_DEFAULT
            value = metadata.properties[key]
            problem = f"table property {key}={value!r} is not a boolean"
            warn_bad_property(metadata.location, key, value, problem, enabled)
        self._merge_enabled = enabled
        # Any integer, as Iceberg takes them: they only tune merging.
        self._min_count_to_merge = int_property(
            metadata.properties,
            TableProperties.MANIFEST_MIN_MERGE_COUNT,
            _MIN_MERGE_COUNT_DEFAULT,
            table=metadata.location,
            minimum=None,
        )
        self._target_size_bytes = int_property(
            metadata.properties,
            TableProperties.MANIFEST_TARGET_SIZE_BYTES,
            _MERGE_TARGET_DEFAULT,
            table=metadata.location,
            minimum=None,
        )


class MergeRowDelta(MergeAppend):
    """`MergeAppend` that also adds delete files (an upsert table's equality deletes)
    in the same snapshot, as Iceberg's RowDelta does.

    Data files go through the merge append as always; delete files get a manifest of
    their own (content DELETES). pyiceberg's merge manager merges data manifests only
    and carries delete manifests over as they are: one more manifest per commit until
    a compaction drops the deletes (or for ever where none runs). The delete manifests
    are therefore merged by the same rules, through a manager whose writer writes
    delete manifests. Every file of the snapshot gets its sequence number: an
    equality delete applies to data files of LOWER sequence numbers only, so the rows
    added in the same snapshot survive it.
    """

    def _manifests(self) -> list[ManifestFile]:
        files = self._added_data_files
        deletes = [f for f in files if f.content != DataFileContent.DATA]
        # The summary (computed after this) counts every file; the data manifest
        # written by the merge append must hold the data files only.
        self._added_data_files = [f for f in files if f.content == DataFileContent.DATA]
        try:
            manifests = super()._manifests()
        finally:
            self._added_data_files = files
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        old = [m for m in manifests if m.content != ManifestContent.DATA]
        if not deletes:
            return manifests  # nothing new: the delete manifests stay as they were
        # The new manifest first: the manager treats the first one as this commit's.
        merging = _ManifestMergeManager(
            target_size_bytes=self._target_size_bytes,
            min_count_to_merge=self._min_count_to_merge,
            merge_enabled=self._merge_enabled,
            snapshot_producer=cast(Any, DeleteMerging(self)),
        )
        return [*data, *merging.merge_manifests([*self._delete_manifests(deletes), *old])]

    def delete_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return DeleteManifestWriter(
            spec,
            self.schema(),
            self.new_manifest_output(),  # tracked: abandoned and tidied like the others
            self._snapshot_id,
            self._compression,
        )

    def _delete_manifests(self, deletes: Sequence[DataFile]) -> list[ManifestFile]:
        """One manifest per partition spec of ``deletes``: a position delete carries the
        spec of the data files it names, which may predate the table's current one."""
        metadata = self._transaction.table_metadata
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for delete_file in deletes:
            by_spec[getattr(delete_file, "spec_id", metadata.default_spec_id)].append(delete_file)
        specs = metadata.specs()
        manifests = []
        for spec_id, files in by_spec.items():
            writer = self.delete_manifest_writer(specs[spec_id])
            with writer:
                for delete_file in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=delete_file,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        return manifests


class DeleteMerging:
    """The row delta as pyiceberg's manifest merge manager sees it, except that the
    manifests it writes are delete manifests (the manager only asks for a writer)."""

    def __init__(self, producer: MergeRowDelta) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return self._producer.delete_manifest_writer(spec)
