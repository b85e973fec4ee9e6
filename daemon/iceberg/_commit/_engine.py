"""The commit engine: the one protocol every commit to a table follows, written once.

A kind of commit (`CommitKind`: an append, compaction's replace, a property update, a
snapshot expiry, a row delete, a schema change) supplies only what is its own: what it
decides and stages on the refreshed table, how it recognises its own change in the
table, the result it returns and the errors it ends with. `run` does the rest, the same
way for every kind:

1. Refresh the table (``refresh_table``: skipped when the catalog still names the loaded
   metadata file), so the attempt builds on other writers' commits. A catalog that cannot
   be read fails the attempt; a table that cannot be loaded at all (gone, re-created)
   ends the call (``unloadable``).
2. Look for the change before deciding anything (``landed``): an earlier attempt whose
   outcome was unknown (this call's, or an earlier process's) may have landed. If the
   change is there, the call returns it and commits nothing.
3. Decide on what the table holds now (``decide``): a check that refuses the commit
   raises, and nothing is sent; a decision that nothing needs committing is returned as
   it is (`Unchanged`). Then build the commit (``stage``: write its manifests). Iceberg
   refusing to build it (`PERMANENT_ERRORS`) rejects the commit (``rejected``); any other
   failure (the object store) fails the attempt, and nothing was sent. An icespool error
   raised while building is the kind's own verdict and ends the call as it is.
4. Send it once. pyiceberg's ``commit_transaction`` retries a conflict by re-applying the
   staged updates on the refreshed table: that would skip the kind's own checks (steps 2
   and 3: segment ids, Kafka offset ranges, files still live) against what the other
   writer just committed. Here the conflict comes back, and the next attempt refreshes,
   looks and decides again.
5. Classify what the send raised, the same way for every kind:
   - ``CommitFailedException``: a conflict. The catalog refused the swap, so nothing of
     the attempt landed; its manifests are deleted, and the next attempt builds on the
     refreshed table. Counted in ``Attempts.conflicts``.
   - `PERMANENT_ERRORS`: Iceberg rejected the request itself; retrying cannot help, and
     it certainly did not land (``rejected``).
   - anything else: the outcome is unknown (a lost answer, a 5xx, a reset): the commit
     may have landed. Counted in ``Attempts.unknown``; the next attempt looks first.
6. Retry with backoff (the call's `Backoff`, ``CONFLICTS`` unless it passes another): a
   conflict always, up to ``Backoff.attempts`` attempts in all; the other failures
   (catalog or store unreachable, outcome unknown) too for the kinds that ride outages
   out (``retries_outages``: the data commits, run by jobs that would only retry them),
   while for the others such a failure ends the attempts and their caller decides.
7. The last look: when an attempt's outcome was unknown, the table is refreshed and
   searched for the change once more before giving up (``gave_up``). Only an unknown
   outcome can have landed: a refused swap did not, and a failed refresh or build sent
   nothing. Without the change the attempt's files stay: it may still be on its way to
   the catalog (an orphan sweep removes them if no snapshot ever references them).

Why each kind's change lands exactly once:

- Retrying after an unknown outcome is safe because every attempt is built on the table
  state observed *after* checking that the change is absent, and catalogs commit by
  compare-and-swap on that state (SQL: metadata_location; REST: assert-ref-snapshot-id;
  Glue: the table's VersionId). If the earlier attempt lands late, the retry's swap
  fails, and the next check finds the change; if the retry lands, the earlier attempt's
  swap fails. Either way the change lands once.
- So at most one attempt of a call ever lands, and once the change is known to be in the
  table the other attempts' files are garbage (`_settle`; the landed one loses only the
  manifests a merge left unlisted). Cleanup is best effort: a file left behind is an
  orphan, never a failure of the commit.
- An append recognises its change by the spool segments it adds (``_marks``): every
  snapshot the daemon commits carries ``icespool.segments`` = the comma-joined ids of the
  spool segments whose rows it adds, and ``icespool.segment-records`` how many of each
  segment's records the table holds after it. Each attempt searches every snapshot in
  the refreshed metadata for them. The summary and not a table property: it is written
  atomically with the data (same metadata commit), costs nothing extra, cannot be
  clobbered by another replica's concurrent property update, and does not grow table
  metadata per commit. Every snapshot and not only the current ancestry: a snapshot that
  someone rolled back or that lives on another branch still means "these segments were
  committed once"; committing them again would undo an operator's rollback or duplicate
  rows on a fast-forward.
- ``expire_snapshots`` removes old snapshots and their summaries, so the same commit also
  sets the table property ``icespool.spool.<spool-id>.last-segments`` = the ids of the
  segments that spool's latest commit to this table added (and their record counts).
  Expiry never touches properties. That is enough: a writer deletes a commit's segments
  from its spool before it commits anything else for that table, so the segments that
  can be committed but still spooled (crash between commit and delete) are always among
  the latest commit's. The value is bounded by one commit's segments, needs no ordering
  of segment ids (a wall clock stepped back cannot make a new segment look committed),
  and each spool has its own key, so replicas sharing a table never overwrite each
  other's.
- A replace or a row delete recognises its change by the ids of the snapshots its
  attempts staged (`Attempts.landed_snapshot`); a property update by the values it set;
  an expiry by its chosen snapshots being gone; a schema change by nothing being left to
  plan. What the look finds that another writer committed (a copy of the spool's commit
  of the same segments, the same property value) is the same outcome for the caller.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``. A Table
instance must not be shared between threads while a commit runs (it is refreshed in
place).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, NoReturn, Protocol, TypeVar, cast

from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ResolveError,
    ValidationException,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import AssertTableUUID, TableRequirement, ValidatableTableRequirement

from icespool.errors import CommitError, IcespoolError
from icespool.iceberg._commit._requirements import refuse_unchecked
from icespool.iceberg._parquet import remove_files
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._transaction import (
    abandon,
    send,
    staged_snapshot_ids,
    tidy,
)
from icespool.runtime.retry import Backoff, retry

__all__ = [
    "PERMANENT_ERRORS",
    "TABLE_GONE",
    "Attempts",
    "CommitKind",
    "Staged",
    "Unchanged",
    "run",
    "table_name",
]

_log = logging.getLogger("icespool.commit")

_D = TypeVar("_D")
_R_co = TypeVar("_R_co", covariant=True)

# Errors that say the request itself is wrong: retrying cannot help, and the commit
# certainly did not land (they are raised while building or validating it).
PERMANENT_ERRORS: Final = (
    NoSuchTableError,
    NoSuchNamespaceError,
    ValidationException,
    ResolveError,
    ValueError,
    TypeError,
)

TABLE_GONE: Final = (NoSuchTableError, NoSuchNamespaceError)


def table_name(table: Table) -> str:
    return ".".join(table.name())


@dataclass(frozen=True)
class Staged:
    """One attempt's commit, built and not sent yet: the staged ``transaction``, the
    ``requirements`` the catalog checks at the swap besides the transaction's own (a
    maintenance lease, the refs an expiry relies on), and the ``files`` written for this
    attempt alone (an upsert's deletes, resolved against its base): deleted with its
    manifests when it does not land."""

    transaction: Transaction
    requirements: Sequence[ValidatableTableRequirement] = ()
    files: Sequence[DataFile] = ()

    @property
    def snapshot_ids(self) -> tuple[int, ...]:
        """The snapshots the commit adds (none: it changes only metadata)."""
        return staged_snapshot_ids(self.transaction)

    @property
    def snapshot_id(self) -> int:
        """The snapshot the commit adds (the last one, when it adds several)."""
        return self.snapshot_ids[-1]


@dataclass(frozen=True)
class Unchanged(Generic[_R_co]):
    """A decision that nothing needs committing: the call returns ``result``."""

    result: _R_co


@dataclass
class Attempts:
    """This call's attempts so far. The kinds read it to recognise their own earlier
    change and to report the figures (``CommitResult``'s ``attempts``, ``conflicts`` and
    ``unknown_outcomes``)."""

    allowed: int
    number: int = 0  # the attempt running (1-based); after the last, how many were made
    conflicts: int = 0  # refused by the catalog because another writer committed first
    unknown: int = 0  # sent, and the outcome was not seen
    sent: list[Staged] = field(default_factory=list)  # every attempt that reached the send

    def _snapshot_ids(self) -> set[int]:
        return {snapshot_id for staged in self.sent for snapshot_id in staged.snapshot_ids}

    def ours(self, snapshot_id: int) -> bool:
        """Whether ``snapshot_id`` is a snapshot one of these attempts staged."""
        return snapshot_id in self._snapshot_ids()

    def landed_snapshot(self, table: Table) -> int | None:
        """The snapshot of one of these attempts that ``table`` (as loaded) holds."""
        ours = self._snapshot_ids()
        landed = (s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id in ours)
        return next(landed, None)


class CommitKind(Protocol[_D, _R_co]):
    """What one kind of commit supplies to `run`: ``decide`` and ``stage`` (what it
    commits, checked against the refreshed table), ``landed`` (its change recognised in
    the table), ``committed`` (its result), and the errors it ends with. The error hooks
    raise the error they are given unless a kind overrides them."""

    #: Names the commit in log lines: "table t: <noun> conflict (attempt 2/12): ...".
    noun: str
    #: Whether an attempt that failed without a verdict (catalog or object store
    #: unreachable, outcome unknown) is followed by another (True), or ends the attempts
    #: with its error after the last look (False: the caller retries on its own terms).
    retries_outages: bool

    def landed(self, table: Table, attempts: Attempts) -> _R_co | None:
        """The result when the refreshed ``table`` holds this commit's change already
        (an earlier attempt landed, or another writer made the same change), else None."""
        ...

    def decide(self, table: Table) -> _D | Unchanged[_R_co]:
        """What to commit on the refreshed ``table``, checked against it; raises (nothing
        is committed, the error ends the call) when the table contradicts the commit."""
        ...

    def stage(self, table: Table, decision: _D) -> Staged:
        """Build the commit ``decision`` describes (write its manifests); sent by `run`."""
        ...

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> _R_co:
        """The result once ``staged`` landed (``table`` holds the swapped metadata)."""
        ...

    def rejected(self, table: Table, error: BaseException) -> NoReturn:
        """End the call for ``error``, one of `PERMANENT_ERRORS` building or sending it."""
        raise error

    def unloadable(self, table: Table, error: BaseException) -> NoReturn:
        """End the call for ``error``, one of `PERMANENT_ERRORS` refreshing the table."""
        raise error

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        """End the call after the attempts ran out or an outage ended them; ``last`` is
        the final attempt's error."""
        raise last


class _Failed(Exception):
    """An attempt that failed without a verdict; another attempt may succeed."""

    def __init__(self, error: BaseException, *, conflict: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.conflict = conflict


def run(table: Table, kind: CommitKind[_D, _R_co], backoff: Backoff) -> _R_co:
    """Commit ``kind`` to ``table`` by the protocol of the module doc: at most
    ``backoff.attempts`` attempts, then the last look. A `CommitError` the call ends
    with carries the attempts' ``conflicts``."""
    attempts = Attempts(backoff.attempts)

    def again(error: BaseException) -> bool:
        return isinstance(error, _Failed) and (error.conflict or kind.retries_outages)

    try:
        try:
            return retry(
                lambda: _attempt(table, kind, attempts),
                attempts=backoff.attempts,
                retryable=again,
                pause=backoff.pause,
            )
        except _Failed as failed:
            last = failed.error
        # The last look: an attempt whose outcome was unknown may have landed.
        if attempts.unknown and _refreshed(table, kind):
            result = _look(table, kind, attempts)
            if result is not None:
                return result
        kind.gave_up(table, attempts, last)
    except CommitError as exc:
        # Whatever ended the call (it gave up, another copy of the spool moved the
        # claims, the table changed its spec), its conflicts happened: the caller
        # counts them.
        exc.conflicts = attempts.conflicts
        raise


def _attempt(table: Table, kind: CommitKind[_D, _R_co], attempts: Attempts) -> _R_co:
    attempts.number += 1
    # Always look before committing: an earlier attempt (this call's, or an earlier
    # process's) may have landed, and the refresh builds on other writers' commits.
    _refresh(table, kind)
    if (result := _look(table, kind, attempts)) is not None:
        return result
    decision = kind.decide(table)
    if isinstance(decision, Unchanged):
        return cast("Unchanged[_R_co]", decision).result
    staged = _stage(table, kind, decision, attempts)
    _send(table, kind, staged, attempts)
    _settle(table, attempts)
    return kind.committed(table, staged, attempts)


def _refresh(table: Table, kind: CommitKind[_D, _R_co]) -> None:
    try:
        refresh_table(table)
    except PERMANENT_ERRORS as exc:
        kind.unloadable(table, exc)
    except Exception as exc:  # catalog unreachable: another attempt may read it
        _log.warning("table %s: refresh failed: %s: %s", table_name(table), type(exc).__name__, exc)
        raise _Failed(exc) from exc


def _refreshed(table: Table, kind: CommitKind[_D, _R_co]) -> bool:
    try:
        _refresh(table, kind)
    except _Failed:
        return False
    return True


def _look(table: Table, kind: CommitKind[_D, _R_co], attempts: Attempts) -> _R_co | None:
    result = kind.landed(table, attempts)
    if result is not None:
        _settle(table, attempts)
    return result


def _stage(table: Table, kind: CommitKind[_D, _R_co], decision: _D, attempts: Attempts) -> Staged:
    try:
        return kind.stage(table, decision)
    except IcespoolError:  # the kind's own verdict (a conflict it found building)
        raise
    except PERMANENT_ERRORS as exc:
        kind.rejected(table, exc)
    except Exception as exc:
        # Writing the manifests failed (object store): nothing was sent to the catalog.
        _log.warning(
            "table %s: writing the %s's manifests failed (attempt %d/%d), nothing "
            "was committed: %s: %s",
            table_name(table),
            kind.noun,
            attempts.number,
            attempts.allowed,
            type(exc).__name__,
            exc,
        )
        raise _Failed(exc) from exc


def _send(table: Table, kind: CommitKind[_D, _R_co], staged: Staged, attempts: Attempts) -> None:
    """Send ``staged`` once and classify what the catalog answered (the module doc)."""
    transaction = staged.transaction
    refuse_unchecked(table.catalog, staged.requirements, table=table_name(table))
    # pyiceberg types requirements as the union of Iceberg's kinds; a catalog that
    # validates locally (checked above) only calls validate() on them.
    requirements = cast(
        "tuple[TableRequirement, ...]",
        (
            *staged.requirements,
            # The staged updates never change the uuid: read it without deriving metadata.
            AssertTableUUID(uuid=table.metadata.table_uuid),
        ),
    )
    attempts.sent.append(staged)
    started = time.monotonic()
    try:
        send(transaction, requirements)
    except CommitFailedException as exc:
        # The catalog refused the swap: nothing of ours landed. Retry on a fresh table.
        _discard(table, staged)
        attempts.conflicts += 1
        _log.info(
            "table %s: %s conflict (attempt %d/%d): %s",
            table_name(table),
            kind.noun,
            attempts.number,
            attempts.allowed,
            exc,
        )
        raise _Failed(exc, conflict=True) from exc
    except PERMANENT_ERRORS as exc:
        kind.rejected(table, exc)
    except Exception as exc:
        # Unknown outcome (lost response, 5xx, connection reset): the next attempt
        # refreshes the table and looks for the change first.
        attempts.unknown += 1
        _log.warning(
            "table %s: %s outcome unknown after %.0f ms (attempt %d/%d): %s: %s",
            table_name(table),
            kind.noun,
            (time.monotonic() - started) * 1000,
            attempts.number,
            attempts.allowed,
            type(exc).__name__,
            exc,
        )
        raise _Failed(exc) from exc


def _settle(table: Table, attempts: Attempts) -> None:
    """Clean up after the attempts once the change is known to be in ``table``: the one
    that landed loses the manifests it left unlisted, the others all their files (none of
    them can land any more: the module doc)."""
    for staged in attempts.sent:
        try:
            if any(table.metadata.snapshot_by_id(i) is not None for i in staged.snapshot_ids):
                tidy(table, staged.transaction)
            else:
                _discard(table, staged)
        except Exception as exc:
            _log.warning(
                "table %s: could not delete files of an earlier commit attempt: %s: %s",
                table_name(table),
                type(exc).__name__,
                exc,
            )


def _discard(table: Table, staged: Staged) -> None:
    """Delete what an attempt that certainly did not land wrote."""
    abandon(staged.transaction)
    remove_files(table, staged.files)
