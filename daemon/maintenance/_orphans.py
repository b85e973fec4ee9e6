"""Remove data files the daemon wrote but never committed (a crash between encode and commit).

The daemon knows its own file names: a flush writes
``{segment_uuid7}-{partition:05d}-{file:05d}.parquet`` (``iceberg/_parquet.py``, the
prefix is the first spool segment's id; an upsert table's equality deletes are
``{segment_uuid7}-eq-{partition:05d}-{file:05d}.parquet``) and a compaction writes
``c-{uuid7}-{partition:05d}-{file:05d}.parquet`` (``_compact.py``). A uuid7 carries
its creation time in milliseconds. ``remove_orphans`` deletes a file under the table's
data location only when ALL of these hold:

1. its name is one of the two shapes above: files of other writers (Spark's
   ``00000-0-<uuid>-00001.parquet``, pyiceberg's ``<uuid>.parquet``, anything an
   operator copied in) never match;
2. it is older than ``older_than_s`` both by modification time and by the time in
   its uuid7 (a file may be re-written under an old name: an old segment encoded
   again has a fresh mtime; a copy that kept an old mtime has a fresh name time);
3. this replica's spool no longer holds the segment its id names (``is_spooled``;
   the caller also answers true for a compaction it has in flight);
4. no snapshot in the table's metadata reaches it: every snapshot, on every branch
   and tag, rolled back or staged, and every manifest entry including deleted ones
   (a file an old snapshot still reaches is expiry's to remove, with the snapshot).

Why a file another writer is about to commit cannot be removed. A daemon writes its
data files immediately before committing them: ``encode_data_files`` and then
``commit_files``, whose attempts are bounded (12, backoff capped at 5 s, every
catalog call under a timeout), so the window between a file's write and its commit
is seconds, minutes at worst. A commit that gives up gives its files up: the next
flush encodes the segment again, rewriting the same names (deterministic, overwrite)
with a fresh mtime. A compaction's outputs are committed right after they are
written, or deleted. So a file that may still be committed is younger than that
window by mtime, and ``older_than_s`` (1 h by default) is far longer. The listing is
taken before the table is refreshed, so a commit that landed before a file was
listed is in the metadata this sweep reads. For this replica's own files the spool
settles it without any timing: a segment's files can only be committed while the
spool still holds the segment (it is deleted after the commit), and such files are
kept. The timing argument covers other replicas writing the same table; the one
case it does not cover is a replica paused (SIGSTOP, a suspended VM) for longer than
``older_than_s`` between writing its files and committing them: raise
``older_than_s`` where that can happen.

Only a data location inside the table's own location is swept: a ``write.data.path``
elsewhere may be shared with other tables, whose files this table's metadata cannot
vouch for (the result says why nothing was swept).

Everything here blocks; the scheduler runs it in a thread. Cost: one listing of the
data location per call, and, only when old unreferenced-looking daemon files exist,
one read of every manifest of every snapshot (deduplicated by path).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from daemon.iceberg import DELETE_FILE_MARK, refresh_table
from spool import new_uuid7

__all__ = [
    "COMPACTION_PREFIX",
    "DEFAULT_ORPHAN_AGE_S",
    "OrphanResult",
    "compaction_file_prefix",
    "daemon_file_id",
    "daemon_file_time",
    "is_daemon_file",
    "new_file_id",
    "remove_orphans",
]

_log = logging.getLogger("icespool.maintenance.orphans")

#: Files younger than this are never removed (see the module doc).
DEFAULT_ORPHAN_AGE_S: Final = 3600.0
#: Compaction outputs are named ``c-{uuid7}-...``: told apart from flush files at a glance.
COMPACTION_PREFIX: Final = "c-"

_UUID7: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
# An upsert table's flush also writes equality deletes: ``{segment}-eq-...``.
_NAME: Final = re.compile(
    rf"^(?:{re.escape(COMPACTION_PREFIX)})?(?P<id>{_UUID7})(?:{re.escape(DELETE_FILE_MARK)})?"
    r"-[0-9]{5,}-[0-9]{5,}\.parquet$"
)
_DELETE_WORKERS: Final = 8


def daemon_file_id(path: str) -> str | None:
    """The uuid7 in a daemon-written data file's name (a segment or compaction id), else None."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    return match.group("id") if match else None


def is_daemon_file(path: str) -> bool:
    """Whether ``path`` names a data file the daemon wrote (a flush's or a compaction's)."""
    return daemon_file_id(path) is not None


def daemon_file_time(path: str) -> float | None:
    """Epoch seconds at which the id in a daemon file's name was made, else None."""
    file_id = daemon_file_id(path)
    if file_id is None:
        return None
    return int(file_id.replace("-", "")[:12], 16) / 1000


def new_file_id() -> str:
    """A fresh uuid7 for a compaction's output names (the spool's generator)."""
    return new_uuid7()


def compaction_file_prefix(file_id: str) -> str:
    """``encode_data_files``' ``file_prefix`` for a compaction output with ``file_id``."""
    return f"{COMPACTION_PREFIX}{file_id}"


@dataclass(frozen=True)
class OrphanResult:
    """What one sweep saw and did. ``skipped`` names why nothing was swept, if so."""

    listed: int = 0
    foreign: int = 0  # not a daemon name: never touched
    young: int = 0  # younger than older_than_s by mtime or name time
    spooled: int = 0  # this replica's spool still holds the id
    referenced: int = 0  # reached from a snapshot
    removed: int = 0
    bytes_removed: int = 0
    failed: int = 0
    skipped: str | None = None


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
    older_than_s: float = DEFAULT_ORPHAN_AGE_S,
    is_spooled: Callable[[str], bool],
) -> OrphanResult:
    """Delete the daemon's never-committed data files of ``table`` (see the module doc).

    ``is_spooled(file_id)`` gets the uuid7 in a file's name (a spool segment id, or a
    compaction's id) and answers whether this replica still holds it: such files are
    kept whatever their age. Refreshes ``table`` (use a Table instance no other thread
    commits through). An error reading the listing or any manifest deletes nothing.
    """
    if older_than_s <= 0:
        raise ValueError(f"older_than_s must be positive, got {older_than_s}")
    where = _data_location(table)
    if isinstance(where, str):
        _log.info("table %s: no orphan sweep: %s", ".".join(table.name()), where)
        return OrphanResult(skipped=where)
    filesystem, data_path = where
    now = time.time()
    infos = filesystem.get_file_info(
        pafs.FileSelector(data_path, recursive=True, allow_not_found=True)
    )
    listed = foreign = young = spooled = 0
    candidates: dict[str, _Listed] = {}
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        listed += 1
        file_id = daemon_file_id(info.path)
        if file_id is None:
            foreign += 1
            continue
        mtime_ns = info.mtime_ns
        named = daemon_file_time(info.path)
        if (
            mtime_ns is None  # unknown age: never old enough
            or named is None
            or now - mtime_ns / 1e9 < older_than_s
            or now - named < older_than_s
        ):
            young += 1
            continue
        if is_spooled(file_id):
            spooled += 1
            continue
        candidates[info.path] = _Listed(info.path, info.size or 0)
    if not candidates:
        return OrphanResult(listed=listed, foreign=foreign, young=young, spooled=spooled)

    # After the listing: a commit that landed before a file was listed is seen here.
    refresh_table(table)
    referenced = _referenced(table, set(candidates))
    doomed = [item for path, item in candidates.items() if path not in referenced]
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
        young=young,
        spooled=spooled,
        referenced=len(referenced),
        removed=removed,
        bytes_removed=removed_bytes,
        failed=failed,
    )
