"""Snapshot expiry and the files only expired snapshots reached.

Three steps, so that only the first holds the table's lane:

1. ``choose_expired`` (pure): which snapshots the retention policy lets go.
   Iceberg's rules (Java's ``RemoveSnapshots``, Spark's ``expire_snapshots``): per
   branch, its head and its newest ``min-snapshots-to-keep`` ancestors stay, and so
   does every ancestor younger than ``max-snapshot-age-ms`` (the ref's own values
   when it sets them, else the table's); a tag's snapshot stays; a snapshot no ref
   reaches stays while it is younger than the table's max age. On top, the daemon's
   cap keeps at most ``max_snapshots`` (dropping the oldest first), never a ref head
   nor a branch's minimum. Refs themselves are never removed.
2. `icespool.iceberg.commit_expiry` (in the lane): removes them from the metadata in one
   commit, re-choosing on the refreshed table at each attempt. Table properties are
   untouched: exactly-once (``icespool.spool.*``, Kafka offsets) never depends on
   snapshots surviving. Old metadata.json files go by pyiceberg's
   ``write.metadata.delete-after-commit.enabled`` at that commit.
3. ``find_garbage`` then ``delete_files`` (a thread, outside the lane): the manifest
   lists of the expired snapshots, their manifests that no retained snapshot lists,
   and the data/delete files in those that no retained manifest holds live. Each
   retained manifest list and manifest is read at most once (deduplicated by path),
   retained lists newest first and only until every candidate is decided, and a
   retained manifest is skipped when its sequence numbers show it cannot hold any
   candidate. Deletion is bounded per run; what is left or failed is retried.

A file found this way cannot become reachable again: new commits only add new
files or keep what the current (retained) snapshot holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFileContent, ManifestFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

__all__ = [
    "DATA_FILE",
    "DELETE_FILE",
    "MANIFEST",
    "MANIFEST_LIST",
    "DeleteOutcome",
    "ExpiryConflictError",
    "ExpiryDeadlineError",
    "Garbage",
    "choose_expired",
    "delete_files",
    "find_garbage",
]

# Kinds of removed files (the `kind` label of icespool_maintenance_files_removed_total).
MANIFEST_LIST: Final = "manifest_list"
MANIFEST: Final = "manifest"
DATA_FILE: Final = "data_file"
#: Equality and position delete files (reached through delete manifests).
DELETE_FILE: Final = "delete_file"


class ExpiryConflictError(Exception):
    """A retained snapshot's manifest list or manifest vanished while it was read: another
    writer (Spark's ``expire_snapshots``) expired it and deleted its files after this
    expiry's commit. Nothing is decided from a partial view (a file that snapshot's
    successors still reach could look unreferenced): the search is repeated by the next
    run on the table as it is then."""


class ExpiryDeadlineError(TimeoutError):
    """The run's deadline passed while looking for garbage (nothing was deleted; the
    files stay, unreachable, until a run finds them again: see ``Garbage``)."""


def _ancestors(head: int, by_id: dict[int, Snapshot]) -> list[Snapshot]:
    """``head`` and its ancestors present in the metadata, newest first."""
    chain: list[Snapshot] = []
    seen: set[int] = set()
    current: int | None = head
    while current is not None and current not in seen:
        seen.add(current)
        snapshot = by_id.get(current)
        if snapshot is None:
            break
        chain.append(snapshot)
        current = snapshot.parent_snapshot_id
    return chain


def choose_expired(
    metadata: TableMetadata,
    *,
    max_age_ms: int,
    min_snapshots: int,
    max_snapshots: int,
    now_ms: int,
) -> set[int]:
    """The ids of the snapshots that retention lets go (see the module doc)."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    heads: set[int] = set()
    minimum: set[int] = set()  # never dropped by the cap either
    kept: set[int] = set()
    reached: set[int] = set()
    for ref in metadata.refs.values():
        heads.add(ref.snapshot_id)
        if ref.snapshot_ref_type != SnapshotRefType.BRANCH:
            reached.add(ref.snapshot_id)
            continue
        keep_count = ref.min_snapshots_to_keep or min_snapshots
        cutoff = now_ms - (ref.max_snapshot_age_ms or max_age_ms)
        for depth, snapshot in enumerate(_ancestors(ref.snapshot_id, by_id)):
            reached.add(snapshot.snapshot_id)
            if depth < keep_count:
                minimum.add(snapshot.snapshot_id)
            elif snapshot.timestamp_ms >= cutoff:
                kept.add(snapshot.snapshot_id)
    cutoff = now_ms - max_age_ms
    for snapshot in metadata.snapshots:
        if snapshot.snapshot_id not in reached and snapshot.timestamp_ms >= cutoff:
            kept.add(snapshot.snapshot_id)
    retained = heads | minimum | kept
    if len(retained) > max_snapshots:
        # The cap: the oldest of those retained by age go first.
        optional = sorted(
            (by_id[i] for i in kept - heads - minimum),
            key=lambda s: (s.timestamp_ms, s.sequence_number or 0),
        )
        excess = len(retained) - max_snapshots
        retained -= {s.snapshot_id for s in optional[:excess]}
    return set(by_id) - retained


@dataclass
class Garbage:
    """Files to delete, by kind; ``manifests_read`` / ``lists_read``: the reading cost."""

    files: list[tuple[str, str]] = field(default_factory=list)
    lists_read: int = 0
    manifests_read: int = 0


def find_garbage(
    io: FileIO,
    expired: Sequence[Snapshot],
    retained: TableMetadata,
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> Garbage:
    """The files that only ``expired`` reached, given the metadata ``retained`` after
    the expiry commit. Raises ExpiryDeadlineError past ``deadline`` (monotonic)."""
    garbage = Garbage()

    def check() -> None:
        if clock() > deadline:
            raise ExpiryDeadlineError(
                f"deadline passed after reading {garbage.lists_read} manifest lists and "
                f"{garbage.manifests_read} manifests"
            )

    def listed(snapshot: Snapshot) -> list[ManifestFile]:
        check()
        garbage.lists_read += 1
        return snapshot.manifests(io)

    def retained_list(snapshot: Snapshot) -> list[ManifestFile]:
        try:
            return listed(snapshot)
        except FileNotFoundError as exc:
            raise ExpiryConflictError(
                f"the manifest list of retained snapshot {snapshot.snapshot_id} is gone "
                "(another writer expired it)"
            ) from exc

    retained_lists = {s.manifest_list for s in retained.snapshots}
    candidates: dict[str, ManifestFile] = {}
    for snapshot in expired:
        if snapshot.manifest_list in retained_lists:  # pragma: no cover - lists are per snapshot
            continue
        try:
            manifests = listed(snapshot)
        except FileNotFoundError:
            continue  # its list is gone already (an earlier run's deletion)
        garbage.files.append((MANIFEST_LIST, snapshot.manifest_list))
        for manifest in manifests:
            candidates.setdefault(manifest.manifest_path, manifest)

    # Retained lists newest first, until every candidate is found in one: an
    # append-only table's candidates are all in the current snapshot's list, so one
    # read decides them. The loop reads every retained list only when some candidate
    # is in none of them (then `retained_manifests` is complete, as needed below).
    newest_first = sorted(retained.snapshots, key=lambda s: -s.timestamp_ms)
    retained_manifests: dict[str, ManifestFile] = {}
    unreferenced = set(candidates)
    for snapshot in newest_first:
        if not unreferenced:
            return garbage
        for manifest in retained_list(snapshot):
            retained_manifests.setdefault(manifest.manifest_path, manifest)
            unreferenced.discard(manifest.manifest_path)
    if not unreferenced:
        return garbage

    # Data and delete files of the unreferenced manifests, with their data sequence number
    # (delete manifests are manifests like any other: listed, read and removed alike).
    files: dict[str, int] = {}
    deletes: set[str] = set()
    for path in sorted(unreferenced):
        check()
        garbage.manifests_read += 1
        try:
            entries = candidates[path].fetch_manifest_entry(io, discard_deleted=False)
        except FileNotFoundError:
            # Deleted already, with what it held decided then: by an earlier part of
            # this sweep (consecutive snapshots list the same unmerged manifest, and a
            # sweep cut short by its deadline goes on next run), or by another engine's
            # expiry (Spark's: the data files only it reached it deleted too; any it left
            # are unreachable, the orphan sweeps'). Failing here would fail every later
            # run on the same file.
            continue
        for entry in entries:
            sequence = entry.sequence_number or 0
            file_path = entry.data_file.file_path
            files[file_path] = max(files.get(file_path, 0), sequence)
            if entry.data_file.content != DataFileContent.DATA:
                deletes.add(file_path)
        garbage.files.append((MANIFEST, path))
    newest = max(files.values(), default=0)
    for manifest in retained_manifests.values():
        if not files:
            break
        # Entries keep their data sequence number when manifests are rewritten, so a
        # manifest whose smallest one is newer than every candidate's holds none of them.
        smallest = manifest.min_sequence_number
        if newest and smallest is not None and smallest > newest:
            continue
        check()
        garbage.manifests_read += 1
        try:
            entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
        except FileNotFoundError as exc:
            raise ExpiryConflictError(
                f"retained manifest {manifest.manifest_path} is gone (another writer expired "
                "the snapshots listing it)"
            ) from exc
        for entry in entries:
            files.pop(entry.data_file.file_path, None)
    # Data files first: they are what costs storage if a run is cut short.
    garbage.files[:0] = [(DELETE_FILE if path in deletes else DATA_FILE, path) for path in files]
    return garbage


@dataclass
class DeleteOutcome:
    """What ``delete_files`` did: removed per kind, failures, and what is left."""

    removed: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # kind, path, error
    left: list[tuple[str, str]] = field(default_factory=list)


def delete_files(
    io: FileIO,
    files: Sequence[tuple[str, str]],
    *,
    limit: int,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> DeleteOutcome:
    """Delete ``files`` ((kind, path), in order) up to ``limit`` of them and until
    ``deadline``. A file already gone counts as done; another error is kept in
    ``failed`` (the caller retries it next run) and the rest go on."""
    outcome = DeleteOutcome()
    for index, (kind, path) in enumerate(files):
        if index >= limit or clock() > deadline:
            outcome.left.extend(files[index:])
            break
        try:
            io.delete(path)
        except FileNotFoundError:
            continue
        except Exception as exc:
            outcome.failed.append((kind, path, f"{type(exc).__name__}: {exc}"))
            continue
        outcome.removed[kind] = outcome.removed.get(kind, 0) + 1
    return outcome
