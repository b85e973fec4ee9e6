"""Keeps an upsert table's key index (`icespool.cdc.KeyIndex`) ready for its commits.

The index is opened when the writer starts and brought up to date in a thread of its
own, so it is ready (or nearly) by the first commit. A commit uses it only when it can
answer at once (`synced`): not while it is being built, nor when it is behind the
table by more than ``_INLINE_ROWS`` rows (another writer rewrote much of the table), nor
after it failed to read a file; each of those starts (or waits for) a catch-up in the
background, and the commit deletes by key meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

from pyiceberg.table import Table

from icespool.cdc import IndexBehindError, IndexUnavailableError, KeyIndex
from icespool.metrics import Metrics

__all__ = ["IndexKeeper"]

_log = logging.getLogger("icespool.writer")
#: Rows of other writers' snapshots a commit reads into the index itself; beyond, the
#: index catches up in its own thread and the commit deletes by key.
_INLINE_ROWS: Final = 1_000_000
#: Seconds before a failed build of the index is tried again.
_REBUILD_DELAY: Final = 30.0
#: The index's page cache until the table's settings say otherwise.
_FIRST_CACHE: Final = 64 * 2**20


class IndexKeeper:
    """The key index of one upsert table, and whether its commits can use it now."""

    def __init__(
        self,
        name: str,
        key: Sequence[str],
        *,
        path: Path,
        load_table: Callable[[], Table],
        metrics: Metrics,
    ) -> None:
        """``path``: the index's file; ``load_table()``: a Table object of the writer's
        table for the index's own thread (never the flush's)."""
        self._name = name
        self._key = tuple(key)
        self._path = path
        self._load_table = load_table
        self._metrics = metrics
        self._index: KeyIndex | None = None
        self._ready = False  # synced once since it opened, and not known to be behind
        self._builder: threading.Thread | None = None
        self._retry_at = 0.0  # time.monotonic() before which a failed build waits
        self._closed = False
        self._deferred: Callable[[KeyIndex], object] | None = None
        metrics.key_index_ready.labels(table=name).set(0)

    def open(self, table: Table) -> None:
        """Open the index (if it is not) and bring it up to date in the background."""
        if self._index is not None or self._closed:
            return
        schema = table.metadata.schema()
        try:
            ids = [schema.find_field(column).field_id for column in self._key]
            self._index = KeyIndex(self._path, ids, cache_bytes=_FIRST_CACHE)
        except (ValueError, sqlite3.Error, OSError) as exc:
            self.fail(f"cannot open {self._path}: {exc}", delay=_REBUILD_DELAY)
            return
        self._build_soon()

    def status(self) -> dict[str, object]:
        """What /v1/status shows: ready (commits delete by position), and its snapshot."""
        index = self._index
        return {
            "ready": self._ready,
            "snapshot_id": None if index is None or not self._ready else index.snapshot_id,
        }

    @contextlib.contextmanager
    def synced(self, table: Table, cache_bytes: int) -> Iterator[KeyIndex | None]:
        """The index at ``table``'s snapshot, held for this caller alone; None when it
        cannot answer now (it is then brought up to date in the background)."""
        self.open(table)
        index = self._index
        if index is None or not index.lock.acquire(blocking=False):
            yield None  # not openable, or its own thread is building it
            return
        try:
            self._apply_deferred(index)
            usable = self._sync(index, table, cache_bytes)
            yield index if usable else None
        finally:
            index.lock.release()
            self._build_soon()

    def defer(self, update: Callable[[KeyIndex], object]) -> None:
        """Have ``update`` (what a landed commit changed) applied to the index before
        its next use (`synced`) or when it closes: the commit is reported without
        waiting for it, and an index that cannot take it (another snapshot) reads the
        commit at its next sync instead."""
        self._deferred = update

    def _apply_deferred(self, index: KeyIndex) -> None:
        update, self._deferred = self._deferred, None
        if update is None:
            return
        try:
            update(index)
        except (IndexUnavailableError, sqlite3.Error, OSError) as exc:
            self.fail(f"{type(exc).__name__}: {exc}", delay=_REBUILD_DELAY)

    def _sync(self, index: KeyIndex, table: Table, cache_bytes: int) -> bool:
        if not self._ready:
            return False
        try:
            index.set_cache(cache_bytes)
            index.sync(table, max_rows=_INLINE_ROWS)
        except IndexBehindError as exc:
            self.fail(str(exc), delay=0.0)
            return False
        except (IndexUnavailableError, sqlite3.Error, OSError) as exc:
            self.fail(f"{type(exc).__name__}: {exc}", delay=_REBUILD_DELAY)
            return False
        return True

    def fail(self, why: str, *, delay: float = _REBUILD_DELAY) -> None:
        """The index could not answer (``why``): commits delete by key until it has
        caught up in the background (after ``delay`` seconds)."""
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
                self._apply_deferred(index)
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
                self._apply_deferred(index)
                index.close()
            finally:
                index.lock.release()
        self._index = None
