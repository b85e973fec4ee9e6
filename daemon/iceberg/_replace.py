"""``commit_replace``: maintenance rewrites (compaction) committed as ONE ``replace``
snapshot, validated on every attempt against the refreshed table; see its doc.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from pyiceberg.exceptions import (
    CommitFailedException,
    ValidationException,
)
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
)
from pyiceberg.table.update import (
    ValidatableTableRequirement,
)

from icespool.errors import CommitError
from icespool.iceberg._commit_common import (
    PERMANENT_ERRORS,
    TABLE_GONE,
    CommitRejectedError,
    CommitResult,
    check_summary,
    commit_once,
    result_from_snapshot,
    table_name,
    try_refresh,
)
from icespool.iceberg._upstream._replace import ReplaceFiles
from icespool.iceberg._upstream._transaction import Staging
from icespool.runtime.retry import CONFLICTS, Backoff, retry_conflicts

__all__ = ["CommitOutcomeUnknownError", "ReplaceConflictError", "commit_replace"]

_log = logging.getLogger("icespool.commit")


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


def _check_added_spec(table: Table, added: Sequence[DataFile]) -> None:
    current_spec = table.metadata.default_spec_id
    for data_file in added:
        if data_file.spec_id != current_spec:
            raise ReplaceConflictError(
                f"table {table_name(table)}: the partition spec changed to {current_spec} since "
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
    name = table_name(table)
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
    transaction = Staging(table)
    producer = ReplaceFiles(
        operation=Operation.OVERWRITE,  # relabelled in _summary, see ReplaceFiles
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
    to them, same partition spec) and commits through ``commit_once``. A concurrent
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
    check_summary(summary)
    name = table_name(table)
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
        if (refresh_error := try_refresh(table)) is not None:
            raise _OutcomeUnknown(refresh_error)
        if (mine := landed()) is not None:
            return result_from_snapshot(table, mine, attempts=count, ours=True)
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
            commit_once(transaction, requirements)
        except CommitFailedException:
            raise
        except PERMANENT_ERRORS as exc:
            error = CommitError if isinstance(exc, TABLE_GONE) else CommitRejectedError
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
        return result_from_snapshot(table, snapshot_id, attempts=count, ours=True)

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
            if try_refresh(table) is None and (mine := landed()) is not None:
                return result_from_snapshot(table, mine, attempts=count, ours=True)
            raise CommitOutcomeUnknownError(
                f"table {name}: replace not confirmed after {count} attempts "
                f"({type(last).__name__}: {last}); it may have landed, so its files are kept "
                "(an orphan sweep removes them if no snapshot references them)"
            ) from last
        raise CommitError(
            f"table {name}: replace not committed after {count} attempts "
            f"({type(last).__name__}: {last})"
        ) from last
