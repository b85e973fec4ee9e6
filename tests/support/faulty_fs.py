"""A file system for tests that makes the disk misbehave, through the spool's seam.

Every call is the real one unless a fault is queued for that operation
(`inject`) or the `chooser` picks one. Faults:

- ``enospc`` / ``eio``: the call fails with that errno, nothing done;
- ``short``: a write stores only part of its bytes and says so (POSIX allows it);
- ``torn``: a write stores part of its bytes, then fails with ENOSPC (the
  harshest case for rollback);
- ``erofs``: the volume is read-only: every call that would change it fails with
  EROFS (an open for reading still succeeds).

Crash points (`crash_at`): the process kills itself with SIGKILL at the n-th call
of an operation on a path matching a pattern, before the call does anything: the
state kill -9 leaves at exactly that instant (e.g. the first segment unlink after a
commit is "committed to Iceberg, still in the spool").

It also remembers how many bytes of each file a successful fsync/fdatasync
covered, so `power_loss` can cut every segment back to what was durable. A
failed sync behaves like Linux after writeback EIO: the dirty pages are
dropped from the sync's view, so nothing written to that file before the
failure becomes durable, even if a later fsync of it reports success.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from icespool.spool import FileSystem, Spool

Fault = Literal["enospc", "eio", "short", "torn", "erofs"]
FAULTS: tuple[Fault, ...] = ("enospc", "eio", "short", "torn", "erofs")
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
OPS = ("open", "write", "fsync", "fdatasync", "ftruncate", "replace", "unlink")


class FaultyFileSystem(FileSystem):
    def __init__(self) -> None:
        self.queued: dict[str, list[Fault]] = {}
        self.chooser: Callable[[str], Fault | None] | None = None
        self.injected: list[tuple[str, Fault]] = []
        self.durable: dict[str, int] = {}  # path -> bytes a successful sync covered
        self.lost_after: dict[str, int] = {}  # path -> durable bytes when a sync failed
        self._paths: dict[int, str] = {}
        self._crashes: list[tuple[str, str, list[int]]] = []  # op, pattern, [calls left]

    def crash_at(self, op: str, pattern: str = "*", nth: int = 1) -> None:
        """SIGKILL this process at the ``nth`` ``op`` call on a path matching ``pattern``."""
        assert op in OPS and nth >= 1, (op, nth)
        self._crashes.append((op, pattern, [nth]))

    def _crash_if(self, op: str, path: str | os.PathLike[str] | int) -> None:
        name = os.path.basename(self._paths.get(path, "") if isinstance(path, int) else path)
        for crash_op, pattern, left in self._crashes:
            if crash_op == op and fnmatch.fnmatch(name, pattern):
                left[0] -= 1
                if left[0] == 0:
                    os.kill(os.getpid(), signal.SIGKILL)

    def inject(self, op: str, *faults: Fault) -> None:
        assert op in OPS, op
        self.queued.setdefault(op, []).extend(faults)

    def quiet(self) -> None:
        """No more faults (the disk was repaired)."""
        self.queued.clear()
        self.chooser = None

    def power_loss(self, directory: Path) -> None:
        """Cut every segment file to the bytes a sync made durable (what a crash keeps)."""
        for path in directory.glob("*.arrow"):
            keep = self.durable.get(str(path), 0)
            if path.stat().st_size > keep:
                os.truncate(path, keep)
            self.lost_after.pop(str(path), None)  # what is on disk now is all there is
            self.durable[str(path)] = min(keep, path.stat().st_size)

    # ------------------------------------------------------------------ the seam

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        self._crash_if("open", path)
        fault = self._next("open")
        if fault is not None and (fault != "erofs" or flags & _WRITING):
            raise _error(fault)
        fd = os.open(path, flags, mode)
        self._paths[fd] = str(path)
        return fd

    def close(self, fd: int) -> None:  # type: ignore[override]
        self._paths.pop(fd, None)
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:  # type: ignore[override]
        return self.writev(fd, [data])

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:  # type: ignore[override]
        fault = self._next("write")
        if fault is None:
            return os.writev(fd, buffers)
        data = b"".join(bytes(b) for b in buffers)
        if fault in ("short", "torn") and len(data) > 1:
            n = os.write(fd, data[: len(data) // 2])
            if fault == "short":
                return n
        raise _error(fault)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        self._crash_if("fsync", fd)
        self._sync_fails_if("fsync", fd)
        os.fsync(fd)
        self._synced(fd)

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self._crash_if("fdatasync", fd)
        self._sync_fails_if("fdatasync", fd)
        os.fdatasync(fd)
        self._synced(fd)

    def ftruncate(self, fd: int, length: int) -> None:  # type: ignore[override]
        self._fail_if("ftruncate")
        os.ftruncate(fd, length)
        path = self._paths.get(fd)
        if path is not None:
            for marks in (self.durable, self.lost_after):
                if marks.get(path, 0) > length:
                    marks[path] = length

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:  # type: ignore[override]
        self._crash_if("replace", dst)
        self._fail_if("replace")
        os.replace(src, dst)
        for marks in (self.durable, self.lost_after):
            if str(src) in marks:
                marks[str(dst)] = marks.pop(str(src))

    def unlink(self, path: str | os.PathLike[str]) -> None:  # type: ignore[override]
        self._crash_if("unlink", path)
        self._fail_if("unlink")
        os.unlink(path)
        self.durable.pop(str(path), None)
        self.lost_after.pop(str(path), None)

    # ------------------------------------------------------------------ internals

    def _next(self, op: str) -> Fault | None:
        queue = self.queued.get(op)
        fault = queue.pop(0) if queue else (self.chooser(op) if self.chooser else None)
        if fault is not None:
            self.injected.append((op, fault))
        return fault

    def _fail_if(self, op: str) -> None:
        fault = self._next(op)
        if fault is not None:
            raise _error("eio" if fault in ("short", "torn") and op.endswith("sync") else fault)

    def _sync_fails_if(self, op: str, fd: int) -> None:
        try:
            self._fail_if(op)
        except OSError:
            path = self._paths.get(fd)
            if path is not None and path not in self.lost_after:
                self.lost_after[path] = self.durable.get(path, 0)
            raise

    def _synced(self, fd: int) -> None:
        path = self._paths.get(fd)
        if path is not None and not os.path.isdir(path):
            size = os.fstat(fd).st_size
            self.durable[path] = min(size, self.lost_after.get(path, size))


def _error(fault: Fault) -> OSError:
    code = {"eio": errno.EIO, "erofs": errno.EROFS}.get(fault, errno.ENOSPC)
    return OSError(code, os.strerror(code))


async def crash(spool: Spool) -> None:
    """What kill -9 leaves of a spool: files as they are, nothing sealed, lock released.

    Reaches into the spool because no public call should ever do this.
    """
    for task in [t for lane in spool._lanes.values() for t in lane.sealing] + list(spool._acking):
        with contextlib.suppress(Exception):
            await task
    for lane in spool._lanes.values():
        if lane.open is not None:
            lane.open.abandon()
    assert spool._executor is not None
    spool._executor.shutdown(wait=True)
    spool._lock.release()
    spool._state = "closed"
