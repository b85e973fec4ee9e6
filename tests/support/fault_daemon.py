"""``icespool run`` with the spool's file-system seam set by the test: a child process
that crashes (SIGKILL) or fails at a chosen file-system call.

Usage: python fault_daemon.py [--crash OP:PATTERN:N ...] [--control FILE] --config PATH

``--control FILE``: while FILE holds the name of a fault (``erofs``, ``eio``,
``enospc``), every file-system call that fault applies to fails with it; empty or
missing, the disk works. The test changes the disk's state by rewriting the file.

Under libfaketime (a test stepping the daemon's wall clock, its monotonic clock left
true with ``FAKETIME_DONT_FAKE_MONOTONIC=1``), libfaketime 0.9.10 fails every
``clock_nanosleep`` to an absolute CLOCK_MONOTONIC deadline with EINVAL, which is how
``time.sleep`` waits: it is replaced by a wait on a relative timeout, the same pause.

The daemon itself reads no environment variable or flag for faults: this launcher
owns the seam (`Icespool(fs=...)` through `run_daemon`), exactly as in-process tests
pass a `FaultyFileSystem`.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from icespool.app import run_daemon
from icespool.config import load_config
from icespool.logs import configure_logging
from support.faulty_fs import FAULTS, Fault, FaultyFileSystem

# How long a read of the control file is trusted: a fault starts or ends within it.
_CONTROL_EVERY = 0.05


def _controlled(path: Path) -> Callable[[str], Fault | None]:
    """A chooser failing every call with the fault ``path`` names."""
    state: list[object] = [0.0, None]

    def choose(op: str) -> Fault | None:
        if time.monotonic() - cast(float, state[0]) > _CONTROL_EVERY:
            try:
                text = path.read_text().strip()
            except OSError:
                text = ""
            state[:] = [time.monotonic(), text if text in FAULTS else None]
        return cast("Fault | None", state[1])

    return choose


def _relative_sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


def main() -> int:
    if "faketime" in os.environ.get("LD_PRELOAD", ""):
        time.sleep = _relative_sleep
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--crash", action="append", default=[], metavar="OP:PATTERN:N")
    parser.add_argument("--control", type=Path)
    args = parser.parse_args()
    fs = FaultyFileSystem()
    if args.control is not None:
        fs.chooser = _controlled(args.control)
    for point in args.crash:
        op, pattern, nth = point.split(":")
        fs.crash_at(op, pattern, int(nth))
    config = load_config(args.config)
    configure_logging(config.log.level, config.log.format)
    return run_daemon(config, reload_config=lambda: load_config(args.config), fs=fs)


if __name__ == "__main__":
    sys.exit(main())
