"""Per-table work over many tables: bounded, and saying how far it got.

The daemon does some things once per table: load it at start-up, commit its
leftovers, retry loading it while it is degraded, commit it on shutdown. One table
after the other, that is tables x one catalog round trip (1,000 tables: minutes);
started all at once, thousands of calls queue up in front of the catalog and the
thread pool. `fan_out` runs them with a bound: ``limit`` worker tasks each take the
next item when they finish one, so what is in flight stays O(limit). `Tally` counts
how far it got, in a log line every few seconds while the work lasts.

A failure stays with its item (``Exception`` comes back in the results, in input
order); cancelling the caller cancels every item still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

__all__ = ["CATALOG_CONCURRENCY", "Tally", "fan_out"]

_T = TypeVar("_T")
_R = TypeVar("_R")

_log = logging.getLogger("icespool.service")
#: Seconds between progress lines while the work runs (none for shorter work).
PROGRESS_EVERY = 5.0
#: Catalog calls for different tables at once (loads, creations, property reads):
#: enough to hide round trips, few enough not to queue thousands of calls in front
#: of the catalog and the thread pool.
CATALOG_CONCURRENCY = 8


class Tally:
    """How many of ``total`` items of ``what`` are done (and how many failed)."""

    def __init__(self, what: str, total: int) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.failed = 0
        self.started = time.monotonic()
        self.detail: Callable[[], str] | None = None  # e.g. the records still pending

    def line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        detail = f", {self.detail()}" if self.detail is not None else ""
        return (
            f"{self.what}: {self.done} of {self.total} tables done{failed}{detail} "
            f"({time.monotonic() - self.started:.0f}s)"
        )

    def log(self) -> None:
        _log.info(
            "%s",
            self.line(),
            extra={"done": self.done, "total": self.total, "failed": self.failed},
        )

    @contextlib.asynccontextmanager
    async def reporting(self, every: float = PROGRESS_EVERY) -> AsyncIterator[Tally]:
        """Log `line` every ``every`` s while the block runs, and once at its end if
        it ran that long (short work stays quiet)."""

        async def report() -> None:
            while True:
                await asyncio.sleep(every)
                self.log()

        reporter = asyncio.create_task(report(), name=f"progress: {self.what}")
        try:
            yield self
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
            if time.monotonic() - self.started >= every:
                self.log()


async def fan_out(
    what: str,
    items: Sequence[_T],
    run: Callable[[_T], Awaitable[_R]],
    *,
    limit: int,
    every: float = PROGRESS_EVERY,
) -> list[_R | Exception]:
    """``run(item)`` for every item, at most ``limit`` at once; results in input order
    (an item's ``Exception`` in its place). ``what`` names the work in the progress
    lines, e.g. "loading tables"."""
    if limit < 1:
        raise ValueError(f"fan_out needs limit >= 1, got {limit}")
    if not items:
        return []
    results: list[Any] = [None] * len(items)
    indexes = iter(range(len(items)))  # shared: each index is taken by one worker
    progress = Tally(what, len(items))

    async def worker() -> None:
        for index in indexes:
            try:
                results[index] = await run(items[index])
            except Exception as exc:
                results[index] = exc
                progress.failed += 1
            progress.done += 1

    async with progress.reporting(every), asyncio.TaskGroup() as group:
        for i in range(min(limit, len(items))):
            group.create_task(worker(), name=f"{what} #{i}")
    return results
