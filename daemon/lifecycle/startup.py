"""Loading the catalog at start-up, and what a start that waits for it shows.

The daemon listens before the catalog answers: while `load_catalog_waiting` retries,
its `StartWait` is what /readyz, /v1/status, the record endpoints' 503 and the
systemd STATUS line say the daemon waits for (the catalog and its last error).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog

from icespool.config import Config
from icespool.errors import CatalogError
from icespool.iceberg import load_catalog, startup_timeout
from icespool.runtime.retry import Backoff

__all__ = ["StartWait", "load_catalog_waiting"]

_log = logging.getLogger("icespool.service")
# An unreachable catalog at start-up: retried from about a second up to 30 s apart.
_CATALOG_RETRY = Backoff(attempts=1, base=1.0, cap=30.0)


@dataclass(frozen=True, slots=True)
class StartWait:
    """The start waits for ``dependency``: ``attempts`` failed so far, the last with
    ``error``; the next try is at ``retry_at`` (monotonic), the first failed at ``since``."""

    dependency: str
    error: str
    attempts: int
    since: float
    retry_at: float

    def reason(self) -> str:
        """One line for /readyz and the record endpoints' 503."""
        waited = time.monotonic() - self.since
        return (
            f"starting: waiting for {self.dependency} (unreachable for {waited:.0f}s, "
            f"{self.attempts} attempts): {self.error}; retrying in "
            f"{max(0.0, self.retry_at - time.monotonic()):.0f}s"
        )

    def retry_after(self) -> float:
        """Seconds until the next attempt, for a Retry-After header."""
        return max(1.0, self.retry_at - time.monotonic())

    def snapshot(self) -> dict[str, Any]:
        """For /v1/status."""
        now = time.monotonic()
        return {
            "dependency": self.dependency,
            "error": self.error,
            "attempts": self.attempts,
            "waiting_seconds": round(now - self.since, 1),
            "next_attempt_seconds": round(max(0.0, self.retry_at - now), 1),
        }


async def load_catalog_waiting(
    config: Config, *, retry: bool, waiting: Callable[[StartWait | None], None]
) -> Catalog:
    """Load the catalog within start-up's timeout; with ``retry``, until it answers.

    ``waiting`` is told of every failed attempt (with ``retry``) and, with None, of the
    success. Without ``retry`` the first failure raises `CatalogError`.
    """
    catalog = config.catalog
    timeout = startup_timeout(config.timeouts)
    attempt: asyncio.Future[Catalog] | None = None
    since: float | None = None
    for failures in itertools.count(1):
        # A load stuck beyond its timeout keeps its thread: wait for it again rather
        # than starting another one next to it.
        if attempt is None:
            attempt = asyncio.ensure_future(
                asyncio.to_thread(load_catalog, catalog.name, catalog.properties(), config.timeouts)
            )
        try:
            # Not wait_for: on 3.11 it can swallow the cancel of a SIGTERM during
            # start-up (the same step as the catalog's answer) and start anyway.
            async with asyncio.timeout(timeout):
                loaded = await asyncio.shield(attempt)
            if since is not None:
                _log.info(
                    "catalog %r answered after %.0fs and %d failed attempts; starting",
                    catalog.name,
                    time.monotonic() - since,
                    failures - 1,
                )
            waiting(None)
            return loaded
        except TimeoutError:
            error = CatalogError(
                f"catalog {catalog.name!r} did not answer within {timeout:g} s "
                "(timeouts.catalog_connect + timeouts.catalog_request)"
            )
        except CatalogError as exc:
            error, attempt = exc, None
        if not retry:
            if attempt is not None:
                attempt.cancel()
            raise error
        delay = _CATALOG_RETRY.delay(failures)
        now = time.monotonic()
        since = now if since is None else since
        dependency = f"the catalog {catalog.name!r}"
        waiting(StartWait(dependency, str(error), failures, since, now + delay))
        _log.error("%s; retrying in %.0fs", error, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")
