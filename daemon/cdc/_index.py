"""Where each live row of an upsert table is: key -> (data file, row position).

An upsert commit deletes the older rows of every key it changes. Written as equality
deletes (a file of keys), every reader joins them against every older data file until
maintenance rewrites the data; written as position deletes (a file of data-file paths
and row positions), a reader applies them to the one file each names. The key index
is what lets a commit write the second kind: it knows, for the table's current
snapshot, the data file and position of every live row of every key.

It is a cache of the table, never the truth: built from the key columns of the live
data files minus the deletes that apply (Iceberg's scoping rules, `_deletes`), kept at
one snapshot of ``main`` (`snapshot_id`), and brought to a newer one (`sync`) by
reading only what each snapshot in between added or removed: data files (their keys),
position deletes and deletion vectors (the rows they name), equality deletes (the keys
they name, for the older files in their scope). A commit of this writer updates it
from what it knows without reading anything (`committed`). Anything it cannot follow
(a rollback, expired snapshots in between, another table under the same name, a file
it cannot read) makes it rebuild.

Why this is safe with other writers: a commit locates its keys on the index synced to
the snapshot its attempt builds on, and the catalog swaps only if that snapshot is
still current. A concurrent rewrite, delete or upsert makes the swap fail; the next
attempt syncs (seeing the other writer's files) and locates again. So a position
delete never names a row that is no longer the key's live row.

The rows live in SQLite (the standard library's), on disk beside the spool, with a
page cache of ``cache_bytes``: memory stays bounded whatever the table's size, and
the file survives a restart (its snapshot id is stored with the rows in one
transaction, so a crash leaves the state of some snapshot, which `sync` then follows).
Blocking: the writer calls it on its table's lane, in a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from icespool.cdc._deletes import DeleteKey, LiveDelete, LiveFiles, live_files
from icespool.cdc._files import read_columns, read_positions
from icespool.cdc._key_values import KeyValue, key_values
from icespool.iceberg import LiveData, Located, file_key, snapshot_entries, v3_value

__all__ = [
    "Change",
    "IndexBehindError",
    "IndexUnavailableError",
    "KeyIndex",
    "Located",
    "NewFile",
]

_log = logging.getLogger("icespool.keys")

#: Snapshots a sync follows one by one; further behind, it rebuilds.
_MAX_CATCH_UP: Final = 2_000
#: Keys per statement (SQLite's default limit of bound parameters is 32,766).
_CHUNK: Final = 20_000
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, seq INTEGER NOT NULL,
    scope TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows(
    file INTEGER NOT NULL, pos INTEGER NOT NULL, key NOT NULL,
    PRIMARY KEY(file, pos)) WITHOUT ROWID;
"""
_KEY_LOOKUP: Final = "CREATE INDEX IF NOT EXISTS rows_key ON rows(key)"
_VERSION: Final = "1"


class IndexUnavailableError(Exception):
    """The index cannot answer for the table now (it is being built, or a file it
    needs cannot be read): the commit writes equality deletes instead."""


class IndexBehindError(IndexUnavailableError):
    """Bringing the index to the table's snapshot would read more rows than the caller
    allows now (a rebuild, or another writer's rewrite of much of the table)."""


@dataclass(frozen=True, slots=True)
class NewFile:
    """A data file a commit adds, with the key of each of its rows in file order."""

    file: DataFile
    spec_id: int
    keys: Sequence[KeyValue]


@dataclass(frozen=True)
class Change:
    """What one of this writer's commits changed (`KeyIndex.committed`): the rows it
    deleted (``located``, where they were), the data files it added (with their keys),
    the data files it replaced by a copy with more rows after theirs (``extended``: old
    path -> the new file, with the keys of the rows it adds) or by one with only their
    live rows, in order, then more (``compacted``: the same), the data files it removed,
    the file-scoped delete files or deletion vectors it added (by the data file each
    names) and the delete files it removed."""

    located: Located
    added: Sequence[NewFile] = ()
    extended: Mapping[str, NewFile] = field(default_factory=dict)
    removed: Sequence[str] = ()
    deletes: Mapping[str, DataFile] = field(default_factory=dict)
    dropped_deletes: Sequence[DeleteKey] = ()
    compacted: Mapping[str, NewFile] = field(default_factory=dict)


class _View:
    """The live files at the index's snapshot: data files, and the position-delete files
    and deletion vectors naming each of them (a file-scoped one names one data file:
    Spark's default, and the daemon's)."""

    def __init__(self, live: LiveFiles | None = None) -> None:
        self.data: dict[str, LiveData] = dict(live.data) if live is not None else {}
        self._naming: dict[str, dict[DeleteKey, LiveDelete]] = defaultdict(dict)
        self._names: dict[DeleteKey, frozenset[str]] = {}  # delete -> the data files it names
        for delete in live.deletes if live is not None else ():
            if not delete.is_equality:
                self.add_delete(delete)

    def add_delete(self, delete: LiveDelete) -> None:
        """A position delete (its ``paths`` known) naming live data files."""
        self._names[delete.key] = delete.paths
        for path in delete.paths:
            self._naming[path][delete.key] = delete

    def drop_delete(self, key: DeleteKey) -> None:
        for path in self._names.pop(key, ()):
            self._naming.get(path, {}).pop(key, None)

    def drop_data(self, path: str) -> None:
        self.data.pop(path, None)
        for key in self._naming.pop(path, {}):
            # A delete naming other data files still names them (dropped with the last).
            rest = self._names.get(key, frozenset()) - {path}
            if rest:
                self._names[key] = rest
            else:
                self._names.pop(key, None)

    def naming(self, path: str) -> list[LiveDelete]:
        """The position deletes naming data file ``path``."""
        return list(self._naming.get(path, {}).values())


class KeyIndex:
    """The key index of one upsert table, kept in the SQLite file at ``path``."""

    def __init__(self, path: Path, key_field_ids: Sequence[int], *, cache_bytes: int) -> None:
        self.path = path
        self._key_ids = tuple(key_field_ids)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = _open(path, cache_bytes)
        # One user at a time: the writer's lane, or a background build.
        self.lock = threading.Lock()
        # The live files at `snapshot_id` (None: not read yet since open).
        self._view: _View | None = None
        self._ids: dict[str, int] = {}

    def close(self) -> None:
        self._db.close()

    def set_cache(self, cache_bytes: int) -> None:
        """Bound the page cache (memory) to about ``cache_bytes``."""
        self._db.execute(f"PRAGMA cache_size={-max(cache_bytes // 1024, 64)}")

    # ------------------------------------------------------------------ state

    @property
    def snapshot_id(self) -> int | None:
        value = self._meta("snapshot")
        return int(value) if value not in (None, "") else None

    def rows(self) -> int:
        """How many live rows the index holds."""
        return int(self._db.execute("SELECT count(*) FROM rows").fetchone()[0])

    def disk_bytes(self) -> int:
        page_size, pages = (
            self._db.execute("PRAGMA page_size").fetchone()[0],
            self._db.execute("PRAGMA page_count").fetchone()[0],
        )
        return int(page_size) * int(pages)

    def _meta(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, **values: str) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO meta(name, value) VALUES(?, ?)", values.items()
        )

    def _identity(self, metadata: TableMetadata) -> dict[str, str]:
        return {
            "version": _VERSION,
            "table": str(metadata.table_uuid),
            "key": ",".join(map(str, self._key_ids)),
        }

    # ------------------------------------------------------------------ sync

    def sync(self, table: Table, *, max_rows: int | None = None) -> None:
        """Bring the index to ``table``'s current snapshot of ``main`` (as loaded).

        ``max_rows``: raise `IndexBehindError` instead when that would read the keys of
        more rows (by the snapshots' summaries), nothing changed."""
        metadata = table.metadata
        current = metadata.current_snapshot()
        identity = self._identity(metadata)
        same = all(self._meta(name) == value for name, value in identity.items())
        if same and current is not None and self.snapshot_id == current.snapshot_id:
            if self._view is None:
                self._view = _View(live_files(table.io, metadata, current))
            return
        chain = _chain(metadata, current, self.snapshot_id) if same else None
        if max_rows is not None:
            if chain is None:
                rows = _summary_rows(current, "total-records")
            else:
                rows = sum(_summary_rows(snapshot, "added-records") for snapshot in chain)
            if rows > max_rows:
                raise IndexBehindError(
                    f"the key index is {rows} rows behind the table (more than {max_rows})"
                )
        if chain is None:
            self.rebuild(table)
            return
        for snapshot in chain:
            self._follow(table, snapshot)

    def rebuild(self, table: Table) -> None:
        """Read the whole table's keys again (the index was of another table or state)."""
        metadata = table.metadata
        current = metadata.current_snapshot()
        live = live_files(table.io, metadata, current) if current is not None else None
        with self._transaction():
            self._db.execute("DELETE FROM rows")
            self._db.execute("DELETE FROM files")
            self._ids.clear()
            self._view = _View()
            # The key lookup index is built once after the rows (a sort), not row by row:
            # random inserts into it over a table larger than the page cache hit disk.
            self._db.execute("DROP INDEX rows_key")
            if live is not None:
                specs = metadata.specs()
                for path, data in live.data.items():
                    self._add_file(table.io, path, data, specs[data.spec_id].is_unpartitioned())
            self._db.execute(_KEY_LOOKUP)
            if live is not None:
                self._apply_deletes(table.io, live.deletes)
            snapshot = "" if current is None else str(current.snapshot_id)
            self._set_meta(**self._identity(metadata), snapshot=snapshot)
        _log.info(
            "%s: key index built at snapshot %s: %d rows in %d data files",
            ".".join(table.name()),
            snapshot or "(none)",
            self.rows(),
            len(self._view.data),
            extra={"table": ".".join(table.name())},
        )

    def _follow(self, table: Table, snapshot: Snapshot) -> None:
        """Apply what ``snapshot`` (the child of the index's) added and removed."""
        io = table.io
        metadata = table.metadata
        specs = metadata.specs()
        added, removed = _changes(io, snapshot, metadata.format_version)
        if self._view is None:
            parent = metadata.snapshot_by_id(snapshot.parent_snapshot_id or -1)
            self._view = _View(live_files(io, metadata, parent) if parent else None)
        view = self._view
        with self._transaction():
            for data in removed:
                if data.file.content == DataFileContent.DATA:
                    self._drop_file(data.file.file_path)
                else:
                    view.drop_delete(file_key(data.file))
            deletes = [d for d in added if d.file.content != DataFileContent.DATA]
            equality = [
                LiveDelete(
                    d.file, d.sequence_number, d.spec_id, specs[d.spec_id].is_unpartitioned()
                )
                for d in deletes
                if d.file.content == DataFileContent.EQUALITY_DELETES
            ]
            self._apply_deletes(io, equality)
            older: list[str] = []
            for data in added:
                if data.file.content != DataFileContent.DATA:
                    continue
                self._add_file(
                    io, data.file.file_path, data, specs[data.spec_id].is_unpartitioned()
                )
                if data.sequence_number < (snapshot.sequence_number or 0):
                    older.append(data.file.file_path)
            if older:
                # A rewrite keeping the sequence number it started from: equality
                # deletes committed since apply to its new files too.
                self._reapply_equality(table, snapshot, older)
            positional = [
                _live_delete(d, False)
                for d in deletes
                if d.file.content == DataFileContent.POSITION_DELETES
            ]
            self._apply_deletes(io, positional)
            self._set_meta(snapshot=str(snapshot.snapshot_id))

    # ------------------------------------------------------------------ lookups

    def locate(self, keys: Sequence[KeyValue]) -> Located:
        """Where the live rows of ``keys`` are (a key may have none, or, written by
        another engine without a delete, several)."""
        live = self._view.data if self._view is not None else {}
        positions: dict[str, list[int]] = defaultdict(list)
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            for path, pos in self._db.execute(
                "SELECT files.path, rows.pos FROM rows JOIN files ON files.id = rows.file "
                f"WHERE rows.key IN ({marks})",
                chunk,
            ):
                positions[path].append(pos)
        missing = [path for path in positions if path not in live]
        if missing:  # the rows and the live files disagree: never guess a row
            raise IndexUnavailableError(f"key index names files not live: {missing[:3]}")
        return Located(
            {p: np.sort(np.asarray(v, dtype=np.int64)) for p, v in positions.items()},
            {p: live[p] for p in positions},
        )

    def live_rows(self, path: str) -> tuple[np.ndarray, list[KeyValue]]:
        """The positions of the live rows of data file ``path``, and their keys."""
        file_id = self._ids_of([path]).get(path)
        if file_id is None:
            return np.zeros(0, dtype=np.int64), []
        rows = self._db.execute(
            "SELECT pos, key FROM rows WHERE file = ? ORDER BY pos", (file_id,)
        ).fetchall()
        return np.asarray([r[0] for r in rows], dtype=np.int64), [r[1] for r in rows]

    def live_count(self, path: str) -> int:
        """How many rows of data file ``path`` are live."""
        file_id = self._ids_of([path]).get(path)
        if file_id is None:
            return 0
        row = self._db.execute("SELECT count(*) FROM rows WHERE file = ?", (file_id,)).fetchone()
        return int(row[0])

    def data_file(self, path: str) -> LiveData | None:
        """The live data file at ``path`` (None: not live at the index's snapshot)."""
        return self._view.data.get(path) if self._view is not None else None

    def scoped_deletes(self, path: str) -> list[LiveDelete]:
        """The live position deletes (files or vectors) that name data file ``path``
        alone."""
        return [d for d in self.position_deletes(path) if len(d.paths) == 1]

    def position_deletes(self, path: str) -> list[LiveDelete]:
        """Every live position delete (file or vector) naming data file ``path``."""
        return self._view.naming(path) if self._view is not None else []

    def committed(
        self,
        snapshot_id: int,
        parent_id: int | None,
        sequence_number: int,
        change: Change,
        scopes: Mapping[int, bool],
        row_ids: Mapping[str, int] | None = None,
    ) -> bool:
        """Record this writer's commit ``snapshot_id`` (child of ``parent_id``) that made
        ``change``, without reading anything. ``scopes``: spec id -> whether it is
        unpartitioned; ``row_ids``: the ``first_row_id`` of each data file it added, by
        path (a table with row lineage). False (nothing changed) when the index is not at
        ``parent_id``: the next `sync` reads the commit instead."""
        ids = row_ids or {}
        view = self._view
        if self.snapshot_id != parent_id or view is None:
            return False
        with self._transaction():
            for path, positions in change.located.positions.items():
                file_id = self._ids_of([path]).get(path)
                if file_id is None:
                    continue
                self._db.executemany(
                    "DELETE FROM rows WHERE file = ? AND pos = ?",
                    ((file_id, int(p)) for p in positions),
                )
            for old, new in change.extended.items():
                self._extend(old, new, self._live(new, sequence_number, ids))
            for old, new in change.compacted.items():
                live = self._live(new, sequence_number, ids)
                self._compact(old, new, live, scopes[new.spec_id])
            for path in change.removed:
                self._drop_file(path)
            for key in change.dropped_deletes:
                view.drop_delete(key)
            for new in change.added:
                data = self._live(new, sequence_number, ids)
                file_id = self._register(new.file.file_path, data, scopes[new.spec_id])
                self._insert(file_id, new.keys)
            for path, delete_file in change.deletes.items():
                spec_id = getattr(delete_file, "spec_id", 0)
                view.add_delete(
                    LiveDelete(delete_file, sequence_number, spec_id, False, frozenset({path}))
                )
            self._set_meta(snapshot=str(snapshot_id))
        return True

    # ------------------------------------------------------------------ writing

    @staticmethod
    def _live(new: NewFile, sequence_number: int, row_ids: Mapping[str, int]) -> LiveData:
        path = new.file.file_path
        return LiveData(new.file, sequence_number, new.spec_id, row_ids.get(path))

    def _extend(self, old: str, new: NewFile, live: LiveData) -> None:
        """``old`` replaced by ``new`` (``live``): the same rows at the same positions,
        then more. Its rows keep their entries (the file's id is the same; O(new rows))."""
        view = self._view
        file_id = self._ids_of([old]).get(old)
        previous = view.data.get(old) if view is not None else None
        if file_id is None or previous is None or view is None:
            raise IndexUnavailableError(f"key index has no live file {old} to extend")
        path = new.file.file_path
        self._db.execute(
            "UPDATE files SET path = ?, seq = ? WHERE id = ?",
            (path, live.sequence_number, file_id),
        )
        self._ids.pop(old, None)
        self._ids[path] = file_id
        view.drop_data(old)
        view.data[path] = live
        self._insert(file_id, new.keys, start=previous.file.record_count)

    def _compact(self, old: str, new: NewFile, live: LiveData, unpartitioned: bool) -> None:
        """``old`` replaced by ``new`` (``live``): its live rows in their order, then more.
        Its entries move to the new file renumbered (O(its live rows), in SQLite)."""
        file_id = self._ids_of([old]).get(old)
        if file_id is None or self._view is None or old not in self._view.data:
            raise IndexUnavailableError(f"key index has no live file {old} to compact")
        new_id = self._register(new.file.file_path, live, unpartitioned)
        kept = self._db.execute(
            "INSERT INTO rows(file, pos, key) SELECT ?, ROW_NUMBER() OVER (ORDER BY pos) - 1, "
            "key FROM rows WHERE file = ?",
            (new_id, file_id),
        ).rowcount
        if kept + len(new.keys) != new.file.record_count:
            raise IndexUnavailableError(
                f"{new.file.file_path} holds {new.file.record_count} rows, the key index "
                f"has {kept} live rows of {old} and {len(new.keys)} new ones"
            )
        self._drop_file(old)
        self._insert(new_id, new.keys, start=kept)

    def _add_file(self, io: FileIO, path: str, data: LiveData, unpartitioned: bool) -> None:
        file_id = self._register(path, data, unpartitioned)
        try:
            columns = read_columns(io, path, self._key_ids)
        except (OSError, ValueError) as exc:
            raise IndexUnavailableError(f"cannot read the keys of {path}: {exc}") from exc
        self._insert(file_id, key_values(columns))

    def _register(self, path: str, data: LiveData, unpartitioned: bool) -> int:
        scope = "" if unpartitioned else _scope(data.spec_id, data.file)
        cursor = self._db.execute(
            "INSERT INTO files(path, seq, scope) VALUES(?, ?, ?)",
            (path, data.sequence_number, scope),
        )
        file_id = int(cursor.lastrowid or 0)
        self._ids[path] = file_id
        if self._view is not None:
            self._view.data[path] = data
        return file_id

    def _insert(self, file_id: int, keys: Sequence[KeyValue], start: int = 0) -> None:
        self._db.executemany(
            "INSERT INTO rows(file, pos, key) VALUES(?, ?, ?)",
            zip([file_id] * len(keys), range(start, start + len(keys)), keys, strict=True),
        )

    def _drop_file(self, path: str) -> None:
        file_id = self._ids_of([path]).get(path)
        if file_id is None:
            return
        self._db.execute("DELETE FROM rows WHERE file = ?", (file_id,))
        self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        self._ids.pop(path, None)
        if self._view is not None:
            self._view.drop_data(path)

    def _ids_of(self, paths: Iterable[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for path in paths:
            if path in self._ids:
                found[path] = self._ids[path]
                continue
            row = self._db.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
            if row is not None:
                found[path] = self._ids[path] = int(row[0])
        return found

    def _apply_deletes(self, io: FileIO, deletes: Sequence[LiveDelete]) -> None:
        for delete in deletes:
            if delete.is_equality:
                self._apply_equality(io, delete)
            else:
                self._apply_positions(io, delete)

    def _apply_positions(self, io: FileIO, delete: LiveDelete) -> None:
        # The paths it names are known from the manifest (a whole-table read found them,
        # a vector says its one) or read with the positions.
        try:
            named = read_positions(io, delete.file, delete.paths or None)
        except (OSError, ValueError) as exc:
            raise IndexUnavailableError(f"cannot read {delete.path}: {exc}") from exc
        if self._view is not None:
            self._view.add_delete(replace(delete, paths=delete.paths or frozenset(named)))
        known = self._ids_of(named)
        for path, file_id in known.items():
            positions = named[path]
            self._db.executemany(
                "DELETE FROM rows WHERE file = ? AND pos = ?",
                ((file_id, int(p)) for p in positions),
            )

    def _apply_equality(self, io: FileIO, delete: LiveDelete, only: Sequence[str] = ()) -> None:
        ids = tuple(delete.file.equality_ids or ())
        if ids != self._key_ids:
            raise IndexUnavailableError(
                f"equality delete {delete.path} matches columns {list(ids)}, not the key "
                f"{list(self._key_ids)}"
            )
        try:
            keys = key_values(read_columns(io, delete.path, ids))
        except (OSError, ValueError) as exc:
            raise IndexUnavailableError(f"cannot read {delete.path}: {exc}") from exc
        scope = "" if delete.is_global else _scope(delete.spec_id, delete.file)
        files = "SELECT id FROM files WHERE seq < ?" + (
            "" if delete.is_global else " AND scope = ?"
        )
        params: list[object] = [delete.sequence_number]
        if not delete.is_global:
            params.append(scope)
        if only:
            files += f" AND path IN ({','.join('?' * len(only))})"
            params.extend(only)
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            self._db.execute(
                f"DELETE FROM rows WHERE key IN ({marks}) AND file IN ({files})",
                [*chunk, *params],
            )

    def _reapply_equality(self, table: Table, snapshot: Snapshot, paths: Sequence[str]) -> None:
        live = live_files(table.io, table.metadata, snapshot)
        for delete in live.deletes:
            if delete.is_equality:
                self._apply_equality(table.io, delete, only=paths)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            # What was cached of the rolled-back state is read again when needed.
            self._view = None
            self._ids.clear()
            raise
        self._db.execute("COMMIT")


def _open(path: Path, cache_bytes: int) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # A cache, rebuilt when lost: WAL keeps each transaction atomic across a crash
        # without an fsync per commit.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA cache_size={-max(cache_bytes // 1024, 64)}")
        # Sorts (the lookup's CREATE INDEX after a build) spill to temporary files past
        # the cache: the build's memory stays bounded by key_index_memory.
        db.execute("PRAGMA temp_store=FILE")
        db.executescript(_SCHEMA)
        db.execute(_KEY_LOOKUP)
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def _live_delete(data: LiveData, is_global: bool) -> LiveDelete:
    return LiveDelete(data.file, data.sequence_number, data.spec_id, is_global)


def _summary_rows(snapshot: Snapshot | None, key: str) -> int:
    summary = snapshot.summary if snapshot is not None else None
    value = summary.get(key) if summary is not None else None
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _scope(spec_id: int, data_file: DataFile) -> str:
    return f"{spec_id}:{data_file.partition!r}"


def _chunks(values: Sequence[KeyValue]) -> Iterator[Sequence[KeyValue]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _chain(
    metadata: TableMetadata, current: Snapshot | None, since: int | None
) -> list[Snapshot] | None:
    """The snapshots from the child of ``since`` to ``current``, oldest first (None:
    ``since`` is not an ancestor of ``current`` that can be walked to)."""
    if since is None or current is None:
        return None
    chain: list[Snapshot] = []
    snapshot: Snapshot | None = current
    while snapshot is not None and snapshot.snapshot_id != since:
        chain.append(snapshot)
        if len(chain) > _MAX_CATCH_UP or snapshot.parent_snapshot_id is None:
            return None
        snapshot = metadata.snapshot_by_id(snapshot.parent_snapshot_id)
    if snapshot is None:
        return None
    chain.reverse()
    return chain


def _changes(
    io: FileIO, snapshot: Snapshot, format_version: int
) -> tuple[list[LiveData], list[LiveData]]:
    """The files ``snapshot`` added and removed (entries it wrote with its own id)."""
    added: list[LiveData] = []
    removed: list[LiveData] = []
    for manifest, entries in snapshot_entries(
        io, snapshot, format_version, discard_deleted=False, added_by=snapshot.snapshot_id
    ):
        for entry in entries:
            if entry.snapshot_id != snapshot.snapshot_id:
                continue
            data = LiveData(
                entry.data_file,
                entry.sequence_number or 0,
                manifest.partition_spec_id,
                v3_value(entry.data_file, "first_row_id"),
            )
            if entry.status == ManifestEntryStatus.ADDED:
                added.append(data)
            elif entry.status == ManifestEntryStatus.DELETED:
                removed.append(data)
    return added, removed
