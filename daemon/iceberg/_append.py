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
copying it (``Staging``), and a SQL catalog commits without re-reading the table's
history (``_upstream/_sql.py``). What is left grows with the snapshots the table
retains (the metadata file written per commit holds them all), which expiry bounds.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``. A Table
instance must not be shared between threads while a commit runs (it is refreshed in
place).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from pyiceberg.exceptions import (
    CommitFailedException,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import (
    Operation,
)

from icespool.errors import CommitError
from icespool.iceberg._commit_common import (
    PERMANENT_ERRORS,
    CommitResult,
    check_summary,
    commit_once,
    rejected,
    result_from_snapshot,
    settle,
    table_name,
    try_refresh,
)
from icespool.iceberg._segments import (
    SEGMENT_RECORDS_SUMMARY_KEY,
    SEGMENTS_SUMMARY_KEY,
    committed_marks,
    covers,
    last_segment_records_key,
    last_segments_key,
)
from icespool.iceberg._upstream._merge_append import MergeAppend, MergeRowDelta
from icespool.iceberg._upstream._transaction import Staging, abandon
from icespool.runtime.retry import CONFLICTS, Backoff
from icespool.runtime.retry import retry as retry_attempts
from icespool.source_claims import ClaimsMovedError

__all__ = ["PropertyUpdate", "StaleEncodingError", "commit_files"]

_log = logging.getLogger("icespool.commit")


#: Called inside every commit attempt with the refreshed table's properties; returns the
#: properties to set in the same metadata commit, or raises (nothing is committed).
PropertyUpdate = Callable[[Mapping[str, str]], Mapping[str, str]]


class StaleEncodingError(CommitError):
    """The data files were encoded for a partition spec the table no longer has.

    pyiceberg writes appended files into a manifest of the table's current spec, so
    committing them would record wrong partition values. Re-encode the segments (the
    spool still holds them) and commit again.
    """


class _Failed(Exception):
    """An attempt that failed in a way another attempt may fix; ``error`` is why."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


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
    check_summary(summary)


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
        if covers(covered, end):
            committed[segment] = snapshot_id
        elif covered is not None and covered > start:
            raise ClaimsMovedError(
                f"table {table_name(table)}: segment {segment} has {covered} of its records "
                f"committed now, not {start} as they were when this commit was built"
            )
    if not committed:
        return None
    missing = [segment for segment in spans if segment not in committed]
    if missing:
        # Committing the files would duplicate the committed segments' rows, and they
        # cannot be told apart inside the encoded files.
        raise CommitError(
            f"table {table_name(table)}: segments {sorted(committed)} are already committed "
            f"(snapshots {sorted(set(committed.values()))}) but {missing} are not; "
            "encode and commit the uncommitted segments on their own "
            "(the spool still holds their records)"
        )
    snapshots = set(committed.values())
    if len(snapshots) > 1:
        raise CommitError(
            f"table {table_name(table)}: segments {list(spans)} were committed by several "
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
                f"table {table_name(table)}: {data_file.file_path} was encoded for partition spec "
                f"{spec_id} but the table now uses spec {current}; re-encode the segments "
                "(the spool still holds the records)"
            )


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

    A merge append (``MergeAppend``): with ``commit.manifest-merge.enabled`` (the
    table's choice; unset: true, Iceberg's default) the new manifest is merged with the
    existing small ones once ``commit.manifest.min-count-to-merge`` of them are due,
    bin-packed to ``commit.manifest.target-size-bytes``; disabled, it adds one manifest
    like a fast append. With delete files among ``data_files`` (an upsert table's
    equality deletes) the same merge append also writes a delete manifest
    (``MergeRowDelta``) and the operation is ``overwrite`` (``delete`` when only delete
    files are added). Nothing is committed here; a failure deletes what was written.
    """
    transaction = Staging(table)
    try:
        if table_properties:
            transaction.set_properties(dict(table_properties))
        operation = _operation(data_files)
        producer = MergeAppend if operation == Operation.APPEND else MergeRowDelta
        with producer(transaction, table.io, summary, operation) as append:
            for data_file in data_files:
                append.append_data_file(data_file)
            snapshot_id: int = append.snapshot_id
    except BaseException:
        abandon(transaction)  # certainly not committed: nothing was sent
        raise
    return transaction, snapshot_id


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
    segments and tries again later. The attempts refused by a conflict are counted in
    ``CommitResult.conflicts``, or in ``CommitError.conflicts`` when the call raises.

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

    # Snapshot ids of our attempts: a snapshot found later with our segments is ours
    # (not "already committed") when its id is one of these.
    attempted: dict[int, Transaction] = {}
    unknown = 0
    conflicts = 0
    number = 0

    def once() -> CommitResult:
        nonlocal number, unknown, conflicts
        number += 1
        attempt = number
        # Always look before committing: a previous attempt (this call's or an earlier
        # process's) may have landed, and the refresh builds on other writers' commits.
        if (refresh_error := try_refresh(table)) is not None:
            raise _Failed(refresh_error)
        existing = _check_segments(table, spans)
        if existing is not None:
            if existing in attempted:
                _log.info(
                    "table %s: an earlier attempt whose outcome was unknown did land "
                    "(snapshot %d holds segments %s); not committing again",
                    table_name(table),
                    existing,
                    ",".join(segments),
                )
            settle(table, attempted, existing)
            return result_from_snapshot(
                table,
                existing,
                attempts=attempt,
                ours=existing in attempted,
                unknown=unknown,
                conflicts=conflicts,
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
        except PERMANENT_ERRORS as exc:
            raise rejected(table, exc) from exc
        except Exception as exc:
            # Writing the manifests failed (object store): nothing was sent to the catalog.
            _log.warning(
                "table %s: writing the commit's manifests failed (attempt %d/%d), nothing "
                "was committed: %s: %s",
                table_name(table),
                attempt,
                policy.attempts,
                type(exc).__name__,
                exc,
            )
            raise _Failed(exc) from exc
        started = time.monotonic()
        try:
            attempted[snapshot_id] = transaction
            commit_once(transaction)
        except CommitFailedException as exc:
            # The catalog refused the swap: nothing of ours landed. Retry on a fresh table.
            conflicts += 1
            _log.info(
                "table %s: commit conflict (attempt %d/%d): %s",
                table_name(table),
                attempt,
                policy.attempts,
                exc,
            )
            raise _Failed(exc) from exc
        except PERMANENT_ERRORS as exc:
            raise rejected(table, exc) from exc
        except Exception as exc:
            # Unknown outcome (lost response, 5xx, connection reset): the next loop
            # iteration refreshes the table and looks for our segments first.
            unknown += 1
            _log.warning(
                "table %s: commit outcome unknown after %.0f ms (attempt %d/%d): %s: %s",
                table_name(table),
                (time.monotonic() - started) * 1000,
                attempt,
                policy.attempts,
                type(exc).__name__,
                exc,
            )
            raise _Failed(exc) from exc
        settle(table, attempted, snapshot_id)
        return result_from_snapshot(
            table, snapshot_id, attempts=attempt, ours=True, unknown=unknown, conflicts=conflicts
        )

    def every_attempt() -> CommitResult:
        try:
            return retry_attempts(
                once, attempts=policy.attempts, retryable=_Failed, pause=policy.pause
            )
        except _Failed as failed:
            last_error = failed.error

        # A last look: the final attempt may have landed despite its error. (If it did
        # not, its files stay: it may still be on its way to the catalog.)
        if try_refresh(table) is None:
            existing = _check_segments(table, spans)
            if existing is not None:
                settle(table, attempted, existing)
                return result_from_snapshot(
                    table,
                    existing,
                    attempts=policy.attempts,
                    ours=existing in attempted,
                    unknown=unknown,
                    conflicts=conflicts,
                )
        raise CommitError(
            f"table {table_name(table)}: commit of segments {segments} failed after "
            f"{policy.attempts} attempts ({type(last_error).__name__}: {last_error}); "
            "the spool still holds the records; a later attempt first checks the table for "
            "them, so nothing is committed twice"
        ) from last_error

    try:
        return every_attempt()
    except CommitError as exc:
        # Whatever ended the call (it gave up, another copy of the spool moved the
        # claims, the table changed its spec), its conflicts happened: the caller
        # counts them.
        exc.conflicts = conflicts
        raise
