"""Errors raised by the spool. Each says what the caller can do next."""

from __future__ import annotations

__all__ = [
    "SegmentCorruptError",
    "SpoolClosedError",
    "SpoolError",
    "SpoolFullError",
    "SpoolIOError",
    "SpoolLockedError",
    "UnknownSegmentError",
]


class SpoolError(Exception):
    """Root of the spool's errors."""


class SpoolLockedError(SpoolError):
    """Another live process holds the spool directory."""

    def __init__(self, directory: str, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(
            f"spool directory {directory} is locked by {holder}: only one daemon may use a "
            "spool directory; stop that process or give this one another spool.dir"
        )


class SpoolFullError(SpoolError):
    """Accepting the batch would pass ``max_bytes``. Retriable once commits free space."""

    retriable = True

    def __init__(self, used: int, wanted: int, limit: int, quarantined: int = 0) -> None:
        self.used = used
        self.wanted = wanted
        self.limit = limit
        self.quarantined = quarantined
        held = f" ({quarantined} of them in quarantine/)" if quarantined else ""
        super().__init__(
            f"spool is full: {used} bytes used{held} + {wanted} requested > max_bytes {limit}; "
            "retry after pending data has been committed"
        )


class SpoolClosedError(SpoolError):
    """The spool was closed; nothing more can be appended."""


class UnknownSegmentError(SpoolError):
    """No sealed segment has this id (already deleted, or never existed)."""


class SegmentCorruptError(SpoolError):
    """A sealed segment failed verification when read back; it was moved to quarantine/."""


class SpoolIOError(SpoolError):
    """The disk refused a write, sync, create or delete: full (ENOSPC), over quota
    (EDQUOT), an I/O error (EIO), or a write that stopped making progress.

    Retriable: nothing was acknowledged for the failed append, and the spool
    never leaves a segment that would not verify. Retry once space is freed
    (commits delete segments) or the disk is repaired.
    """

    retriable = True

    def __init__(self, what: str, cause: OSError | None = None) -> None:
        self.errno = cause.errno if cause is not None else None
        detail = f": {cause}" if cause is not None else ""
        super().__init__(f"spool disk error while {what}{detail}; retry later")
