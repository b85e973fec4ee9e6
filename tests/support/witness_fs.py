"""A spool file system that notes which thread made each call, and at what nice value:
how the tests see where the spool's work runs (through its file-system seam)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from icespool.spool import FileSystem

__all__ = ["WitnessFileSystem"]


class WitnessFileSystem(FileSystem):
    """The real syscalls; ``seen[call]`` = {(thread name without its number, nice)}."""

    def __init__(self) -> None:
        self.seen: dict[str, set[tuple[str, int]]] = {}

    def _saw(self, call: str) -> None:
        tid = threading.get_native_id()
        name = threading.current_thread().name.split("_")[0]
        self.seen.setdefault(call, set()).add((name, os.getpriority(os.PRIO_PROCESS, tid)))

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:  # type: ignore[override]
        self._saw("writev")
        return os.writev(fd, buffers)

    def read_bytes(self, path: Path) -> bytes:
        self._saw("read_bytes")
        return super().read_bytes(path)

    def unlink(self, path: str | os.PathLike[str]) -> None:  # type: ignore[override]
        self._saw("unlink")
        os.unlink(path)

    def threads(self, call: str) -> set[str]:
        return {name for name, _ in self.seen[call]}
