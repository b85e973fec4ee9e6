"""The fence: every place icespool extends, overrides or re-implements pyiceberg's
internals (private names, subclasses of private classes, copied step sequences).

One module per replaced behaviour; each docstring names the upstream behaviour it
replaces, why, and what it relies on:

    _metadata          update_table_metadata (and its RemoveSnapshotsUpdate step)
                       without the deep copy of every retained snapshot
    _transaction       Transaction.table_metadata / _stage; one attempt sent through
                       Table._do_commit; the manifests a producer wrote
    _merge_append      _MergeAppendFiles with Iceberg's merge defaults; a row delta
    _delete_manifest   ManifestWriterV2 writing delete manifests (int equality ids)
    _replace           _OverwriteFiles committing a ``replace`` snapshot
    _row_lineage       _SnapshotProducer._commit for v3 tables: the v3 manifest list,
                       the snapshot's and the table's row ids
    _v3_manifests      manifests and manifest lists read and written with their v3
                       fields (row ids, deletion vectors' blobs)
    _v3_metadata       ToOutputFile.table_metadata for v3 metadata files
    _summary           Summary.get through pydantic's private slot, fast
    _partition_key     PartitionKey.partition seeded with physical values
    _sql               SqlCatalog.commit_table without re-reading the table's history;
                       the row lookup of load_table
    _refresh           Table.refresh skipped when the catalog still names the same file
    _rest              RestCatalog._config_headers: a timeout and an Idempotency-Key
    _gcs_io            PyArrowFileIO._initialize_gcs_fs with a bounded retry time
    _hive              HiveCatalog's _HiveClient: bounded Thrift calls, a connection per
                       thread; a new table's first metadata file written back after the
                       metastore's create race deleted it (imported, and checked, only
                       for a Hive catalog)
    _contract          what all of these rely on, checked here on import

Importing the fence checks the installed pyiceberg against ``_contract.PINS`` and raises
``UpstreamContractError`` (one line: the library, its version, what changed, the module
to update) rather than letting a changed pyiceberg misbehave at the first commit. Nothing
outside this folder touches pyiceberg's private names (tests/iceberg/test_iceberg_fence.py).
"""

from icespool.iceberg._upstream._contract import UpstreamContractError, check_contract

__all__ = ["UpstreamContractError", "check_contract"]

check_contract()
