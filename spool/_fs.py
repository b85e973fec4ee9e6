"""The spool's one door to the file system: every call that can fail with a full or broken disk.

The spool never calls ``os`` for writes, syncs, renames, truncations, opens or
unlinks directly; it calls a `FileSystem`. The default is the real system calls
(bound once as static methods, so the indirection costs one attribute lookup).
Tests pass a subclass that makes the disk misbehave: ENOSPC, EIO, short writes,
and later crash points. Production code never chooses faults.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REAL", "FileSystem"]

Buffer = bytes | memoryview
PathLike = str | os.PathLike[str]


class FileSystem:
    """The real file system; subclass and override a method to inject a fault.

    Methods mirror their ``os`` namesakes exactly, including short writes:
    callers loop on `writev`/`write` and treat a zero-byte write as a failure.
    """

    open = staticmethod(os.open)
    close = staticmethod(os.close)
    write = staticmethod(os.write)
    writev = staticmethod(os.writev)
    fsync = staticmethod(os.fsync)
    fdatasync = staticmethod(os.fdatasync)
    ftruncate = staticmethod(os.ftruncate)
    replace = staticmethod(os.replace)
    unlink = staticmethod(os.unlink)

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def fsync_directory(self, path: PathLike) -> None:
        """Make creations, renames and deletions in a directory durable."""
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_all(self, fd: int, parts: Sequence[Buffer]) -> int:
        """Write every byte of `parts` (looping on short writes); returns the total.

        A write that makes no progress raises ``OSError`` rather than spinning.
        """
        total = sum(len(p) for p in parts)
        done = 0
        while done < total:
            n = self.writev(fd, _skip(parts, done))
            if n <= 0:
                raise OSError(f"short write: {done} of {total} bytes, then no progress")
            done += n
        return total

    def write_file(self, path: PathLike, data: bytes) -> None:
        """Create or replace a small file's contents and fsync it (not its directory)."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self.write_all(fd, [data])
            self.fsync(fd)
        finally:
            self.close(fd)


REAL = FileSystem()


def _skip(parts: Sequence[Buffer], done: int) -> list[Buffer]:
    out: list[Buffer] = []
    for part in parts:
        if done >= len(part):
            done -= len(part)
            continue
        out.append(memoryview(part)[done:] if done else part)
        done = 0
    return out
