"""Remove data files this spool's processes wrote but never committed (a crash or a
commit that gave up between encode and commit).

The daemon knows its own file names: a flush writes
``{segment_uuid7}-{incarnation}-{partition:05d}-{file:05d}.parquet`` (``write/flush.py``; the
segment is the commit's first spool segment, the incarnation a 12-hex tag of the process,
recorded in its spool directory; an upsert table's equality deletes are
``{segment_uuid7}-{incarnation}-eq-...``) and a compaction writes
``c-{uuid7}-{incarnation}-{partition:05d}-{file:05d}.parquet`` (``_compact.py``). Names
without an incarnation come from versions that did not write one. ``remove_orphans``
deletes a file under the table's data location only when ALL of these hold:

1. its name is one of the shapes above AND carries the running process's incarnation
   or an earlier one of this spool that has provably ended (``FileOwner``): files of
   other replicas, of other tools (Spark's ``00000-0-<uuid>-00001.parquet``,
   pyiceberg's ``<uuid>.parquet``) and of versions without incarnations are never
   removed, whatever their age;
2. this replica no longer holds the segment (or compaction) its id names
   (``is_spooled``);
3. no snapshot in the table's metadata reaches it: every snapshot, on every branch
   and tag, rolled back or staged, and every manifest entry including deleted ones
   (a file an old snapshot still reaches is expiry's to remove, with the snapshot);
4. the running process did not see it committed (``was_committed``): a file this
   process committed that no snapshot reaches any more was dropped by the table's
   history going back (its catalog restored from a backup, or failed over to a replica
   that lagged), or by another tool's expiry that left its files. It holds acked rows
   the table may have lost, so it is kept (logged at warning,
   ``icespool_maintenance_files_kept``) for an operator to add back or remove.

Why no other writer's file is ever at risk: ownership is read from the name, which the
writing process chose, and from the spool's record of its incarnations, never from a
clock. Another replica's clock, a paused replica, an object store's server-side
timestamps: none of them makes a file of another process look like one of ours. Files
of a replica that is gone for good are left to Spark's ``remove_orphan_files`` (the
docs/maintenance.md says which ``older_than`` is safe beside the daemon).

Why this spool's own files can be judged without timing: the files the running process
writes for a segment can only be committed while the spool holds the segment (it is
deleted after the commit), and a compaction's while it is in flight (``is_spooled``
answers for both); the listing is taken before the table is refreshed, so a commit that
landed before a file was listed is in the metadata this sweep reads. An earlier
incarnation counts only once it has provably ended (``FileOwner.earlier``: it ran on
this kernel and its process is gone, ``spool/_incarnation.py``): a process that ended
commits nothing more. One that may still run elsewhere (a copy of this directory on
another machine, the previous container of a pod) is treated as another writer.

Only a data location inside the table's own location is swept: a ``write.data.path``
elsewhere may be shared with other tables, whose files this table's metadata cannot
vouch for (the result says why nothing was swept).

Everything here blocks; the scheduler runs it in a thread. Cost: one listing of the
data location per call, and, only when unreferenced-looking files of ours exist, one
read of every manifest of every snapshot (deduplicated by path).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from icespool.iceberg import (
    DELETE_FILE_MARK,
    POSITION_DELETE_MARK,
    TAIL_FILE_MARK,
    refresh_table,
)
from icespool.spool import new_uuid7

__all__ = [
    "COMPACTION_PREFIX",
    "FileOwner",
    "OrphanResult",
    "compaction_file_prefix",
    "daemon_file_id",
    "daemon_file_incarnation",
    "is_daemon_file",
    "new_file_id",
    "remove_orphans",
]

_log = logging.getLogger("icespool.maintenance.orphans")

#: Compaction outputs are named ``c-{uuid7}-...``: told apart from flush files at a glance.
COMPACTION_PREFIX: Final = "c-"

_MARKS: Final = "|".join(
    re.escape(mark) for mark in (DELETE_FILE_MARK, POSITION_DELETE_MARK, TAIL_FILE_MARK)
)
_UUID7: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_INCARNATION: Final = r"[0-9a-f]{12}"
# An upsert table's flush also writes delete files: ``{segment}-{incarnation}-eq-...``
# (equality) or ``...-pos-...`` (position), and rewrites its last small data file
# (``...-t-...``), each mark numbered by the commit attempt.
_NAME: Final = re.compile(
    rf"^(?:{re.escape(COMPACTION_PREFIX)})?(?P<id>{_UUID7})(?:-(?P<incarnation>{_INCARNATION}))?"
    rf"(?:(?:{_MARKS})[0-9]*)?"
    rf"-[0-9]{{5,}}-[0-9]{{5,}}\.parquet$"
)
_DELETE_WORKERS: Final = 8


def daemon_file_id(path: str) -> str | None:
    """The uuid7 in a daemon-written data file's name (a segment or compaction id), else None."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    return match.group("id") if match else None


def daemon_file_incarnation(path: str) -> str | None:
    """The incarnation tag in a daemon-written data file's name, else None."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    return match.group("incarnation") if match else None


def is_daemon_file(path: str) -> bool:
    """Whether ``path`` names a data file the daemon wrote (a flush's or a compaction's)."""
    return daemon_file_id(path) is not None


@dataclass(frozen=True)
class FileOwner:
    """Whose data files a sweep may remove: the running process's incarnation, and
    the earlier incarnations its spool directory recorded (``Spool.incarnations``)."""

    current: str
    earlier: frozenset[str] = frozenset()  # ended: they commit nothing more


def new_file_id() -> str:
    """A fresh uuid7 for a compaction's output names (the spool's generator)."""
    return new_uuid7()


def compaction_file_prefix(file_id: str, incarnation: str) -> str:
    """``encode_data_files``' ``file_prefix`` for a compaction output with ``file_id``,
    written by the process ``incarnation``."""
    return f"{COMPACTION_PREFIX}{file_id}-{incarnation}"


@dataclass(frozen=True)
class OrphanResult:
    """What one sweep saw and did. ``skipped`` names why nothing was swept, if so."""

    listed: int = 0
    foreign: int = 0  # not a daemon name, or another spool's (or no incarnation): never touched
    spooled: int = 0  # this replica's spool still holds the id
    referenced: int = 0  # reached from a snapshot
    removed: int = 0
    bytes_removed: int = 0
    failed: int = 0
    skipped: str | None = None
    # Unreferenced files this process committed (rule 4): kept.
    kept: int = 0


@dataclass(frozen=True)
class _Listed:
    path: str  # as the file system names it (and as _normal names manifest paths)
    size: int


def _normal(io: PyArrowFileIO, location: str) -> str:
    """A location as the file system names it: manifests and listings compare equal."""
    return PyArrowFileIO.parse_location(location, io.properties)[2]


def _data_location(table: Table) -> tuple[pafs.FileSystem, str] | str:
    """(file system, data path) to sweep, or why the table's data cannot be swept."""
    io = table.io
    if not isinstance(io, PyArrowFileIO):
        return (
            f"orphan removal lists files through pyarrow; the table's FileIO is "
            f"{type(io).__name__} (set py-io-impl to pyiceberg.io.pyarrow.PyArrowFileIO)"
        )
    data = table.location_provider().data_path
    scheme, netloc, data_path = PyArrowFileIO.parse_location(data, io.properties)
    own = _normal(io, table.metadata.location).rstrip("/")
    if not data_path.startswith(own + "/"):
        return (
            f"the data location {data} is outside the table location "
            f"{table.metadata.location} and may be shared with other tables"
        )
    return io.fs_by_scheme(scheme, netloc), data_path


def _referenced(table: Table, candidates: set[str]) -> set[str]:
    """The candidates some snapshot in the table's metadata reaches."""
    io = table.io
    assert isinstance(io, PyArrowFileIO)  # checked by _data_location
    seen: set[str] = set()
    found: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                path = _normal(io, entry.data_file.file_path)
                if path in candidates:
                    found.add(path)
    return found


def _delete(filesystem: pafs.FileSystem, listed: _Listed) -> int | None:
    """Bytes removed (0: already gone), or None if the file could not be deleted."""
    try:
        filesystem.delete_file(listed.path)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        _log.warning("could not remove orphan data file %s: %s", listed.path, exc)
        return None
    return listed.size


def remove_orphans(
    table: Table,
    *,
    owner: FileOwner,
    is_spooled: Callable[[str], bool],
    was_committed: Callable[[str], bool] = lambda name: False,
) -> OrphanResult:
    """Delete this spool's never-committed data files of ``table`` (see the module doc).

    ``owner``: the incarnations whose files are this spool's. ``is_spooled(file_id)``
    gets the uuid7 in a file's name (a spool segment id, or a compaction's id) and
    answers whether this replica still holds it: such files are kept.
    ``was_committed(file_name)``: whether the running process saw the file committed
    (rule 4). Refreshes
    ``table`` (use a Table instance no other thread commits through). An error reading
    the listing or any manifest deletes nothing.
    """
    where = _data_location(table)
    if isinstance(where, str):
        _log.info("table %s: no orphan sweep: %s", ".".join(table.name()), where)
        return OrphanResult(skipped=where)
    filesystem, data_path = where
    infos = filesystem.get_file_info(
        pafs.FileSelector(data_path, recursive=True, allow_not_found=True)
    )
    listed = foreign = spooled = 0
    candidates: dict[str, _Listed] = {}
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        listed += 1
        match = _NAME.match(info.path.rsplit("/", 1)[-1])
        incarnation = match.group("incarnation") if match else None
        if (
            match is None
            or incarnation is None
            or (incarnation != owner.current and incarnation not in owner.earlier)
        ):
            foreign += 1
            continue
        file_id = match.group("id")
        if is_spooled(file_id):
            spooled += 1
            continue
        candidates[info.path] = _Listed(info.path, info.size or 0)
    if not candidates:
        return OrphanResult(listed=listed, foreign=foreign, spooled=spooled)

    # After the listing: a commit that landed before a file was listed is seen here.
    refresh_table(table)
    referenced = _referenced(table, set(candidates))
    unreferenced = [item for path, item in candidates.items() if path not in referenced]
    kept = [item for item in unreferenced if was_committed(item.path.rsplit("/", 1)[-1])]
    if kept:
        _log.warning(
            "table %s: %d data file(s) this process committed are in no snapshot any more "
            "(e.g. %s): the table lost those commits (its catalog restored from a backup, "
            "or failed over to a replica that lagged), or another tool expired their "
            "snapshots without deleting them. Their rows may be missing from the table: "
            "they are kept, to add back (Spark's add_files, pyiceberg's Table.add_files) "
            "or remove",
            ".".join(table.name()),
            len(kept),
            ", ".join(item.path for item in kept[:3]),
            extra={"table": ".".join(table.name()), "kept_files": len(kept)},
        )
    keep = {item.path for item in kept}
    doomed = [item for item in unreferenced if item.path not in keep]
    removed = failed = removed_bytes = 0
    with ThreadPoolExecutor(_DELETE_WORKERS, thread_name_prefix="icespool-orphans") as pool:
        for outcome in pool.map(lambda item: _delete(filesystem, item), doomed):
            if outcome is None:
                failed += 1
            else:
                removed += 1
                removed_bytes += outcome
    if removed or failed:
        _log.info(
            "table %s: removed %d never-committed data file(s) (%d bytes), %d failed",
            ".".join(table.name()),
            removed,
            removed_bytes,
            failed,
        )
    return OrphanResult(
        listed=listed,
        foreign=foreign,
        spooled=spooled,
        referenced=len(referenced),
        removed=removed,
        bytes_removed=removed_bytes,
        failed=failed,
        kept=len(kept),
    )
