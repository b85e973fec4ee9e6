"""One segment file being written: append, fsync, seal. Blocking; runs in spool threads."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pyarrow as pa

from ._format import EOS, Encoder, empty_batch, segment_schema
from ._names import fsync_directory, segment_file_name


class OpenSegment:
    """The writable tail segment of one table.

    The spool serializes `write` and `seal` per table; `sync` may run in another
    thread concurrently with a `write` (fdatasync covers whatever reached the
    page cache before it started, which is what group commit relies on).
    """

    def __init__(self, directory: Path, table: str, schema: pa.Schema, segment_id: str) -> None:
        self.id = segment_id
        self.table = table
        self.schema = schema
        self.path = directory / segment_file_name(table, segment_id)
        self.size = 0
        self.batches = 0
        self.rows = 0
        self._directory = directory
        self._encoder = Encoder(segment_schema(schema, table))
        self._fd: int | None = None
        self._dir_synced = False
        # Guards the descriptor between a group-commit fsync (any thread) and
        # seal/abandon closing it; writes are already serialized with seal.
        self._fd_lock = threading.Lock()

    def write(self, batch: pa.RecordBatch, meta: str | None) -> int:
        """Append one batch; returns once its bytes are in the page cache."""
        message = self._encoder.encode(batch, meta)
        if self._fd is None:
            # Created lazily: a table that never receives a record leaves no file.
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644
            )
            parts: list[bytes | memoryview] = [self._encoder.schema_message, message]
        else:
            parts = [message]
        written = self._write_all(parts)
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
        (sealing fsyncs everything).
        """
        with self._fd_lock:
            if self._fd is None:
                return False
            os.fdatasync(self._fd)
            if not self._dir_synced:
                # The file's directory entry must be durable too, once.
                fsync_directory(self._directory)
                self._dir_synced = True
            return True

    def seal(self) -> bool:
        """Write the seal and end-of-stream, fsync file and directory, close.

        Returns False when nothing was ever written (no file exists).
        """
        if self._fd is None:
            return False
        seal = self._encoder.encode(empty_batch(self.schema), None, seal=True)
        self._write_all([seal, EOS])
        with self._fd_lock:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        fsync_directory(self._directory)
        return True

    def abandon(self) -> None:
        """Close without sealing (after an I/O error); recovery will verify what is there."""
        with self._fd_lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def _write_all(self, parts: list[bytes | memoryview]) -> int:
        assert self._fd is not None
        total = sum(len(p) for p in parts)
        done = 0
        try:
            while done < total:
                # One writev per append keeps a message whole unless the kernel
                # itself splits it (kill -9 mid-copy); recovery cuts such a tail.
                done += os.writev(self._fd, _skip(parts, done))
        except OSError:
            # Never leave a partial message in front of the next append (O_APPEND
            # puts the next write at the truncated end).
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size)
            raise
        self.size += total
        return total


def _skip(parts: list[bytes | memoryview], done: int) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    for part in parts:
        if done >= len(part):
            done -= len(part)
            continue
        out.append(memoryview(part)[done:] if done else part)
        done = 0
    return out
