"""One process per spool directory, enforced by an advisory lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ._errors import SpoolLockedError

LOCK_FILE = "LOCK"


class DirectoryLock:
    """An exclusive ``flock`` on ``<dir>/LOCK``; the kernel drops it when the holder dies."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise SpoolLockedError(str(self._path.parent), pid) from None
        except BaseException:
            os.close(fd)
            raise
        # The pid is only a hint for the error message of the next opener: a
        # full volume must not stop a start over it.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
