"""An upsert table's way from spooled changes to a commit: the last change per key wins,
its upserts become data files, and the older rows of every key it changes are deleted
by position in the same snapshot.

Where those rows are is the table's key index (`icespool.cdc.KeyIndex`: key -> data
file and row position, a file of its own under the spool directory). Each commit
attempt syncs it to the snapshot the attempt builds on, locates the keys, and writes
position-delete files naming exactly those rows (`icespool.iceberg.commit_upsert`
resolves them again if another writer got there first). A key first written by this
commit has no older row: nothing is deleted for it. After the commit the index takes
the commit's own changes without reading anything back.

When the index cannot answer within the commit, the commit deletes by key instead
(equality deletes, as Iceberg's upsert writers do): while it is first built, or behind
the table by more than ``_INLINE_ROWS`` rows (another writer rewrote much of the table),
or when a file it needs cannot be read. It is then brought up to date in a thread of
its own, and maintenance turns the equality deletes into position deletes.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa
from pyiceberg.table import Table

from icespool.cdc import (
    IndexBehindError,
    IndexUnavailableError,
    KeyIndex,
    KeyValue,
    Located,
    NewFile,
    key_values,
    last_changes,
)
from icespool.config import WriterSettings
from icespool.iceberg import (
    DELETE_FILE_MARK,
    POSITION_DELETE_MARK,
    AttemptDeletes,
    CommitResult,
    UpsertResult,
    check_key_columns,
    check_upsert_layout,
    commit_upsert,
    encode_data_files_with_rows,
    encode_equality_deletes,
    encode_position_deletes,
)
from icespool.metrics import Metrics
from icespool.write.rows import CommitMarks, Encoded

__all__ = ["UpsertRows"]

_log = logging.getLogger("icespool.writer")
#: Rows of other writers' snapshots a commit reads into the index itself; beyond, the
#: index catches up in its own thread and the commit deletes by key.
_INLINE_ROWS: Final = 1_000_000
#: Seconds before a failed build of the index is tried again.
_REBUILD_DELAY: Final = 30.0


@dataclass(frozen=True)
class _Plan:
    """What one flush's commit needs besides its data files."""

    prefix: str
    settings: WriterSettings
    keys: pa.Table  # the key columns of every key the changes touched, one row each
    values: Sequence[KeyValue]  # the same keys as index values
    new_files: Sequence[NewFile]  # the data files written, with the key of each row
    attempts: Iterator[int] = field(default_factory=itertools.count)


class UpsertRows:
    """An upsert table's rows (`icespool.write.rows.TableRows`), with its key index."""

    def __init__(
        self,
        name: str,
        key: Sequence[str],
        *,
        index_path: Path,
        load_table: Callable[[], Table],
        metrics: Metrics,
        on_equality_deletes: Callable[[], object] = lambda: None,
    ) -> None:
        """``index_path``: the key index's file; ``load_table()``: a Table object of
        the writer's table for the index's own thread (never the flush's);
        ``on_equality_deletes()``: told (from the flush's thread) after a commit that
        deleted by key, so maintenance turns those deletes into position deletes."""
        self._name = name
        self._key = tuple(key)
        self._index_path = index_path
        self._load_table = load_table
        self._metrics = metrics
        self._on_equality_deletes = on_equality_deletes
        self._index: KeyIndex | None = None
        self._ready = False  # synced once since it opened, and not known to be behind
        self._builder: threading.Thread | None = None
        self._retry_at = 0.0  # time.monotonic() before which a failed build waits
        self._closed = False
        metrics.key_index_ready.labels(table=name).set(0)

    def start(self, table: Table) -> None:
        """Open the key index and bring it up to date in its own thread, so it is ready
        (or nearly) by the first commit."""
        self._open(table)

    def status(self) -> dict[str, object] | None:
        index = self._index
        return {
            "ready": self._ready,
            "snapshot_id": None if index is None or not self._ready else index.snapshot_id,
        }

    # ------------------------------------------------------------------ encode

    def encode(
        self,
        table: Table,
        rows: list[pa.RecordBatch],
        prefix: str,
        schema: pa.Schema,
        settings: WriterSettings,
    ) -> Encoded:
        """The data files of the surviving upserts, and the keys the commit changes."""
        # A key column renamed by another writer holds the table back (retried, nothing
        # quarantined): the changes cannot be resolved, and the rows are not at fault.
        check_key_columns(table, self._key, self._name)
        resolved = last_changes(rows, schema, self._key)
        written = encode_data_files_with_rows(
            table,
            resolved.upserts.to_batches(),
            target_file_size=settings.target_file_size,
            row_group_records=settings.row_group_records,
            compression=settings.compression,
            file_prefix=prefix,
        )
        upsert_keys = resolved.upserts.select(list(self._key))
        spec_id = table.metadata.default_spec_id
        new_files = [
            NewFile(e.file, spec_id, key_values(upsert_keys.take(e.rows).columns)) for e in written
        ]
        plan = _Plan(
            prefix=prefix,
            settings=settings,
            keys=resolved.keys,
            values=key_values(resolved.keys.columns),
            new_files=new_files,
        )
        return Encoded([e.file for e in written], plan)

    # ------------------------------------------------------------------ commit

    def commit(self, table: Table, encoded: Encoded, marks: CommitMarks) -> CommitResult:
        plan = encoded.plan
        if not isinstance(plan, _Plan):  # pragma: no cover - encoded by this object
            raise TypeError(f"not an upsert table's encoding: {plan!r}")
        result = commit_upsert(
            table,
            encoded.files,
            lambda base: self._deletes(base, plan),
            segment_ids=marks.segment_ids,
            summary=marks.summary,
            update_properties=marks.update_properties,
            spool_id=marks.spool_id,
            segment_spans=marks.spans,
        )
        self._record(table, result, plan)
        return result.commit

    def _deletes(self, table: Table, plan: _Plan) -> AttemptDeletes:
        """The delete files of one attempt, for the refreshed ``table`` it builds on."""
        attempt = next(plan.attempts)
        settings = plan.settings
        located = self._locate(table, plan.values, settings)
        if located is not None:
            files = encode_position_deletes(
                table,
                located,
                file_prefix=f"{plan.prefix}{POSITION_DELETE_MARK}{attempt}",
                compression=settings.compression,
            )
            return AttemptDeletes(files, located)
        # Deleting by key: every older row of each key, whatever its file. Another
        # writer may have repartitioned the table: deletes that would miss rows hold
        # the table back (retried, nothing quarantined) instead.
        check_upsert_layout(table, self._key, self._name)
        files = encode_equality_deletes(
            table,
            plan.keys.to_batches(),
            self._key,
            target_file_size=settings.target_file_size,
            row_group_records=settings.row_group_records,
            compression=settings.compression,
            file_prefix=f"{plan.prefix}{DELETE_FILE_MARK}{attempt}",
        )
        return AttemptDeletes(files)

    def _locate(
        self, table: Table, values: Sequence[KeyValue], settings: WriterSettings
    ) -> Located | None:
        """Where the live rows of ``values`` are in ``table`` (None: the index cannot
        answer now; it is brought up to date in its own thread)."""
        index = self._open(table)
        if index is None or not index.lock.acquire(blocking=False):
            return None  # not openable, or its own thread is building it
        try:
            if not self._ready:
                return None
            index.set_cache(settings.key_index_memory)
            index.sync(table, max_rows=_INLINE_ROWS)
            return index.locate(values)
        except IndexBehindError as exc:
            self._behind(str(exc), delay=0.0)
        except (IndexUnavailableError, sqlite3.Error, OSError) as exc:
            self._behind(f"{type(exc).__name__}: {exc}", delay=_REBUILD_DELAY)
        finally:
            index.lock.release()
            self._build_soon()
        return None

    def _record(self, table: Table, result: UpsertResult, plan: _Plan) -> None:
        """Count the commit, and give the index what it changed (no read back)."""
        deletes = result.deletes
        kind = "position" if deletes is None or deletes.located is not None else "equality"
        self._metrics.upsert_commits.labels(table=self._name, deletes=kind).inc()
        if kind == "equality" and deletes is not None and deletes.files:
            self._on_equality_deletes()
        index = self._index
        if deletes is None or deletes.located is None or index is None:
            return  # the index reads the snapshot at its next sync
        if not index.lock.acquire(blocking=False):
            return
        try:
            snapshot = table.metadata.snapshot_by_id(result.commit.snapshot_id)
            if snapshot is None:  # pragma: no cover - the commit just landed
                return
            specs = table.metadata.specs()
            scopes = {spec_id: spec.is_unpartitioned() for spec_id, spec in specs.items()}
            index.committed(
                snapshot.snapshot_id,
                result.parent_id,
                snapshot.sequence_number or 0,
                deletes.located,
                plan.new_files,
                scopes,
            )
        except (sqlite3.Error, OSError) as exc:
            self._behind(f"{type(exc).__name__}: {exc}", delay=_REBUILD_DELAY)
        finally:
            index.lock.release()

    # ------------------------------------------------------------------ the index

    def _open(self, table: Table) -> KeyIndex | None:
        if self._index is not None or self._closed:
            return self._index
        schema = table.metadata.schema()
        try:
            ids = [schema.find_field(column).field_id for column in self._key]
            self._index = KeyIndex(self._index_path, ids, cache_bytes=64 * 2**20)
        except (ValueError, sqlite3.Error, OSError) as exc:
            self._behind(f"cannot open {self._index_path}: {exc}", delay=_REBUILD_DELAY)
            return None
        self._build_soon()
        return self._index

    def _behind(self, why: str, *, delay: float) -> None:
        if self._ready:
            _log.warning(
                "%s: key index behind the table (%s); commits delete by key until it has "
                "caught up in the background",
                self._name,
                why,
                extra={"table": self._name},
            )
        self._ready = False
        self._metrics.key_index_ready.labels(table=self._name).set(0)
        self._retry_at = time.monotonic() + delay

    def _build_soon(self) -> None:
        """Bring the index up to date in a thread of its own, unless one is at it, it
        is ready, or a failed build waits."""
        if self._ready or self._closed or self._index is None:
            return
        if self._builder is not None and self._builder.is_alive():
            return
        if time.monotonic() < self._retry_at:
            return
        self._builder = threading.Thread(
            target=self._build, args=(self._index,), name=f"key-index {self._name}", daemon=True
        )
        self._builder.start()

    def _build(self, index: KeyIndex) -> None:
        started = time.monotonic()
        with index.lock:
            if self._closed:
                return
            try:
                index.sync(self._load_table())
            except Exception as exc:
                self._retry_at = time.monotonic() + _REBUILD_DELAY
                _log.warning(
                    "%s: key index not built (%s: %s); commits delete by key, retrying in %.0fs",
                    self._name,
                    type(exc).__name__,
                    exc,
                    _REBUILD_DELAY,
                    extra={"table": self._name},
                )
                return
            self._ready = True
        self._metrics.key_index_ready.labels(table=self._name).set(1)
        _log.info(
            "%s: key index ready at snapshot %s in %.1fs; commits delete by position",
            self._name,
            index.snapshot_id,
            time.monotonic() - started,
            extra={"table": self._name},
        )

    def close(self) -> None:
        """Stop building; close the index once its thread lets go (the file stays)."""
        self._closed = True
        builder, index = self._builder, self._index
        if builder is not None:
            builder.join(timeout=1.0)
        if index is not None and index.lock.acquire(timeout=1.0):
            try:
                index.close()
            finally:
                index.lock.release()
        self._index = None
