"""One segment file being written: append, fsync, seal. Blocking; runs in spool threads."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pyarrow as pa

from ._errors import SpoolIOError
from ._format import EOS, SEALED_BY_WRITER, Encoder, empty_batch, segment_schema
from ._fs import FileSystem
from ._names import segment_file_name


class OpenSegment:
    """The writable tail segment of one table.

    The spool serializes `write` and `seal` per table; `sync` may run in another
    thread concurrently with a `write` (fdatasync covers whatever reached the
    page cache before it started, which is what group commit relies on).

    Invariant under disk faults: the file's first `size` bytes are whole,
    verifiable messages starting with the schema message. A failed write is cut
    back to `size`; when that cut or an fdatasync fails, `failed` says why and
    the segment takes no more writes (the spool rotates to a fresh one).
    """

    def __init__(
        self, directory: Path, table: str, schema: pa.Schema, segment_id: str, fs: FileSystem
    ) -> None:
        self.id = segment_id
        self.table = table
        self.schema = schema
        self.path = directory / segment_file_name(table, segment_id)
        self.size = 0
        self.durable = 0  # bytes a successful fdatasync covered
        self.batches = 0
        self.rows = 0
        self.failed: str | None = None
        self._directory = directory
        self._fs = fs
        self._encoder = Encoder(segment_schema(schema, table))
        self._fd: int | None = None
        self._dir_synced = False
        # Guards the descriptor between a group-commit fsync (any thread) and
        # seal/abandon closing it; writes are already serialized with seal.
        self._fd_lock = threading.Lock()

    def write(self, batch: pa.RecordBatch, meta: str | None) -> int:
        """Append one batch; returns once its bytes are in the page cache.

        Raises `SpoolIOError` when the disk refuses it; nothing of it remains.
        """
        if self.failed is not None:
            raise SpoolIOError(f"appending to segment {self.path.name} ({self.failed})")
        message = self._encoder.encode(batch, meta)
        if self._fd is None:
            # Created lazily: a table that never receives a record leaves no file.
            try:
                self._fd = self._fs.open(
                    self.path,
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                    0o644,
                )
            except OSError as exc:
                raise SpoolIOError(f"creating segment {self.path.name}", exc) from exc
        # The schema message leads whenever the file holds nothing yet, also after
        # a failed first append was cut back to zero bytes.
        parts: list[bytes | memoryview] = [message]
        if self.size == 0:
            parts.insert(0, self._encoder.schema_message)
        written = self._write_all(parts, f"appending to segment {self.path.name}")
        self.batches += 1
        self.rows += batch.num_rows
        return written

    def write_many(self, items: list[tuple[pa.RecordBatch, str | None]]) -> list[int | Exception]:
        """Write a group of queued appends in one thread hop; a result per item."""
        results: list[int | Exception] = []
        for batch, meta in items:
            try:
                results.append(self.write(batch, meta))
            except Exception as exc:  # reported to that append's caller only
                results.append(exc)
        return results

    def sync(self) -> bool:
        """Make every byte written so far durable (group commit's one fsync).

        False when there was nothing to do: no file yet, or already sealed
        (sealing fsyncs everything). After a failed fdatasync the page cache may
        have dropped the data while a later fdatasync reports success, so a
        failed segment fails every later sync too: nothing more is acked from it.
        """
        with self._fd_lock:
            if self.failed is not None:
                raise SpoolIOError(f"syncing segment {self.path.name} ({self.failed})")
            if self._fd is None:
                return False
            target = self.size
            try:
                self._fs.fdatasync(self._fd)
                if not self._dir_synced:
                    # The file's directory entry must be durable too, once.
                    self._fs.fsync_directory(self._directory)
                    self._dir_synced = True
            except OSError as exc:
                self.failed = f"fdatasync failed: {exc}"
                raise SpoolIOError(f"syncing segment {self.path.name}", exc) from exc
            self.durable = max(self.durable, target)
            return True

    def seal(self) -> bool:
        """Write the seal and end-of-stream, fsync file and directory, close.

        Returns False when nothing was ever written (no file exists). Raises
        `SpoolIOError` when the disk refuses; the segment is then `failed` and
        its first `size` bytes are still a readable, verified prefix.
        """
        if self.failed is not None:
            raise SpoolIOError(f"sealing segment {self.path.name} ({self.failed})")
        if self._fd is None:
            return False
        if self.size == 0:
            # Every append failed: an empty file, nothing anybody was promised.
            self.abandon()
            with contextlib.suppress(OSError):
                self._fs.unlink(self.path)
            return False
        data_end = self.size
        seal = self._encoder.encode(empty_batch(self.schema), None, seal=SEALED_BY_WRITER)
        try:
            self._write_all([seal, EOS], f"sealing segment {self.path.name}")
            with self._fd_lock:
                self._fs.fsync(self._fd)
                self._fs.close(self._fd)
                self._fd = None
            self._fs.fsync_directory(self._directory)
        except (OSError, SpoolIOError) as exc:
            # Whatever is not durable yet must not be acked by a later sync now.
            self.failed = self.failed or f"sealing failed: {exc}"
            self.size = data_end  # the seal is not trusted; the data prefix is
            if isinstance(exc, SpoolIOError):
                raise
            raise SpoolIOError(f"sealing segment {self.path.name}", exc) from exc
        self.durable = self.size
        return True

    def keep_prefix(self, end: int) -> None:
        """Cut the file back to `end` bytes (best effort) and close it.

        For a segment that could not be sealed: its verified prefix stays
        readable without another byte appended (`Spool.read` reads only that).
        """
        with self._fd_lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    self._fs.ftruncate(self._fd, end)
                with contextlib.suppress(OSError):
                    self._fs.close(self._fd)
                self._fd = None
        self.size = end

    def abandon(self) -> None:
        """Close without sealing (after an I/O error); recovery will verify what is there."""
        with self._fd_lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    self._fs.close(self._fd)
                self._fd = None

    def _write_all(self, parts: list[bytes | memoryview], what: str) -> int:
        assert self._fd is not None
        try:
            total = self._fs.write_all(self._fd, parts)
        except OSError as exc:
            # Never leave a partial message in front of the next append (O_APPEND
            # puts the next write at the truncated end). If even the cut fails,
            # nothing more may follow the partial bytes: this segment is done.
            try:
                self._fs.ftruncate(self._fd, self.size)
            except OSError as cut:
                self.failed = f"could not cut a failed write back ({cut})"
            raise SpoolIOError(what, exc) from exc
        self.size += total
        return total
