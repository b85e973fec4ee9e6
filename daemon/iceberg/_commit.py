"""One append snapshot per flush, idempotent per spool segment.

Idempotence rests on the snapshot summary: every snapshot the daemon commits carries
``icespool.segments`` = the comma-joined ids of the spool segments whose rows it
adds. Before committing (and whenever a commit's outcome is unknown) the table is
refreshed and every snapshot in its metadata is searched for those ids.

Why the summary and not a table property: the summary is written atomically with
the data (same metadata commit), costs nothing extra, cannot be clobbered by another
replica's concurrent property update, and does not grow table metadata per commit.
Why every snapshot and not only the current ancestry: a snapshot that someone rolled
back or that lives on another branch still means "these segments were committed
once"; committing them again would undo an operator's rollback or duplicate rows on
a fast-forward.

``expire_snapshots`` removes old snapshots and their summaries, so the same commit
also sets the table property ``icespool.spool.<spool-id>.last-segments`` = the ids
of the segments that spool's latest commit to this table added (``spool_id``
argument). Expiry never touches properties. That is enough: a writer deletes a
commit's segments from its spool before it commits anything else for that table,
so the segments that can be committed but still spooled (crash between commit and
delete) are always among the latest commit's. The value is bounded by one commit's
segments, needs no ordering of segment ids (a wall clock stepped back cannot make
a new segment look committed), and each spool has its own key, so replicas sharing
a table never overwrite each other's.

Safety of retrying after an unknown outcome: every attempt is built on the table
state observed *after* checking that our segments are absent, and catalogs commit by
compare-and-swap on that state (SQL: metadata_location; REST: assert-ref-snapshot-id).
If the earlier attempt lands late, the retry's swap fails, and the next check finds
the segments; if the retry lands, the earlier attempt's swap fails. Either way one
snapshot holds the segments.

Commit cost stays flat as the table ages. The append merges manifests as Iceberg's
MergeAppend does (the table properties ``commit.manifest-merge.enabled``,
``commit.manifest.min-count-to-merge``, ``commit.manifest.target-size-bytes``), so the
manifest list a commit reads and writes stays bounded instead of growing by one
manifest per commit. Refreshes skip re-reading unchanged metadata (``refresh_table``), a
staged commit derives the table's pending metadata once per change and without
copying it (``_Staging``), and a SQL catalog commits without re-reading the table's
history (``iceberg/_sql.py``). What is left grows with the snapshots the table
retains (the metadata file written per commit holds them all), which expiry bounds.

``commit_replace`` commits maintenance rewrites (compaction) as ONE ``replace``
snapshot, validated on every attempt against the refreshed table; see its doc.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``. A Table
instance must not be shared between threads while a commit runs (it is refreshed in
place).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ResolveError,
    ValidationException,
)
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    ADDED_DATA_FILES,
    ADDED_FILE_SIZE,
    ADDED_RECORDS,
    CHANGED_PARTITION_COUNT_PROP,
    CHANGED_PARTITION_PREFIX,
    OPERATION,
    PARTITION_SUMMARY_PROP,
    Operation,
    Snapshot,
    Summary,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotsUpdate,
    TableRequirement,
    TableUpdate,
    ValidatableTableRequirement,
)
from pyiceberg.table.update.snapshot import (
    _FastAppendFiles,
    _ManifestMergeManager,
    _MergeAppendFiles,
    _OverwriteFiles,
)
from pyiceberg.typedef import EMPTY_DICT, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType
from pyiceberg.utils.properties import property_as_bool

from daemon.claims import ClaimsMovedError
from daemon.errors import CommitError
from daemon.iceberg._metadata import apply_updates, clock_floor
from daemon.iceberg._refresh import refresh_table
from daemon.retry import CONFLICTS, Backoff, retry_conflicts

__all__ = [
    "SEGMENTS_SUMMARY_KEY",
    "SEGMENT_RECORDS_SUMMARY_KEY",
    "AssertProperty",
    "AssertUnreferenced",
    "CommitOutcomeUnknownError",
    "CommitRejectedError",
    "CommitResult",
    "ExpiredSnapshots",
    "PropertyUpdate",
    "ReplaceConflictError",
    "StaleEncodingError",
    "commit_expiry",
    "commit_files",
    "commit_properties",
    "commit_replace",
    "committed_marks",
    "delete_rows",
    "find_committed_segments",
    "last_segment_records_key",
    "last_segments_key",
    "new_transaction",
    "validates_locally",
]

_log = logging.getLogger("icespool.commit")

#: Snapshot summary key listing the spool segment ids a snapshot covers.
SEGMENTS_SUMMARY_KEY: Final = "icespool.segments"
# How many records of each segment (aligned with SEGMENTS_SUMMARY_KEY) the table holds
# after the commit: a segment is committed in order, and a commit of its remainder
# records the segment's whole count.
SEGMENT_RECORDS_SUMMARY_KEY: Final = "icespool.segment-records"
_SPOOL_PREFIX: Final = "icespool.spool."
# Marks found in table properties have no snapshot left to name.
_EXPIRED: Final = -1


def last_segments_key(spool_id: str) -> str:
    """Table property naming the segments of ``spool_id``'s latest commit to the table."""
    return f"{_SPOOL_PREFIX}{spool_id}.last-segments"


def last_segment_records_key(spool_id: str) -> str:
    """Table property with the record counts (aligned) of `last_segments_key`'s ids."""
    return f"{_SPOOL_PREFIX}{spool_id}.last-segment-records"


# Errors that say the request itself is wrong: retrying cannot help, and the commit
# certainly did not land (they are raised while building or validating it).
_PERMANENT_ERRORS: Final = (
    NoSuchTableError,
    NoSuchNamespaceError,
    ValidationException,
    ResolveError,
    ValueError,
    TypeError,
)

_TABLE_GONE: Final = (NoSuchTableError, NoSuchNamespaceError)

# Summary keys pyiceberg computes itself; a caller key with one of these names would
# make pyiceberg's Summary(...) fail or lie.
_RESERVED_SUMMARY_KEYS: Final = frozenset(
    {
        OPERATION,
        SEGMENTS_SUMMARY_KEY,
        SEGMENT_RECORDS_SUMMARY_KEY,
        CHANGED_PARTITION_COUNT_PROP,
        PARTITION_SUMMARY_PROP,
        "added-data-files",
        "added-delete-files",
        "added-equality-delete-files",
        "added-equality-deletes",
        "added-files-size",
        "added-position-delete-files",
        "added-position-deletes",
        "added-records",
        "deleted-data-files",
        "deleted-records",
        "removed-delete-files",
        "removed-equality-delete-files",
        "removed-equality-deletes",
        "removed-files-size",
        "removed-position-delete-files",
        "removed-position-deletes",
        "total-data-files",
        "total-delete-files",
        "total-equality-deletes",
        "total-files-size",
        "total-position-deletes",
        "total-records",
    }
)


#: Called inside every commit attempt with the refreshed table's properties; returns the
#: properties to set in the same metadata commit, or raises (nothing is committed).
PropertyUpdate = Callable[[Mapping[str, str]], Mapping[str, str]]


class CommitRejectedError(CommitError):
    """Iceberg rejected what the commit adds (validation, a value the table cannot
    hold): the data's fault, not the catalog's; retrying the same files cannot help.
    Nothing was committed."""


class StaleEncodingError(CommitError):
    """The data files were encoded for a partition spec the table no longer has.

    pyiceberg writes appended files into a manifest of the table's current spec, so
    committing them would record wrong partition values. Re-encode the segments (the
    spool still holds them) and commit again.
    """


class ReplaceConflictError(CommitError):
    """The files a replace was to remove are no longer all live in ``main``, or delete
    files now apply to them, or the partition spec changed: another writer (Spark's
    ``rewrite_data_files`` or a delete, a row delete, a spec change) got there first.

    Nothing was committed, and no earlier attempt of the same call can still land: each
    attempt first looks for its own snapshots in the refreshed table, and a table that
    fails validation has moved past every earlier attempt's compare-and-swap base.
    The files written for the replace are garbage and may be deleted.
    """


class CommitOutcomeUnknownError(CommitError):
    """The last attempt's outcome could not be seen (catalog unreachable, lost
    response): the commit may have landed. Files it adds must not be deleted by the
    caller; an orphan sweep removes them later if no snapshot references them."""


@dataclass(frozen=True)
class CommitResult:
    """Outcome of ``commit_files``.

    ``already_committed`` is true when the segments were found in a snapshot that
    this call did not create (a retry after a crash between commit and spool delete);
    the figures then come from that snapshot's summary.
    """

    snapshot_id: int
    records: int
    files: int
    bytes: int
    already_committed: bool
    attempts: int = 1
    # Attempts whose outcome was unknown (lost answer, 5xx, reset) and were resolved by
    # looking for the segments in the refreshed table.
    unknown_outcomes: int = 0


def _summary_value(snapshot: Snapshot, key: str) -> str | None:
    """``snapshot.summary.get(key)``, fast: read for every retained snapshot on every
    commit (see ``find_committed_segments``).

    ``Summary`` keeps its keys in a pydantic private attribute, which pydantic serves
    through ``__getattr__`` (3.6 us per read; 7 ms per commit at 2,000 snapshots);
    ``__pydantic_private__`` is the same dict as a plain slot (0.1 us).
    """
    summary = snapshot.summary
    if summary is None:
        return None
    private = getattr(summary, "__pydantic_private__", None)
    if private is not None and "_additional_properties" in private:
        value: str | None = private["_additional_properties"].get(key)
        return value
    return summary.get(key)


def _marks(segments: str | None, records: str | None) -> list[tuple[str, int | None]]:
    """``(segment id, records covered)`` of a commit's segment list and its aligned
    record counts; None where the count is unknown (written before counts were kept, or
    a list that does not align): such a mark covers the whole segment, as it always did."""
    ids = segments.split(",") if segments else []
    counts = records.split(",") if records else []
    if len(counts) != len(ids) or not all(count.isdigit() for count in counts):
        return [(segment, None) for segment in ids]
    return [(segment, int(count)) for segment, count in zip(ids, counts, strict=True)]


def _segments_of(snapshot: Snapshot) -> list[tuple[str, int | None]]:
    return _marks(
        _summary_value(snapshot, SEGMENTS_SUMMARY_KEY),
        _summary_value(snapshot, SEGMENT_RECORDS_SUMMARY_KEY),
    )


def _covers(records: int | None, wanted: int) -> bool:
    return records is None or records >= wanted


def committed_marks(
    table: Table, segment_ids: Iterable[str], spool_id: str | None = None
) -> dict[str, tuple[int, int | None]]:
    """``segment id -> (snapshot id, records covered)`` for each of ``segment_ids`` some
    commit to ``table`` covers, keeping the mark that covers the most records (None:
    the whole segment). A segment's records are committed in order, so a mark covering
    ``n`` records means its first ``n`` records are in the table.

    Looks at every snapshot in the table's metadata as loaded (refresh first for the
    catalog's current state), not only the current ancestry. With ``spool_id``, the
    marks of that spool's ``last-segments`` property count too (their snapshot may have
    expired; the snapshot id is then -1).
    """
    wanted = set(segment_ids)
    found: dict[str, tuple[int, int | None]] = {}
    if not wanted:
        return found

    def keep(segment: str, snapshot_id: int, records: int | None) -> None:
        if segment not in wanted:
            return
        best = found.get(segment)
        if best is None or (best[1] is not None and (records is None or records > best[1])):
            found[segment] = (snapshot_id, records)

    for snapshot in table.metadata.snapshots:
        for segment, records in _segments_of(snapshot):
            keep(segment, snapshot.snapshot_id, records)
    if spool_id is not None:
        properties = table.metadata.properties
        for segment, records in _marks(
            properties.get(last_segments_key(spool_id)),
            properties.get(last_segment_records_key(spool_id)),
        ):
            keep(segment, _EXPIRED, records)
    return found


def find_committed_segments(
    table: Table,
    segment_ids: Iterable[str],
    spool_id: str | None = None,
    *,
    records: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Map each of ``segment_ids`` that a snapshot of ``table`` covers to that snapshot
    (-1: its snapshot expired, the spool's ``last-segments`` property says so; see
    `committed_marks`). With ``records`` (segment id -> its record count), a segment
    counts only where a commit covered at least that many of its records: a copy of a
    spool may have committed the first part of a segment that grew afterwards.
    """
    wanted = records or {}
    return {
        segment: snapshot_id
        for segment, (snapshot_id, covered) in committed_marks(table, segment_ids, spool_id).items()
        if _covers(covered, wanted.get(segment, 0))
    }


def _validate(
    data_files: Sequence[DataFile], segment_ids: Sequence[str], summary: Mapping[str, str]
) -> None:
    if not data_files:
        raise ValueError("commit_files needs at least one data file")
    if not segment_ids:
        raise ValueError("commit_files needs the spool segment ids the files come from")
    for segment in segment_ids:
        if not segment or "," in segment or segment != segment.strip():
            raise ValueError(
                f"segment id {segment!r} must be non-empty, without commas or outer spaces"
            )
    if len(set(segment_ids)) != len(segment_ids):
        raise ValueError(f"segment ids contain duplicates: {list(segment_ids)}")
    for key, value in summary.items():
        if key in _RESERVED_SUMMARY_KEYS or key.startswith(CHANGED_PARTITION_PREFIX):
            raise ValueError(f"summary key {key!r} is reserved by Iceberg or icespool")
        if not isinstance(value, str):
            raise ValueError(f"summary value for {key!r} must be a string")


def _summary_int(snapshot: Snapshot, key: str) -> int:
    value = snapshot.summary.get(key) if snapshot.summary is not None else None
    return int(value) if value else 0


def _result_from_snapshot(
    table: Table, snapshot_id: int, *, attempts: int, ours: bool, unknown: int = 0
) -> CommitResult:
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:  # pragma: no cover - the id was read from the same metadata
        raise CommitError(f"snapshot {snapshot_id} vanished from table {_name(table)}")
    return CommitResult(
        snapshot_id=snapshot_id,
        records=_summary_int(snapshot, ADDED_RECORDS),
        files=_summary_int(snapshot, ADDED_DATA_FILES),
        bytes=_summary_int(snapshot, ADDED_FILE_SIZE),
        already_committed=not ours,
        attempts=attempts,
        unknown_outcomes=unknown,
    )


def _name(table: Table) -> str:
    return ".".join(table.name())


def _check_segments(table: Table, spans: Mapping[str, tuple[int, int]]) -> int | None:
    """The snapshot already holding all of ``spans``' records (segment id -> the records
    ``[start, end)`` this commit adds), or None if none holds any.

    Raises `ClaimsMovedError` when another writer (a copy of this spool) committed a
    part of a segment past ``start`` since the caller read the table: the caller
    reads the table again and commits what is left."""
    marks = committed_marks(table, spans)
    committed: dict[str, int] = {}
    for segment, (snapshot_id, covered) in marks.items():
        start, end = spans[segment]
        if _covers(covered, end):
            committed[segment] = snapshot_id
        elif covered is not None and covered > start:
            raise ClaimsMovedError(
                f"table {_name(table)}: segment {segment} has {covered} of its records "
                f"committed now, not {start} as they were when this commit was built"
            )
    if not committed:
        return None
    missing = [segment for segment in spans if segment not in committed]
    if missing:
        # Committing the files would duplicate the committed segments' rows, and they
        # cannot be told apart inside the encoded files.
        raise CommitError(
            f"table {_name(table)}: segments {sorted(committed)} are already committed "
            f"(snapshots {sorted(set(committed.values()))}) but {missing} are not; "
            "encode and commit the uncommitted segments on their own "
            "(the spool still holds their records)"
        )
    snapshots = set(committed.values())
    if len(snapshots) > 1:
        raise CommitError(
            f"table {_name(table)}: segments {list(spans)} were committed by several "
            f"snapshots {sorted(snapshots)}; delete them from the spool only after checking"
        )
    return snapshots.pop()


def _check_spec(table: Table, data_files: Sequence[DataFile]) -> None:
    current = table.metadata.default_spec_id
    for data_file in data_files:
        try:
            spec_id = data_file.spec_id
        except AttributeError:  # built elsewhere without a spec id: nothing to compare
            continue
        if spec_id != current:
            raise StaleEncodingError(
                f"table {_name(table)}: {data_file.file_path} was encoded for partition spec "
                f"{spec_id} but the table now uses spec {current}; re-encode the segments "
                "(the spool still holds the records)"
            )


class _Staging(Transaction):
    """A transaction that derives its pending metadata once per staged change,
    without copying every retained snapshot (``iceberg/_metadata.py``).

    pyiceberg's ``Transaction.table_metadata`` applies the staged updates to the
    table's metadata and deep-copies the result on every access, and building one
    append reads it a dozen times: a dozen copies of every retained snapshot per
    commit. ``_updates`` is replaced, never mutated, on each stage, so identity says
    when to derive again.
    """

    def __init__(self, table: Table) -> None:
        super().__init__(table)
        self._derived_from: tuple[TableMetadata, tuple[TableUpdate, ...]] | None = None
        self._derived: TableMetadata | None = None

    def _stage(
        self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...] = ()
    ) -> Transaction:
        # A snapshot is stamped with this process's clock when it is built; one
        # behind the table's last change is stamped just after it instead
        # (`clock_floor`), or other engines could no longer read the table.
        floor = clock_floor(self.table_metadata)
        updates = tuple(
            AddSnapshotUpdate(snapshot=update.snapshot.model_copy(update={"timestamp_ms": floor}))
            if isinstance(update, AddSnapshotUpdate) and update.snapshot.timestamp_ms < floor
            else update
            for update in updates
        )
        return super()._stage(updates, requirements)

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        memo = self._derived_from
        if self._derived is None or memo is None or memo[0] is not base or memo[1] is not updates:
            self._derived = apply_updates(base, updates)
            self._derived_from = (base, updates)
        return self._derived


def new_transaction(table: Table) -> Transaction:
    """A transaction on ``table`` for pyiceberg's update APIs (``ExpireSnapshots(...)``,
    ``update_snapshot()``...) that does not deep-copy the table's metadata on every
    read. Send it with ``_commit_once`` (one attempt; conflicts come back to the
    caller), never with ``commit_transaction``."""
    return _Staging(table)


def _abandon(transaction: Transaction) -> None:
    """Delete the manifests and manifest lists staged for a commit that did not land
    (merged manifests included: pyiceberg tracks every manifest an append writes)."""
    for producer in transaction._snapshot_producers:
        producer._clean_all_uncommitted()


def _tidy(table: Table, transaction: Transaction) -> None:
    """After ``transaction`` landed: delete the manifests it wrote that its snapshot
    does not list. A merge writes the commit's new manifest, then merges it into
    another; pyiceberg leaves the first one behind (one orphan per merge)."""
    for producer in transaction._snapshot_producers:
        if len(producer._written_manifests) < 2:
            continue  # no merge: the one manifest written is listed
        snapshot = table.metadata.snapshot_by_id(producer.snapshot_id)
        if snapshot is None:  # pragma: no cover - called for landed commits only
            continue
        listed = {manifest.manifest_path for manifest in snapshot.manifests(table.io)}
        for path in producer._written_manifests:
            if path not in listed:
                table.io.delete(path)


def _settle(table: Table, attempts: Mapping[int, Transaction], landed: int) -> None:
    """Clean up after this call's attempts once the one that holds ``landed`` is known.

    The others certainly never land: each attempt was built after seeing the ones
    before it absent, and the catalog's compare-and-swap fails an attempt whose base
    is no longer current, so at most one of them can ever land. Cleanup is best effort:
    a file left behind is an orphan, never a failure of the commit.
    """
    for snapshot_id, transaction in attempts.items():
        try:
            if snapshot_id == landed:
                _tidy(table, transaction)
            else:
                _abandon(transaction)
        except Exception as exc:
            _log.warning(
                "table %s: could not delete files of an earlier commit attempt: %s: %s",
                _name(table),
                type(exc).__name__,
                exc,
            )


# Iceberg's defaults for the merge properties (Java's TableProperties: what Spark's
# commits to the same table apply). pyiceberg 0.12 leaves merging off by default.
_MERGE_ENABLED_DEFAULT: Final = True
_MIN_MERGE_COUNT_DEFAULT: Final = TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT
_MERGE_TARGET_DEFAULT: Final = TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
# (table uuid, property, value) already warned about; bounded, then forgotten.
_garbage_warned: set[tuple[str, str, str]] = set()
_GARBAGE_WARNED_MAX: Final = 1_000


def _garbage_property(metadata: TableMetadata, key: str, value: str, default: object) -> None:
    seen = (str(metadata.table_uuid), key, value)
    if seen in _garbage_warned:
        return
    if len(_garbage_warned) >= _GARBAGE_WARNED_MAX:
        _garbage_warned.clear()
    _garbage_warned.add(seen)
    _log.warning(
        "table property %s=%r is not a valid value; commits use %s until it is fixed",
        key,
        value,
        default,
    )


def _merge_int(metadata: TableMetadata, key: str, default: int) -> int:
    value = metadata.properties.get(key)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        _garbage_property(metadata, key, value, default)
        return default


class _MergeAppend(_MergeAppendFiles):
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
            _garbage_property(metadata, key, metadata.properties[key], enabled)
        self._merge_enabled = enabled
        self._min_count_to_merge = _merge_int(
            metadata, TableProperties.MANIFEST_MIN_MERGE_COUNT, _MIN_MERGE_COUNT_DEFAULT
        )
        self._target_size_bytes = _merge_int(
            metadata, TableProperties.MANIFEST_TARGET_SIZE_BYTES, _MERGE_TARGET_DEFAULT
        )


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg 0.12 writes data manifests only).

    pyiceberg 0.12 declares ``equality_ids`` (field 135) as ``list<long>``; the spec
    (and Java, which casts the values to Integer) says ``list<int>``: Spark fails
    with a ClassCastException on such a manifest. Avro writes int and long alike
    (zig-zag varints), so only the declared type changes.
    """

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        schema = super()._with_partition(format_version)
        return Schema(
            *[
                NestedField(2, "data_file", _int_equality_ids(field.field_type), required=True)
                if field.field_id == 2 and isinstance(field.field_type, StructType)
                else field
                for field in schema.fields
            ]
        )


def _int_equality_ids(data_file: StructType) -> StructType:
    return StructType(
        *[
            NestedField(
                field.field_id,
                field.name,
                ListType(element_id=136, element_type=IntegerType(), element_required=True),
                required=False,
                doc=field.doc,
            )
            if field.field_id == _EQUALITY_IDS_FIELD
            else field
            for field in data_file.fields
        ]
    )


_EQUALITY_IDS_FIELD: Final = 135


class _MergeRowDelta(_MergeAppend):
    """`_MergeAppend` that also adds delete files (an upsert table's equality deletes)
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
            snapshot_producer=cast(Any, _DeleteMerging(self)),
        )
        return [*data, *merging.merge_manifests([self._delete_manifest(deletes), *old])]

    def delete_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return _DeleteManifestWriter(
            spec,
            self.schema(),
            self.new_manifest_output(),  # tracked: abandoned and tidied like the others
            self._snapshot_id,
            self._compression,
        )

    def _delete_manifest(self, deletes: Sequence[DataFile]) -> ManifestFile:
        writer = self.delete_manifest_writer(self._transaction.table_metadata.spec())
        with writer:
            for delete_file in deletes:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete_file,
                    )
                )
        return writer.to_manifest_file()


class _DeleteMerging:
    """The row delta as pyiceberg's manifest merge manager sees it, except that the
    manifests it writes are delete manifests (the manager only asks for a writer)."""

    def __init__(self, producer: _MergeRowDelta) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return self._producer.delete_manifest_writer(spec)


def _operation(files: Sequence[DataFile]) -> Operation:
    """Iceberg's operation for a commit adding ``files`` (RowDelta's rule): delete
    files with data files overwrite, delete files alone delete, data files append."""
    deletes = any(f.content != DataFileContent.DATA for f in files)
    data = any(f.content == DataFileContent.DATA for f in files)
    if not deletes:
        return Operation.APPEND
    return Operation.OVERWRITE if data else Operation.DELETE


def _stage(
    table: Table,
    data_files: Sequence[DataFile],
    summary: dict[str, str],
    table_properties: Mapping[str, str],
) -> tuple[Transaction, int]:
    """Build the append (writes manifests) and return it with its snapshot id.

    A merge append (``_MergeAppend``): with ``commit.manifest-merge.enabled`` (the
    table's choice; unset: true, Iceberg's default) the new manifest is merged with the
    existing small ones once ``commit.manifest.min-count-to-merge`` of them are due,
    bin-packed to ``commit.manifest.target-size-bytes``; disabled, it adds one manifest
    like a fast append. With delete files among ``data_files`` (an upsert table's
    equality deletes) the same merge append also writes a delete manifest
    (``_MergeRowDelta``) and the operation is ``overwrite`` (``delete`` when only delete
    files are added). Nothing is committed here; a failure deletes what was written.
    """
    transaction = _Staging(table)
    try:
        if table_properties:
            transaction.set_properties(dict(table_properties))
        operation = _operation(data_files)
        producer = _MergeAppend if operation == Operation.APPEND else _MergeRowDelta
        with producer(transaction, table.io, summary, operation) as append:
            for data_file in data_files:
                append.append_data_file(data_file)
            snapshot_id: int = append.snapshot_id
    except BaseException:
        _abandon(transaction)  # certainly not committed: nothing was sent
        raise
    return transaction, snapshot_id


class AssertProperty(ValidatableTableRequirement):
    """Compare-and-swap on one table property: the commit lands only if ``key`` still
    has ``value`` (None: absent) in the metadata it is applied to.

    Iceberg has no such requirement, so only a catalog that validates requirements
    itself, against the metadata it swaps (`validates_locally`), can honour it; a REST
    catalog would send it to a server that does not know it. ``_commit_once`` refuses
    it elsewhere rather than commit unguarded.
    """

    type: Literal["icespool-assert-property"] = Field(default="icespool-assert-property")
    key: str
    value: str | None = None

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        current = base_metadata.properties.get(self.key)
        if current != self.value:
            raise CommitFailedException(
                f"Requirement failed: property {self.key} is {current!r}, expected {self.value!r}"
            )


class AssertUnreferenced(ValidatableTableRequirement):
    """No branch or tag points at any of ``snapshot_ids`` (an expiry must not remove a
    ref someone created, or a branch rolled back, since it chose what to expire:
    removing a snapshot drops the refs that point at it). Local validation only, as
    `AssertProperty`; elsewhere `commit_expiry` asserts every ref's position instead."""

    type: Literal["icespool-assert-unreferenced"] = Field(default="icespool-assert-unreferenced")
    snapshot_ids: list[int]

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        wanted = set(self.snapshot_ids)
        for name, ref in base_metadata.refs.items():
            if ref.snapshot_id in wanted:
                raise CommitFailedException(
                    f"Requirement failed: ref {name} now points at snapshot {ref.snapshot_id}, "
                    "which this commit would expire"
                )


_LOCAL_REQUIREMENTS: Final = (AssertProperty, AssertUnreferenced)


def validates_locally(catalog: Catalog) -> bool:
    """Whether ``catalog`` checks a commit's requirements itself against the metadata it
    then swaps by compare-and-swap, so `AssertProperty` / `AssertUnreferenced` hold.

    pyiceberg's SqlCatalog does (``_update_and_stage_table`` validates every requirement
    on the metadata it loaded, and the UPDATE swaps metadata_location only if it is still
    that one; `IcespoolSqlCatalog` validates on the base it swaps from), and so does its
    GlueCatalog (the same validation, then UpdateTable conditional on the table's
    VersionId). REST sends requirements to the server, which knows only Iceberg's own.
    """
    if isinstance(catalog, SqlCatalog):
        return True
    try:
        from pyiceberg.catalog.glue import GlueCatalog  # the glue extra (boto3)
    except ImportError:
        return False
    return isinstance(catalog, GlueCatalog)


def _commit_once(
    transaction: Transaction, requirements: Sequence[ValidatableTableRequirement] = ()
) -> None:
    """Send the staged commit once; a conflict raises CommitFailedException.

    pyiceberg's ``commit_transaction`` retries a conflict by re-applying our updates
    on the refreshed table. That would skip our own checks (segment ids, Kafka
    offset ranges) against what the other writer just committed, so conflicts come
    back to ``commit_files``' loop, which refreshes and checks again. Uses pyiceberg
    internals (pinned <0.13); tests/test_committer.py covers conflicts.

    ``requirements``: more conditions the catalog checks at the swap (a lease, the
    refs an expiry relies on). icespool's own kinds need `validates_locally`.
    """
    table = transaction._table
    if any(isinstance(r, _LOCAL_REQUIREMENTS) for r in requirements) and not validates_locally(
        table.catalog
    ):
        raise CommitError(
            f"table {_name(table)}: catalog type {type(table.catalog).__name__} cannot check "
            "icespool's commit requirements (a maintenance lease); nothing was committed"
        )
    # pyiceberg types requirements as the union of Iceberg's kinds; a catalog that
    # validates locally (checked above) only calls validate() on them.
    every = cast(
        "tuple[TableRequirement, ...]",
        (
            *transaction._requirements,
            *requirements,
            # The staged updates never change the uuid: read it without deriving metadata.
            AssertTableUUID(uuid=table.metadata.table_uuid),
        ),
    )
    try:
        table._do_commit(updates=transaction._updates, requirements=every)
    except CommitFailedException:
        # Certainly not landed: the manifests written for this attempt are garbage.
        _abandon(transaction)
        raise


def _rejected(table: Table, exc: BaseException) -> CommitError:
    """The error for a permanent failure: the data's fault, or the table's when the table
    or namespace is gone."""
    error = CommitError if isinstance(exc, _TABLE_GONE) else CommitRejectedError
    return error(
        f"table {_name(table)}: commit rejected ({type(exc).__name__}: {exc}); "
        "the spool still holds the records"
    )


def _refresh(table: Table) -> BaseException | None:
    """Refresh the table; return the error if the catalog could not be read."""
    try:
        refresh_table(table)
    except _PERMANENT_ERRORS as exc:
        raise CommitError(
            f"table {_name(table)}: cannot load it ({type(exc).__name__}: {exc}); "
            "the spool still holds the records"
        ) from exc
    except Exception as exc:  # catalog unreachable: the caller retries with backoff
        _log.warning("table %s: refresh failed: %s: %s", _name(table), type(exc).__name__, exc)
        return exc
    return None


def commit_properties(
    table: Table,
    updates: Callable[[Mapping[str, str]], Mapping[str, str]],
    *,
    retry: Backoff = CONFLICTS,
    guard: Collection[str] = (),
    requirements: Sequence[ValidatableTableRequirement] = (),
) -> bool:
    """Set the properties ``updates(current properties)`` returns, in one metadata commit.

    Each attempt refreshes the table first and asks ``updates`` again, so a
    concurrent change is decided on what the other writer committed. Returns
    whether anything changed (``updates`` returned nothing new: no commit). After
    ``retry.attempts`` conflicts the last CommitFailedException is raised.

    ``guard``: properties whose values this attempt read must still hold when the
    catalog swaps (compare-and-swap, `AssertProperty`: a maintenance lease);
    ``requirements``: more such conditions.
    """

    def attempt() -> bool:
        refresh_table(table)
        current = table.metadata.properties
        changed = {k: v for k, v in updates(current).items() if current.get(k) != v}
        if not changed:
            return False
        transaction = _Staging(table)
        transaction.set_properties(changed)
        guards = [AssertProperty(key=key, value=current.get(key)) for key in guard]
        _commit_once(transaction, [*guards, *requirements])
        refresh_table(table)
        return True

    return retry_conflicts(attempt, what=f"table {_name(table)}: property commit", backoff=retry)


@dataclass(frozen=True)
class ExpiredSnapshots:
    """What ``commit_expiry`` removed: the snapshots as they were (their manifest
    lists name the files only they may have reached)."""

    snapshots: tuple[Snapshot, ...]


def _unreferenced(
    table: Table, metadata: TableMetadata, ids: Collection[int]
) -> list[ValidatableTableRequirement]:
    if validates_locally(table.catalog):
        return [AssertUnreferenced(snapshot_ids=sorted(ids))]
    # Iceberg's own requirement, checked by any catalog: every ref is where it was
    # (stricter: a commit moving main conflicts, and the expiry is planned again).
    return [
        AssertRefSnapshotId(ref=name, snapshot_id=ref.snapshot_id)
        for name, ref in metadata.refs.items()
    ]


def commit_expiry(
    table: Table,
    choose: Callable[[TableMetadata], Collection[int]],
    *,
    requirements: Sequence[ValidatableTableRequirement] = (),
    retry: Backoff = CONFLICTS,
) -> ExpiredSnapshots | None:
    """Remove the snapshots ``choose(refreshed metadata)`` names from the table's
    metadata in one commit (no file is deleted here). None: nothing to expire.

    Each attempt refreshes and chooses again. Branch and tag heads are never removed
    (``choose`` must not name them, and the commit requires that no ref points at a
    chosen snapshot when it lands, so a ref created meanwhile is not dropped). Table
    properties are untouched, so exactly-once (``icespool.spool.*``, Kafka offsets)
    never depends on what expiry keeps. An unknown outcome is resolved by looking:
    the snapshots are gone (it landed) or the error is raised (nothing changed).
    """

    def attempt() -> ExpiredSnapshots | None:
        refresh_table(table)
        before = table.metadata
        ids = set(choose(before))
        if not ids:
            return None
        heads = {ref.snapshot_id for ref in before.refs.values()}
        if ids & heads:
            raise ValueError(f"snapshots {sorted(ids & heads)} are branch or tag heads")
        expired = tuple(s for s in before.snapshots if s.snapshot_id in ids)
        transaction = _Staging(table)
        # The update ExpireSnapshots builds, without its per-id checks: each of those
        # deep-copies the whole metadata (minutes for thousands of snapshots).
        transaction._apply((RemoveSnapshotsUpdate(snapshot_ids=sorted(ids)),))
        try:
            _commit_once(transaction, [*requirements, *_unreferenced(table, before, ids)])
        except (CommitFailedException, CommitError, *_PERMANENT_ERRORS):
            raise
        except Exception:
            if _refresh(table) is not None or any(
                table.metadata.snapshot_by_id(i) is not None for i in ids
            ):
                raise
            _log.info("table %s: expiry outcome was unknown; it landed", _name(table))
        return ExpiredSnapshots(expired)

    return retry_conflicts(attempt, what=f"table {_name(table)}: snapshot expiry", backoff=retry)


def delete_rows(
    table: Table,
    row_filter: BooleanExpression,
    *,
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
) -> bool:
    """Remove the rows matching ``row_filter`` in one snapshot (copy-on-write: data
    files holding matches are rewritten without them). Returns whether anything was
    removed.

    Each attempt refreshes the table and decides again what to rewrite, so a writer
    that appended meanwhile is never overwritten; a conflict is retried like
    `commit_properties`. Deleting rows that are already gone commits nothing, so a
    repeated call is harmless.
    """

    def attempt() -> bool:
        refresh_table(table)
        transaction = _Staging(table)
        transaction.delete(row_filter, snapshot_properties=dict(summary))
        if not transaction._updates:
            return False
        _commit_once(transaction)
        refresh_table(table)
        return True

    return retry_conflicts(attempt, what=f"table {_name(table)}: row delete", backoff=retry)


def commit_files(
    table: Table,
    data_files: Sequence[DataFile],
    *,
    segment_ids: Sequence[str],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    update_properties: PropertyUpdate | None = None,
    spool_id: str | None = None,
    segment_spans: Mapping[str, tuple[int, int]] | None = None,
) -> CommitResult:
    """Commit ``data_files`` as ONE append snapshot tagged with ``segment_ids``.

    ``data_files`` may include equality-delete files (content EQUALITY_DELETES): the
    snapshot then adds both (operation ``overwrite``, or ``delete`` without data files).

    Idempotent per segment set: if the table already has a snapshot covering
    ``segment_ids``, nothing is committed and that snapshot is returned with
    ``already_committed=True``. Conflicts with other writers are retried on a
    refreshed table; an error with an unknown outcome is resolved by looking for the
    segment ids in the refreshed table, never by committing blindly. Gives up with
    ``CommitError`` after ``retry.attempts`` attempts; the caller keeps the spool
    segments and tries again later.

    ``update_properties`` (Kafka offsets) is called in every attempt with the
    refreshed table's properties; what it returns is set in the same commit, and
    an exception from it aborts the commit.

    ``spool_id`` (the spool the segments come from) records them as that spool's
    latest commit in a table property, in the same commit (see the module doc).

    ``segment_spans`` (segment id -> ``(start, end)``): the files hold records
    ``[start, end)`` of each segment, whose first ``start`` records an earlier commit
    holds; the snapshot records ``end`` as the segment's committed count. Without it
    the count is unknown and the mark covers the whole segment. Raises
    `ClaimsMovedError` (nothing committed) when another writer committed more of a
    segment meanwhile.
    """
    policy = retry
    segments = list(segment_ids)
    _validate(data_files, segments, summary)
    properties = {**summary, SEGMENTS_SUMMARY_KEY: ",".join(segments)}
    counts = ""
    if segment_spans is not None:
        if set(segment_spans) != set(segments):
            raise ValueError(f"segment_spans must name exactly the segments {segments}")
        counts = ",".join(str(segment_spans[segment][1]) for segment in segments)
        properties[SEGMENT_RECORDS_SUMMARY_KEY] = counts
    # Without counts a mark covers the whole segment: any earlier mark holds it.
    spans = segment_spans or dict.fromkeys(segments, (0, 0))

    last_error: BaseException | None = None
    # Snapshot ids of our attempts: a snapshot found later with our segments is ours
    # (not "already committed") when its id is one of these.
    attempted: dict[int, Transaction] = {}
    unknown = 0
    for attempt in range(1, policy.attempts + 1):
        if attempt > 1:
            time.sleep(policy.delay(attempt - 1))
        # Always look before committing: a previous attempt (this call's or an earlier
        # process's) may have landed, and the refresh builds on other writers' commits.
        if (refresh_error := _refresh(table)) is not None:
            last_error = refresh_error
            continue
        existing = _check_segments(table, spans)
        if existing is not None:
            if existing in attempted:
                _log.info(
                    "table %s: an earlier attempt whose outcome was unknown did land "
                    "(snapshot %d holds segments %s); not committing again",
                    _name(table),
                    existing,
                    ",".join(segments),
                )
            _settle(table, attempted, existing)
            return _result_from_snapshot(
                table, existing, attempts=attempt, ours=existing in attempted, unknown=unknown
            )
        _check_spec(table, data_files)
        # Raises (nothing committed) when the refreshed table contradicts the caller.
        table_properties = dict(
            update_properties(table.metadata.properties) if update_properties else {}
        )
        if spool_id is not None:
            table_properties[last_segments_key(spool_id)] = ",".join(segments)
            table_properties[last_segment_records_key(spool_id)] = counts
        try:
            transaction, snapshot_id = _stage(table, data_files, properties, table_properties)
        except _PERMANENT_ERRORS as exc:
            raise _rejected(table, exc) from exc
        except Exception as exc:
            # Writing the manifests failed (object store): nothing was sent to the catalog.
            last_error = exc
            _log.warning(
                "table %s: writing the commit's manifests failed (attempt %d/%d), nothing "
                "was committed: %s: %s",
                _name(table),
                attempt,
                policy.attempts,
                type(exc).__name__,
                exc,
            )
            continue
        started = time.monotonic()
        try:
            attempted[snapshot_id] = transaction
            _commit_once(transaction)
        except CommitFailedException as exc:
            # The catalog refused the swap: nothing of ours landed. Retry on a fresh table.
            last_error = exc
            _log.info(
                "table %s: commit conflict (attempt %d/%d): %s",
                _name(table),
                attempt,
                policy.attempts,
                exc,
            )
            continue
        except _PERMANENT_ERRORS as exc:
            raise _rejected(table, exc) from exc
        except Exception as exc:
            # Unknown outcome (lost response, 5xx, connection reset): the next loop
            # iteration refreshes the table and looks for our segments first.
            last_error = exc
            unknown += 1
            _log.warning(
                "table %s: commit outcome unknown after %.0f ms (attempt %d/%d): %s: %s",
                _name(table),
                (time.monotonic() - started) * 1000,
                attempt,
                policy.attempts,
                type(exc).__name__,
                exc,
            )
            continue
        _settle(table, attempted, snapshot_id)
        return _result_from_snapshot(
            table, snapshot_id, attempts=attempt, ours=True, unknown=unknown
        )

    # A last look: the final attempt may have landed despite its error. (If it did
    # not, its files stay: it may still be on its way to the catalog.)
    if _refresh(table) is None:
        existing = _check_segments(table, spans)
        if existing is not None:
            _settle(table, attempted, existing)
            return _result_from_snapshot(
                table,
                existing,
                attempts=policy.attempts,
                ours=existing in attempted,
                unknown=unknown,
            )
    raise CommitError(
        f"table {_name(table)}: commit of segments {segments} failed after "
        f"{policy.attempts} attempts ({type(last_error).__name__}: {last_error}); "
        "the spool still holds the records; a later attempt first checks the table for "
        "them, so nothing is committed twice"
    ) from last_error


# ---------------------------------------------------------------- replace (compaction)


class _ReplaceFiles(_OverwriteFiles):
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

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        overwrite = super()._summary(snapshot_properties).model_dump()
        overwrite.pop(OPERATION)
        return Summary(Operation.REPLACE, **overwrite)

    def _writer(self, spec_id: int, content: ManifestContent) -> ManifestWriter:
        if content == ManifestContent.DATA:
            return self.new_manifest_writer(self.spec(spec_id))
        metadata = self._transaction.table_metadata
        return (
            _DeleteManifestWriter(
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
        if self._added_data_files:
            with self.new_manifest_writer(self._transaction.table_metadata.spec()) as writer:
                for data_file in self._added_data_files:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=self.data_sequence_number,
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


def _check_added_spec(table: Table, added: Sequence[DataFile]) -> None:
    current_spec = table.metadata.default_spec_id
    for data_file in added:
        if data_file.spec_id != current_spec:
            raise ReplaceConflictError(
                f"table {_name(table)}: the partition spec changed to {current_spec} since "
                f"{data_file.file_path} was written for spec {data_file.spec_id}"
            )


def _check_replace(table: Table, deleted: Sequence[DataFile], added: Sequence[DataFile]) -> None:
    """Raise ReplaceConflictError unless ``deleted`` can be replaced on the table as loaded.

    Every removed file must be live in ``main``'s current snapshot, and no delete file
    may apply to it: the added files were written from the removed files' rows as they
    are on disk, so a delete that now applies to those rows would be undone. The rule
    is Iceberg's scoping of deletes: a delete file applies to data files of its own
    spec and partition, or to every file when its spec is unpartitioned (global
    equality deletes). Any such delete file fails the check, whenever it was added:
    the strict rule for callers that rewrite files as they are on disk. Compaction,
    which applies deletes itself, passes its own ``check`` to ``commit_replace``.
    """
    name = _name(table)
    metadata = table.metadata
    _check_added_spec(table, added)
    snapshot = metadata.snapshot_by_name(MAIN_BRANCH)
    if snapshot is None:
        raise ReplaceConflictError(f"table {name}: main has no snapshot any more")
    missing = {data_file.file_path for data_file in deleted}
    touched = {(data_file.spec_id, data_file.partition) for data_file in deleted}
    touched_specs = {spec_id for spec_id, _ in touched}
    specs = metadata.specs()
    for manifest in snapshot.manifests(table.io):
        spec_id = manifest.partition_spec_id
        if manifest.content == ManifestContent.DATA:
            if missing and spec_id in touched_specs:
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    missing.discard(entry.data_file.file_path)
            continue
        global_deletes = specs[spec_id].is_unpartitioned()
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if global_deletes or (spec_id, entry.data_file.partition) in touched:
                raise ReplaceConflictError(
                    f"table {name}: delete file {entry.data_file.file_path} (snapshot "
                    f"{entry.snapshot_id}) applies to files being replaced"
                )
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (" ..." if len(missing) > 3 else "")
        raise ReplaceConflictError(
            f"table {name}: {len(missing)} file(s) to replace are no longer live in main "
            f"(removed by another writer's rewrite or delete): {shown}"
        )


def _stage_replace(
    table: Table,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    summary: Mapping[str, str],
    data_sequence_number: int | None = None,
) -> tuple[Transaction, int]:
    transaction = _Staging(table)
    producer = _ReplaceFiles(
        operation=Operation.OVERWRITE,  # relabelled in _summary, see _ReplaceFiles
        transaction=transaction,
        io=table.io,
        snapshot_properties=dict(summary),
        branch=MAIN_BRANCH,
    )
    producer.data_sequence_number = data_sequence_number
    for data_file in deleted:
        producer.delete_data_file(data_file)
    for data_file in added:
        producer.append_data_file(data_file)
    producer.commit()
    return transaction, producer.snapshot_id


class _OutcomeUnknown(Exception):
    """An attempt that could not commit or whose outcome nobody saw (catalog
    unreachable): the next attempt refreshes and looks for its snapshots first."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def commit_replace(
    table: Table,
    *,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    requirements: Sequence[ValidatableTableRequirement] = (),
    data_sequence_number: int | None = None,
    check: Callable[[Table], Sequence[DataFile]] | None = None,
) -> CommitResult:
    """Replace ``deleted`` by ``added`` in ``main`` as ONE snapshot with operation ``replace``.

    ``data_sequence_number``: the data sequence number the added files carry (None:
    the new snapshot's). ``check``: the caller's validation of the refreshed table on
    every attempt instead of ``_check_replace`` (which refuses any delete file applying
    to ``deleted``); it raises ReplaceConflictError or returns more files to remove in
    the same snapshot (delete files nothing live needs any more). The added files'
    partition spec is checked either way.

    For rewrites that keep every row (compaction): the caller guarantees ``added``
    holds exactly the rows of ``deleted``. Every attempt refreshes the table, looks for
    a snapshot of an earlier attempt (an unknown outcome that landed), then validates
    (``_check_replace``: every removed file still live in main, no delete file applying
    to them, same partition spec) and commits through ``_commit_once``. A concurrent
    commit (CommitFailedException) is retried on the refreshed table, so a plain
    append by another writer lets the replace through with the append's files kept;
    a rewrite or delete of the same files by another writer fails validation.
    ``requirements`` go with every attempt (maintenance's lease): one that fails is
    a conflict like another writer's commit, retried, then ``CommitError``.

    Raises ``ReplaceConflictError`` (nothing committed; ``added`` may be deleted),
    ``CommitOutcomeUnknownError`` (may have landed; keep ``added``), ``CommitError``
    after ``retry.attempts`` conflicts or for a table that cannot be loaded (nothing
    committed), ``CommitRejectedError`` when Iceberg refuses the commit itself.
    """
    if not deleted and check is None:
        raise ValueError("commit_replace needs at least one file to remove")
    paths = [data_file.file_path for data_file in deleted]
    if len(set(paths)) != len(paths):
        raise ValueError("commit_replace: the files to remove contain duplicates")
    for key, value in summary.items():
        if key in _RESERVED_SUMMARY_KEYS or key.startswith(CHANGED_PARTITION_PREFIX):
            raise ValueError(f"summary key {key!r} is reserved by Iceberg or icespool")
        if not isinstance(value, str):
            raise ValueError(f"summary value for {key!r} must be a string")
    name = _name(table)
    attempted: set[int] = set()
    unknown: list[BaseException] = []
    count = 0

    def landed() -> int | None:
        for snapshot in table.metadata.snapshots:
            if snapshot.snapshot_id in attempted:
                return snapshot.snapshot_id
        return None

    def attempt() -> CommitResult:
        nonlocal count
        count += 1
        if (refresh_error := _refresh(table)) is not None:
            raise _OutcomeUnknown(refresh_error)
        if (mine := landed()) is not None:
            return _result_from_snapshot(table, mine, attempts=count, ours=True)
        if check is None:
            _check_replace(table, deleted, added)
            removing = list(deleted)
        else:
            _check_added_spec(table, added)
            removing = [*deleted, *check(table)]
            if not removing:
                raise ReplaceConflictError(f"table {name}: nothing left to replace")
        try:
            transaction, snapshot_id = _stage_replace(
                table, removing, added, summary, data_sequence_number
            )
        except ValidationException as exc:  # "Missing required files to delete"
            raise ReplaceConflictError(f"table {name}: {exc}") from exc
        attempted.add(snapshot_id)
        try:
            _commit_once(transaction, requirements)
        except CommitFailedException:
            raise
        except _PERMANENT_ERRORS as exc:
            error = CommitError if isinstance(exc, _TABLE_GONE) else CommitRejectedError
            raise error(f"table {name}: replace rejected ({type(exc).__name__}: {exc})") from exc
        except Exception as exc:
            unknown.append(exc)
            _log.warning(
                "table %s: replace outcome unknown (attempt %d/%d): %s: %s",
                name,
                count,
                retry.attempts,
                type(exc).__name__,
                exc,
            )
            raise _OutcomeUnknown(exc) from exc
        return _result_from_snapshot(table, snapshot_id, attempts=count, ours=True)

    try:
        return retry_conflicts(
            attempt,
            what=f"table {name}: replace commit",
            backoff=retry,
            conflict=(CommitFailedException, _OutcomeUnknown),
        )
    except (CommitFailedException, _OutcomeUnknown) as exc:
        last = exc.error if isinstance(exc, _OutcomeUnknown) else exc
        if unknown:
            # A last look: an attempt whose answer was lost may have landed.
            if _refresh(table) is None and (mine := landed()) is not None:
                return _result_from_snapshot(table, mine, attempts=count, ours=True)
            raise CommitOutcomeUnknownError(
                f"table {name}: replace not confirmed after {count} attempts "
                f"({type(last).__name__}: {last}); it may have landed, so its files are kept "
                "(an orphan sweep removes them if no snapshot references them)"
            ) from last
        raise CommitError(
            f"table {name}: replace not committed after {count} attempts "
            f"({type(last).__name__}: {last})"
        ) from last
