"""``commit_replace``: maintenance rewrites (compaction) committed as ONE ``replace``
snapshot, validated on every attempt against the refreshed table; see its doc.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from pyiceberg.exceptions import ValidationException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.errors import CommitError
from icespool.iceberg._commit._engine import (
    TABLE_GONE,
    Attempts,
    CommitKind,
    Staged,
    run,
    table_name,
)
from icespool.iceberg._commit._snapshot import (
    CommitRejectedError,
    CommitResult,
    cannot_load,
    check_summary,
    result_from_snapshot,
)
from icespool.iceberg._parquet import remove_files
from icespool.iceberg._upstream._replace import ReplaceFiles
from icespool.iceberg._upstream._transaction import Staging
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["CommitOutcomeUnknownError", "ReplaceConflictError", "ReplaceExtra", "commit_replace"]


class ReplaceConflictError(CommitError):
    """The files a replace was to remove are no longer all live in ``main``, or delete
    files now apply to them, or the partition spec changed: another writer (Spark's
    ``rewrite_data_files`` or a delete, a row delete, a spec change) got there first.

    Nothing was committed, and no earlier attempt of the same call can still land: each
    attempt first looks for its own snapshots in the refreshed table, and a table that
    fails validation has moved past every earlier attempt's compare-and-swap base.
    The files written for the replace are garbage and may be deleted.
    """


@dataclass(frozen=True)
class ReplaceExtra:
    """What a replace's ``check`` decides on an attempt's refreshed table besides the
    replace itself: more files to remove (delete files nothing live needs any more, or
    superseded ones), and files written for this attempt to add (deletes carried over
    to the new files); the latter are deleted if the attempt does not land."""

    remove: Sequence[DataFile] = ()
    add: Sequence[DataFile] = ()


class CommitOutcomeUnknownError(CommitError):
    """The last attempt's outcome could not be seen (catalog unreachable, lost
    response): the commit may have landed. Files it adds must not be deleted by the
    caller; an orphan sweep removes them later if no snapshot references them."""


def _check_added_spec(table: Table, added: Sequence[DataFile]) -> None:
    """Added data files must be of the current spec (delete files take the spec of the
    data files they apply to, any of the table's)."""
    current_spec = table.metadata.default_spec_id
    for data_file in added:
        if data_file.content == DataFileContent.DATA and data_file.spec_id != current_spec:
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


@dataclass(frozen=True)
class _Replace(CommitKind[ReplaceExtra, CommitResult]):
    """``added`` in place of ``deleted`` as one snapshot; the decision is every file the
    snapshot removes (``check`` may add delete files nothing live needs any more)."""

    deleted: Sequence[DataFile]
    added: Sequence[DataFile]
    summary: Mapping[str, str]
    requirements: Sequence[ValidatableTableRequirement]
    data_sequence_number: int | None
    check: Callable[[Table], ReplaceExtra] | None
    noun = "replace"
    retries_outages = True

    def landed(self, table: Table, attempts: Attempts) -> CommitResult | None:
        mine = attempts.landed_snapshot(table)
        return None if mine is None else result_from_snapshot(table, mine, attempts, ours=True)

    def decide(self, table: Table) -> ReplaceExtra:
        if self.check is None:
            _check_replace(table, self.deleted, self.added)
            return ReplaceExtra(remove=self.deleted)
        _check_added_spec(table, self.added)
        extra = self.check(table)
        removing = [*self.deleted, *extra.remove]
        if not removing:
            remove_files(table, extra.add)
            raise ReplaceConflictError(f"table {table_name(table)}: nothing left to replace")
        return ReplaceExtra(removing, extra.add)

    def stage(self, table: Table, decision: ReplaceExtra) -> Staged:
        try:
            return self._stage(table, decision)
        except BaseException:
            remove_files(table, decision.add)  # written for this attempt, never sent
            raise

    def _stage(self, table: Table, decision: ReplaceExtra) -> Staged:
        transaction = Staging(table)
        try:
            producer = ReplaceFiles(
                operation=Operation.OVERWRITE,  # relabelled in _summary, see ReplaceFiles
                transaction=transaction,
                io=table.io,
                snapshot_properties=dict(self.summary),
                branch=MAIN_BRANCH,
            )
            producer.data_sequence_number = self.data_sequence_number
            for data_file in decision.remove:
                producer.delete_data_file(data_file)
            for data_file in [*self.added, *decision.add]:
                producer.append_data_file(data_file)
            producer.commit()
        except ValidationException as exc:  # "Missing required files to delete"
            raise ReplaceConflictError(f"table {table_name(table)}: {exc}") from exc
        return Staged(transaction, self.requirements, files=decision.add)

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> CommitResult:
        return result_from_snapshot(table, staged.snapshot_id, attempts, ours=True)

    def rejected(self, table: Table, error: BaseException) -> NoReturn:
        kind = CommitError if isinstance(error, TABLE_GONE) else CommitRejectedError
        raise kind(
            f"table {table_name(table)}: replace rejected ({type(error).__name__}: {error})"
        ) from error

    def unloadable(self, table: Table, error: BaseException) -> NoReturn:
        raise cannot_load(table, error) from error

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        name, count = table_name(table), attempts.number
        if attempts.unknown:
            raise CommitOutcomeUnknownError(
                f"table {name}: replace not confirmed after {count} attempts "
                f"({type(last).__name__}: {last}); it may have landed, so its files are kept "
                "(an orphan sweep removes them if no snapshot references them)"
            ) from last
        raise CommitError(
            f"table {name}: replace not committed after {count} attempts "
            f"({type(last).__name__}: {last})"
        ) from last


def commit_replace(
    table: Table,
    *,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    requirements: Sequence[ValidatableTableRequirement] = (),
    data_sequence_number: int | None = None,
    check: Callable[[Table], ReplaceExtra] | None = None,
) -> CommitResult:
    """Replace ``deleted`` by ``added`` in ``main`` as ONE snapshot with operation ``replace``.

    ``data_sequence_number``: the data sequence number the added files carry (None:
    the new snapshot's). ``check``: the caller's validation of the refreshed table on
    every attempt instead of ``_check_replace`` (which refuses any delete file applying
    to ``deleted``); it raises ReplaceConflictError or returns what the attempt removes
    and adds besides (`ReplaceExtra`). The added data files' partition spec is checked
    either way.

    For rewrites that keep every row (compaction): the caller guarantees ``added``
    holds exactly the rows of ``deleted``. Every attempt refreshes the table, looks for
    a snapshot of an earlier attempt (an unknown outcome that landed), then validates
    (``_check_replace``: every removed file still live in main, no delete file applying
    to them, same partition spec) and commits once (the engine, ``_engine``). A
    concurrent commit (CommitFailedException) is retried on the refreshed table, so a
    plain append by another writer lets the replace through with the append's files
    kept; a rewrite or delete of the same files by another writer fails validation.
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
    kind = _Replace(deleted, added, summary, requirements, data_sequence_number, check)
    return run(table, kind, retry)
