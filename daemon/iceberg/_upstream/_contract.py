"""What the fence relies on in pyiceberg, checked when the fence is imported.

Each module of the fence extends or replaces a piece of pyiceberg that is not its public
API. ``PINS`` lists, per module, what it relies on: a private name exists, takes the
parameters it took, is the kind of object it was (a property, a cached property), uses
the attributes it used (read from its code object, no call), and, where the fence copies
a step sequence (``update_table_metadata``), the set of steps and update types it
mirrors, so an upstream addition turns red here instead of silently diverging. The
version must lie in the range the suite ran against.

``check_contract`` raises ``UpstreamContractError`` with one line: the library, the
version, what changed, and the fence module to update (the machinery is shared with the
aiokafka fence: ``icespool._upstream_contract``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

from icespool import _upstream_contract as contract
from icespool._upstream_contract import (
    Pin,
    UpstreamContractError,
    accepts,
    columns,
    equals,
    fields,
    handles,
    has,
    kind,
    params,
    private_attributes,
    says,
    uses,
    uses_exactly,
)

__all__ = [
    "FENCE",
    "HIVE_PINS",
    "LIBRARY",
    "PINS",
    "TESTED_RANGE",
    "Pin",
    "UpstreamContractError",
    "check_contract",
]

LIBRARY: Final = "pyiceberg"
#: The versions the suite ran against: >=0.12, <0.13 (pyproject.toml pins the same).
TESTED_RANGE: Final = ((0, 12), (0, 13))
FENCE: Final = contract.Fence(LIBRARY, "daemon/iceberg/_upstream/", TESTED_RANGE)


_UPDATE = "pyiceberg.table.update"
_SNAPSHOT = "pyiceberg.table.update.snapshot"

#: Every update type ``_apply_table_update`` handles in 0.12 (``object``: its fallback).
UPDATE_TYPES: Final = (
    "object",
    "AddPartitionSpecUpdate",
    "AddSchemaUpdate",
    "AddSnapshotUpdate",
    "AddSortOrderUpdate",
    "AssignUUIDUpdate",
    "RemovePartitionSpecsUpdate",
    "RemovePartitionStatisticsUpdate",
    "RemovePropertiesUpdate",
    "RemoveSchemasUpdate",
    "RemoveSnapshotRefUpdate",
    "RemoveSnapshotsUpdate",
    "RemoveStatisticsUpdate",
    "SetCurrentSchemaUpdate",
    "SetDefaultSortOrderUpdate",
    "SetDefaultSpecUpdate",
    "SetLocationUpdate",
    "SetPartitionStatisticsUpdate",
    "SetPropertiesUpdate",
    "SetSnapshotRefUpdate",
    "SetStatisticsUpdate",
    "UpgradeFormatVersionUpdate",
)

#: What pyiceberg 0.12 says when asked to write v3 metadata.
_NO_V3_WRITES: Final = (
    "Writing V3 is not yet supported, see: https://github.com/apache/iceberg-python/issues/1551"
)
#: The fields a v3 data file has after those of v2 (``_v3_manifests`` reads them by name).
_V3_DATA_FILE_FIELDS: Final = (
    "first_row_id",
    "referenced_data_file",
    "content_offset",
    "content_size_in_bytes",
)


def _v3_file_fields() -> contract.Check:
    """``DATA_FILE_TYPE`` (format version -> data file struct): v3 is v2's fields, then
    the v3 ones, so a v2-built DataFile is a prefix of a v3 one."""

    def check(obj: object) -> str | None:
        try:
            v2 = [f.name for f in obj[2].fields]  # type: ignore[index]
            v3 = [f.name for f in obj[3].fields]  # type: ignore[index]
        except (KeyError, TypeError, AttributeError):
            return "no longer maps format versions 2 and 3 to structs"
        if v3 != [*v2, *_V3_DATA_FILE_FIELDS]:
            return f"gives v3 data files the fields {v3}"
        return None

    return check


PINS: Final[tuple[Pin, ...]] = (
    # _metadata.py: update_table_metadata, step by step
    Pin(
        "_metadata.py",
        f"{_UPDATE}.update_table_metadata",
        (
            params("base_metadata", "updates", "enforce_validation", "metadata_location"),
            # The steps apply_updates repeats: a new call upstream is a step it lacks.
            uses_exactly(
                "TableMetadataUtil",
                "_TableMetadataUpdateContext",
                "_apply_table_update",
                "_update_table_metadata_log",
                "astimezone",
                "check_compatible",
                "datetime",
                "datetime_to_millis",
                "has_changes",
                "last_updated_ms",
                "model_copy",
                "model_dump",
                "now",
                "parse_obj",
                "schema",
                "sort_order",
                "spec",
            ),
        ),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._apply_table_update",
        (params("update", "base_metadata", "context"), handles(*UPDATE_TYPES)),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._TableMetadataUpdateContext",
        (has("add_update", "has_changes"),),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._update_table_metadata_log",
        (params("base_metadata", "metadata_location", "last_updated_ms"),),
    ),
    Pin("_metadata.py", f"{_UPDATE}.RemoveSnapshotsUpdate", (fields("snapshot_ids"),)),
    Pin("_metadata.py", f"{_UPDATE}.RemoveSnapshotRefUpdate", (fields("ref_name"),)),
    Pin("_metadata.py", f"{_UPDATE}.RemoveStatisticsUpdate", (fields("snapshot_id"),)),
    # _transaction.py: Staging, send, stage, abandon, tidy, staged_snapshot_ids
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction.__init__",
        (
            params("self", "table"),
            uses("_table", "_updates", "_requirements", "_snapshot_producers"),
        ),
    ),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction._stage",
        (params("self", "updates", "requirements"), uses("_updates", "_requirements")),
    ),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction._apply",
        (params("self", "updates", "requirements"), uses("_stage")),
    ),
    Pin("_transaction.py", "pyiceberg.table.Transaction.table_metadata", (kind(property),)),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Table._do_commit",
        (params("self", "updates", "requirements"),),
    ),
    Pin(
        "_transaction.py",
        f"{_SNAPSHOT}._SnapshotProducer.__init__",
        (
            uses(
                "_transaction",
                "_io",
                "_snapshot_id",
                "_added_data_files",
                "_deleted_data_files",
                "_written_manifests",
                "_compression",
                "_target_branch",
            ),
        ),
    ),
    Pin(
        "_transaction.py",
        f"{_SNAPSHOT}._SnapshotProducer._clean_all_uncommitted",
        (params("self"),),
    ),
    # _merge_append.py: MergeAppend, MergeRowDelta, DeleteMerging
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._FastAppendFiles.__init__",
        (accepts("operation", "transaction", "io", "snapshot_properties", "branch"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._MergeAppendFiles.__init__",
        (uses("_merge_enabled", "_min_count_to_merge", "_target_size_bytes"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._MergeAppendFiles._process_manifests",
        (uses("_ManifestMergeManager", "merge_manifests"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._ManifestMergeManager.__init__",
        (
            params(
                "self",
                "target_size_bytes",
                "min_count_to_merge",
                "merge_enabled",
                "snapshot_producer",
            ),
        ),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._ManifestMergeManager._create_manifest",
        (uses("_snapshot_producer", "new_manifest_writer"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._SnapshotProducer._manifests",
        (params("self"),),
    ),
    # _delete_manifest.py: DeleteManifestWriter
    Pin(
        "_delete_manifest.py",
        "pyiceberg.manifest.ManifestWriterV2.__init__",
        (params("self", "spec", "schema", "output_file", "snapshot_id", "avro_compression"),),
    ),
    Pin("_delete_manifest.py", "pyiceberg.manifest.ManifestWriterV2._meta", (kind(property),)),
    Pin(
        "_delete_manifest.py",
        "pyiceberg.manifest.ManifestWriter._with_partition",
        (params("self", "format_version"),),
    ),
    # _replace.py: ReplaceFiles
    Pin(
        "_replace.py",
        f"{_SNAPSHOT}._SnapshotProducer._summary",
        (params("self", "snapshot_properties"),),
    ),
    Pin("_replace.py", f"{_SNAPSHOT}._OverwriteFiles", (has("_manifests", "delete_data_file"),)),
    # _summary.py
    Pin(
        "_summary.py",
        "pyiceberg.table.snapshots.Summary",
        (private_attributes("_additional_properties"),),
    ),
    # _partition_key.py
    Pin(
        "_partition_key.py",
        "pyiceberg.partitioning.PartitionKey.partition",
        (kind(functools.cached_property),),
    ),
    # _sql.py and _refresh.py
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._parse_metadata_version",
        (params("metadata_location"),),
    ),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._load_file_io",
        (params("self", "properties", "location"),),
    ),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._write_metadata",
        (params("metadata", "io", "metadata_path"),),
    ),
    Pin("_sql.py", "pyiceberg.catalog.sql.SqlCatalog._iceberg_type_filter", (params("self"),)),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.IcebergTables",
        (
            columns(
                "catalog_name",
                "table_namespace",
                "table_name",
                "metadata_location",
                "previous_metadata_location",
            ),
        ),
    ),
    # _rest.py
    Pin(
        "_rest.py",
        "pyiceberg.catalog.rest.RestCatalog._config_headers",
        (params("self", "session"),),
    ),
    Pin(
        "_rest.py",
        "pyiceberg.catalog.rest.RestCatalog._create_session",
        (uses("_config_headers"),),
    ),
    # _v3_metadata.py: v3 metadata files
    Pin(
        "_v3_metadata.py",
        "pyiceberg.serializers.ToOutputFile.table_metadata",
        (
            params("metadata", "output_file", "overwrite"),
            uses_exactly(
                "Compressor",
                "Config",
                "UTF8",
                "bytes_compressor",
                "create",
                "encode",
                "get_bool",
                "get_compressor",
                "location",
                "model_dump_json",
                "write",
            ),
        ),
    ),
    Pin(
        "_v3_metadata.py",
        "pyiceberg.table.metadata.TableMetadataV3.model_dump_json",
        (says(_NO_V3_WRITES),),
    ),
    Pin("_v3_metadata.py", "pyiceberg.table.metadata.TableMetadataV3", (fields("next_row_id"),)),
    Pin(
        "_v3_metadata.py",
        "pyiceberg.catalog.sql.SqlCatalog._write_metadata",
        (kind(staticmethod), params("metadata", "io", "metadata_path")),
    ),
    # _v3_manifests.py: v3 manifests and manifest lists
    Pin("_v3_manifests.py", "pyiceberg.manifest.DEFAULT_READ_VERSION", (equals(2),)),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.ManifestFile.fetch_manifest_entry",
        (uses("AvroFile", "DEFAULT_READ_VERSION", "MANIFEST_ENTRY_SCHEMAS"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.read_manifest_list",
        (uses("AvroFile", "DEFAULT_READ_VERSION", "MANIFEST_LIST_FILE_SCHEMAS"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest._inherit_from_manifest",
        (params("entry", "manifest"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.ManifestWriter.new_writer",
        (uses("AvroOutputFile", "_with_partition", "_meta", "_output_file"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.ManifestListWriter.__init__",
        (params("self", "format_version", "output_file", "meta"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.ManifestListWriter.__enter__",
        (uses("AvroOutputFile", "_writer", "_output_file", "_meta"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.ManifestListWriterV2.prepare_manifest",
        (uses("_commit_snapshot_id", "_sequence_number"),),
    ),
    Pin(
        "_v3_manifests.py",
        "pyiceberg.manifest.DATA_FILE_TYPE",
        (_v3_file_fields(),),
    ),
    # _row_lineage.py: snapshots of v3 tables
    Pin(
        "_row_lineage.py",
        f"{_SNAPSHOT}._SnapshotProducer._commit",
        (
            params("self"),
            uses_exactly(
                "AddSnapshotUpdate",
                "AssertRefSnapshotId",
                "BRANCH",
                "SetSnapshotRefUpdate",
                "Snapshot",
                "SnapshotRefType",
                "_compression",
                "_io",
                "_manifests",
                "_new_manifest_list_file_name",
                "_parent_snapshot_id",
                "_snapshot_id",
                "_summary",
                "_table",
                "_target_branch",
                "_transaction",
                "_written_manifest_lists",
                "add_manifests",
                "append",
                "commit_uuid",
                "current_schema_id",
                "format_version",
                "location_provider",
                "new_metadata_location",
                "new_output",
                "next_row_id",
                "next_sequence_number",
                "refs",
                "snapshot_id",
                "snapshot_properties",
                "table_metadata",
                "write_manifest_list",
            ),
        ),
    ),
    Pin(
        "_row_lineage.py",
        f"{_SNAPSHOT}._new_manifest_list_file_name",
        (params("snapshot_id", "attempt", "commit_uuid"),),
    ),
    Pin(
        "_row_lineage.py",
        f"{_SNAPSHOT}._SnapshotProducer.__init__",
        (uses("_parent_snapshot_id", "_written_manifest_lists", "commit_uuid"),),
    ),
    Pin(
        "_row_lineage.py",
        f"{_SNAPSHOT}._SnapshotProducer.fetch_manifest_entry",
        (params("self", "manifest", "discard_deleted"),),
    ),
    Pin(
        "_row_lineage.py",
        f"{_SNAPSHOT}._ManifestMergeManager._create_manifest",
        (uses("fetch_manifest_entry"),),
    ),
    Pin(
        "_row_lineage.py",
        "pyiceberg.table.snapshots.Snapshot",
        (fields("first_row_id", "added_rows"),),
    ),
    Pin(
        "_replace.py",
        f"{_SNAPSHOT}._SnapshotProducer._summary",
        (uses("_deleted_data_files"),),
    ),
    # _gcs_io.py
    Pin(
        "_gcs_io.py",
        "pyiceberg.io.pyarrow.PyArrowFileIO._initialize_gcs_fs",
        (params("self"),),
    ),
    Pin(
        "_gcs_io.py",
        "pyiceberg.io.pyarrow.PyArrowFileIO._initialize_fs",
        (uses("_initialize_gcs_fs"),),
    ),
)


_HIVE = "pyiceberg.catalog.hive"

#: What _hive.py relies on: checked when it is imported (a Hive catalog; it needs thrift).
HIVE_PINS: Final = (
    Pin(
        "_hive.py",
        f"{_HIVE}._HiveClient.__init__",
        (
            params("self", "uri", "ugi", "kerberos_auth", "kerberos_service_name"),
            uses("_uri", "_ugi", "_kerberos_auth", "_kerberos_service_name"),
        ),
    ),
    Pin("_hive.py", f"{_HIVE}._HiveClient._init_thrift_transport", (params("self"),)),
    Pin("_hive.py", f"{_HIVE}._HiveClient.__enter__", (params("self"),)),
    Pin("_hive.py", f"{_HIVE}.HiveCatalog.__init__", (uses("_create_hive_client", "_client"),)),
    Pin("_hive.py", f"{_HIVE}.HiveCatalog._create_hive_client", (kind(staticmethod),)),
)


def _in_range(version: str) -> bool:
    return contract.in_range(FENCE, version)


def problems(pins: Iterable[Pin] = PINS) -> list[str]:
    """What changed, one line per broken check of ``pins`` (the fence module named)."""
    return contract.problems(FENCE, pins)


def check_contract(pins: Iterable[Pin] = PINS) -> None:
    """Raise UpstreamContractError (one line) unless the installed pyiceberg has what
    ``pins`` rely on, in a version the suite ran against."""
    contract.check_contract(FENCE, pins)
