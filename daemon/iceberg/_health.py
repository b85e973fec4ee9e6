"""Is the catalog reachable right now? A cheap read every few seconds, for /readyz.

Ingest keeps acking while the catalog is down (the spool holds the records), so this
only decides readiness and what /readyz says; commits retry on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pyiceberg.catalog import Catalog

from icespool.iceberg._timeouts import short_error, unavailable

__all__ = ["CatalogHealth"]

_log = logging.getLogger("icespool.catalog")


class CatalogHealth:
    """Lists the catalog's namespaces every ``interval`` s; ``problem`` says what failed."""

    def __init__(self, catalog: Catalog, name: str, timeout: float, interval: float = 5.0) -> None:
        self._catalog = catalog
        self._name = name
        self._timeout = timeout
        self._interval = interval
        self.problem: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="catalog-health")

    async def stop(self) -> None:
        """Idempotent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        probe: asyncio.Future[Any] | None = None
        while True:
            # Never two probes at once: one stuck in a dependency holds its thread.
            if probe is None or probe.done():
                probe = asyncio.ensure_future(asyncio.to_thread(self._catalog.list_namespaces))
                # One that outlives its timeout fails unawaited; asyncio would log that
                # as a traceback at error level ("never retrieved"). The next probe reports.
                probe.add_done_callback(_seen)
            try:
                # Not wait_for: on 3.11 it swallows a stop() that lands in the step the
                # probe answers in, and this loop then never ends (stop() waits forever).
                async with asyncio.timeout(self._timeout):
                    await asyncio.shield(probe)
                problem = None
            except TimeoutError:
                problem = f"did not answer within {self._timeout:g} s"
            except Exception as exc:
                # An answer, even a refusal (no right to list), means the catalog is up.
                problem = None if unavailable(exc) is None else short_error(exc)
            self._report(problem)
            await asyncio.sleep(self._interval)

    def _report(self, problem: str | None) -> None:
        if problem is None:
            if self.problem is not None:
                _log.info("catalog %r is reachable again", self._name)
            self.problem = None
            return
        text = f"catalog {self._name!r} unreachable ({problem}); commits wait and retry"
        if self.problem is None:
            _log.warning("%s", text)
        self.problem = text


def _seen(probe: asyncio.Future[Any]) -> None:
    if not probe.cancelled():
        probe.exception()
