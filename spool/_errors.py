"""Errors raised by the spool. Each says what the caller can do next."""

from __future__ import annotations

__all__ = [
    "SegmentCorruptError",
    "SpoolClosedError",
    "SpoolError",
    "SpoolFullError",
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

    def __init__(self, used: int, wanted: int, limit: int) -> None:
        self.used = used
        self.wanted = wanted
        self.limit = limit
        super().__init__(
            f"spool is full: {used} bytes used + {wanted} requested > max_bytes {limit}; "
            "retry after pending data has been committed"
        )


class SpoolClosedError(SpoolError):
    """The spool was closed; nothing more can be appended."""


class UnknownSegmentError(SpoolError):
    """No sealed segment has this id (already deleted, or never existed)."""


class SegmentCorruptError(SpoolError):
    """A sealed segment failed verification when read back; it was moved to quarantine/."""
