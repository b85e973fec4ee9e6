"""The spool's quarantine as /v1/status and /metrics read it, with a directory the daemon
cannot read reported instead of raised.

Listing ``quarantine/`` is the one file-system call those two make. A spool directory
made unreadable under a running daemon (permissions, a volume gone bad) must not turn
them into a 500 with a traceback: the failure is kept as a `problem` naming the path
and the errno, exported as ``icespool_spool_unreadable{path, error}`` and logged once
per change, and the last good listing stands meanwhile.
"""

from __future__ import annotations

import errno
import logging

from icespool.metrics import Metrics
from icespool.spool import QuarantinedSegment, Spool

__all__ = ["SpoolWatch", "describe_os_error"]

_log = logging.getLogger("icespool.spool")


def describe_os_error(exc: OSError, what: str) -> str:
    """``cannot <what> <path>: <strerror> (<ERRNO>)``, without a traceback."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    path = f" {exc.filename}" if exc.filename else ""
    return f"cannot {what}{path}: {exc.strerror or exc} ({name})"


class SpoolWatch:
    def __init__(self, spool: Spool, metrics: Metrics) -> None:
        self._spool = spool
        self._metrics = metrics
        self._last: list[QuarantinedSegment] = []
        #: Why the spool cannot be read right now (None: it can).
        self.problem: str | None = None

    def quarantined(self) -> list[QuarantinedSegment]:
        """The quarantined segments (blocking: lists a small directory); re-counts what
        quarantine holds. When the listing fails, the last good one."""
        try:
            found = self._spool.quarantined()
        except OSError as exc:
            self._failed(exc)
            return self._last
        if self.problem is not None:
            _log.warning("the spool can be read again (it was: %s)", self.problem)
            self.problem = None
            self._metrics.spool_unreadable.clear()
        self._last = found
        return found

    def _failed(self, exc: OSError) -> None:
        problem = describe_os_error(exc, "read the spool directory")
        if problem == self.problem:
            return  # said already: not a line per scrape
        self.problem = problem
        _log.error(
            "%s; /v1/status and /metrics show the last readable state of the spool",
            problem,
            extra={"error": problem},
        )
        unreadable = self._metrics.spool_unreadable
        unreadable.clear()
        path = str(exc.filename or self._spool.directory)
        unreadable.labels(path=path, error=errno.errorcode.get(exc.errno or 0, "unknown")).set(1)
