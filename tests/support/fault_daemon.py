"""``icespool run`` with the spool's file-system seam set by the test: a child process
that crashes (SIGKILL) or fails at a chosen file-system call.

Usage: python fault_daemon.py --crash OP:PATTERN:N [--crash ...] --config PATH

The daemon itself reads no environment variable or flag for faults: this launcher
owns the seam (`Icespool(fs=...)` through `run_daemon`), exactly as in-process tests
pass a `FaultyFileSystem`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from icespool.config import load_config
from icespool.lifecycle.app import run_daemon
from icespool.logs import configure_logging
from support.faulty_fs import FaultyFileSystem


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--crash", action="append", default=[], metavar="OP:PATTERN:N")
    args = parser.parse_args()
    fs = FaultyFileSystem()
    for point in args.crash:
        op, pattern, nth = point.split(":")
        fs.crash_at(op, pattern, int(nth))
    config = load_config(args.config)
    configure_logging(config.log.level, config.log.format)
    return run_daemon(config, reload_config=lambda: load_config(args.config), fs=fs)


if __name__ == "__main__":
    sys.exit(main())
