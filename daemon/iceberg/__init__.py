"""Everything that talks to Iceberg: catalogs, tables, data files, commits.

    _catalog    load a catalog; create a table or check it against its declaration
    _tables     the daemon's tables: declared, created from first records, listed
    _timeouts   bounds on every catalog and object-store call; outage classification
    _health     a background probe that tells /readyz whether the catalog answers
    _check      `check-config --connect`: prove the catalog and warehouse are reachable
    _parquet    Arrow rows -> Parquet data files written through the table's FileIO
    _live_rows  where live rows are: a live data file, positions of rows in such files
    _position_deletes  rows named by data file and position -> position-delete files
    _deletion_vectors  the same for format-v3 tables: deletion vectors in a Puffin file
    _transforms the partition transforms, vectorized over Arrow arrays
    _commit     every commit, by one engine (its doc lists the modules): ONE snapshot per
                flush, idempotent per spool segment; property commits; snapshot expiry
                and replace snapshots for maintenance, with the compare-and-swap
                requirements of its lease; row deletes; schema changes
    _segments   which spool segments a table holds: the marks those commits leave
    _segment_ranges  ranges of a spool's segment ids per writer a table holds, at any age
    _rest       which REST requests commit (and get an Idempotency-Key)
    _defaults   table properties the daemon sets on the tables it creates
    _properties integer table properties: one parser; a warning and the default for
                tuning ones, the table held back for write ones
    _upstream   the fence: everything that extends or replaces pyiceberg's internals
                (the SQL catalog's commits, refresh, metadata without the deep copy,
                snapshot producers...), checked against the installed pyiceberg on import

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from icespool.iceberg._catalog import check_compatible, ensure_table, load_catalog, split_identifier
from icespool.iceberg._check import catalog_tables, check_catalog
from icespool.iceberg._commit import (
    AssertProperty,
    AssertUnreferenced,
    AttemptChanges,
    ClaimsMovedError,
    CommitOutcomeUnknownError,
    CommitRejectedError,
    CommitResult,
    ExpiredSnapshots,
    PropertyUpdate,
    ReplaceConflictError,
    ReplaceExtra,
    StaleEncodingError,
    UpsertResult,
    commit_evolution,
    commit_expiry,
    commit_files,
    commit_properties,
    commit_replace,
    commit_upsert,
    delete_rows,
    validates_locally,
)
from icespool.iceberg._defaults import (
    MAX_SNAPSHOT_AGE_MS,
    MIN_SNAPSHOTS_TO_KEEP,
    TABLE_DEFAULTS,
    apply_defaults,
    table_defaults,
)
from icespool.iceberg._deletion_vectors import (
    DELETION_VECTOR_MARK,
    deserialize_vector,
    encode_deletion_vectors,
    read_deletion_vector,
    serialize_vector,
)
from icespool.iceberg._health import CatalogHealth
from icespool.iceberg._live_rows import LiveData, Located
from icespool.iceberg._parquet import (
    COMPRESSION_CODECS,
    DELETE_FILE_MARK,
    ROW_LINEAGE_FIELDS,
    TAIL_FILE_MARK,
    EncodedFile,
    encode_data_files,
    encode_data_files_with_rows,
    encode_equality_deletes,
    remove_files,
)
from icespool.iceberg._position_deletes import POSITION_DELETE_MARK, encode_position_deletes
from icespool.iceberg._segment_ranges import SpoolSegments, segment_ranges_key
from icespool.iceberg._segments import (
    SEGMENT_RECORDS_SUMMARY_KEY,
    SEGMENTS_SUMMARY_KEY,
    committed_marks,
    find_committed_segments,
    last_segments_key,
)
from icespool.iceberg._tables import (
    check_key,
    check_key_columns,
    check_upsert_layout,
    create_inferred,
    create_with,
    existing_table,
    load_declared,
    table_names,
)
from icespool.iceberg._timeouts import (
    catalog_properties,
    short_error,
    startup_timeout,
    unavailable,
)
from icespool.iceberg._transforms import partition_transform
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._sql import IcespoolSqlCatalog
from icespool.iceberg._upstream._v3_manifests import (
    file_key,
    snapshot_entries,
    v3_value,
)

__all__ = [
    "COMPRESSION_CODECS",
    "DELETE_FILE_MARK",
    "DELETION_VECTOR_MARK",
    "MAX_SNAPSHOT_AGE_MS",
    "MIN_SNAPSHOTS_TO_KEEP",
    "POSITION_DELETE_MARK",
    "ROW_LINEAGE_FIELDS",
    "SEGMENTS_SUMMARY_KEY",
    "SEGMENT_RECORDS_SUMMARY_KEY",
    "TABLE_DEFAULTS",
    "TAIL_FILE_MARK",
    "AssertProperty",
    "AssertUnreferenced",
    "AttemptChanges",
    "CatalogHealth",
    "ClaimsMovedError",
    "CommitOutcomeUnknownError",
    "CommitRejectedError",
    "CommitResult",
    "EncodedFile",
    "ExpiredSnapshots",
    "IcespoolSqlCatalog",
    "LiveData",
    "Located",
    "PropertyUpdate",
    "ReplaceConflictError",
    "ReplaceExtra",
    "SpoolSegments",
    "StaleEncodingError",
    "UpsertResult",
    "apply_defaults",
    "catalog_properties",
    "catalog_tables",
    "check_catalog",
    "check_compatible",
    "check_key",
    "check_key_columns",
    "check_upsert_layout",
    "commit_evolution",
    "commit_expiry",
    "commit_files",
    "commit_properties",
    "commit_replace",
    "commit_upsert",
    "committed_marks",
    "create_inferred",
    "create_with",
    "delete_rows",
    "deserialize_vector",
    "encode_data_files",
    "encode_data_files_with_rows",
    "encode_deletion_vectors",
    "encode_equality_deletes",
    "encode_position_deletes",
    "ensure_table",
    "existing_table",
    "file_key",
    "find_committed_segments",
    "last_segments_key",
    "load_catalog",
    "load_declared",
    "partition_transform",
    "read_deletion_vector",
    "refresh_table",
    "remove_files",
    "segment_ranges_key",
    "serialize_vector",
    "short_error",
    "snapshot_entries",
    "split_identifier",
    "startup_timeout",
    "table_defaults",
    "table_names",
    "unavailable",
    "v3_value",
    "validates_locally",
]
