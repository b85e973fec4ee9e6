"""The I/O budget every maintenance step's reads and writes pass."""

from __future__ import annotations

import threading
import time

from icespool.maintenance._compact_plan import CompactionError

__all__ = ["IoBudget"]


class IoBudget:
    """Bytes per second (reads plus writes) shared by everything maintenance does.

    A token bucket that may go into debt: ``acquire(n)`` takes ``n`` bytes and sleeps
    until the bucket is back out of debt, so a request bigger than the bucket still
    passes and the long-run rate never exceeds ``bytes_per_second`` (plus one
    ``burst_seconds`` of credit at the start). Thread-safe: concurrent callers queue
    behind each other's debt. ``None`` means unlimited (still counts bytes).
    ``close()`` (at shutdown) wakes every waiter: waiting and later calls raise
    ``CompactionError``, so a rewrite in a thread stops (and cleans up) at once
    instead of holding the process's exit for the rest of its budget.
    """

    def __init__(self, bytes_per_second: float | None, *, burst_seconds: float = 1.0) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive, got {bytes_per_second}")
        if burst_seconds <= 0:
            raise ValueError(f"burst_seconds must be positive, got {burst_seconds}")
        self._rate = bytes_per_second
        self._capacity = (bytes_per_second or 0) * burst_seconds
        self._tokens = self._capacity
        self._stamp = time.monotonic()
        self._used = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def bytes_per_second(self) -> float | None:
        return self._rate

    @property
    def used(self) -> int:
        """Bytes acquired so far (for metrics and tests)."""
        return self._used

    def close(self) -> None:
        """Refuse every request from now on and wake the waiting ones (shutdown)."""
        self._closed.set()

    def acquire(self, nbytes: int, *, deadline: float | None = None) -> float:
        """Take ``nbytes``; return the seconds slept. With ``deadline`` (a
        ``time.monotonic()`` value) a wait that would end past it takes nothing and
        raises TimeoutError instead."""
        if self._closed.is_set():
            raise CompactionError("the I/O budget is closed (maintenance is stopping)")
        if nbytes <= 0:
            return 0.0
        with self._lock:
            if self._rate is None:
                self._used += nbytes
                return 0.0
            now = time.monotonic()
            self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            wait = max(0.0, (nbytes - self._tokens) / self._rate)
            if deadline is not None and now + wait > deadline:
                raise TimeoutError(
                    f"the I/O budget ({self._rate:.0f} bytes/s) cannot pass {nbytes} bytes "
                    "before the run's deadline"
                )
            self._tokens -= nbytes
            self._used += nbytes
        if wait and self._closed.wait(wait):
            raise CompactionError("the I/O budget was closed (maintenance is stopping)")
        return wait
