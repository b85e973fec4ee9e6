"""One live process per spool identity: a claim in the catalog, renewed while it runs.

A spool directory's identity (its ``spool-id``) travels with every copy of it: ``cp -a``,
a restored volume snapshot, a cloned VM. The directory lock does not. So the process
that runs a spool claims its identity in the catalog: the namespace property
``icespool.spool.<spool-id>.holder`` = ``"<incarnation record> <beat>"`` (see
``spool/_incarnation.py``), renewed every ``ttl / 3`` with the next ``beat``.
Namespace properties are cheap to set (no table metadata is rewritten) and every
catalog type has them.

At start, a claim held by another incarnation is taken over only when its holder has
provably ended (it ran on this kernel and pid namespace and its pid is gone), or once
it has lapsed: unchanged for ``ttl`` by this process's monotonic clock, so no two
machines' wall clocks are ever compared. A claim that changes while it is watched
belongs to a live process: this one refuses to start, naming it. A holder renews within
``ttl / 3``, so a live one always changes its claim within the watch.

While running, a process commits only while its claim is fresh: renewed by itself less
than ``ttl - ttl / 3`` ago (``commit_refusal``). A process paused past that (SIGSTOP, a
suspended VM) stops committing until a renewal succeeds; a renewal that finds another
incarnation's claim means another process took the spool over, and this one never
commits again (its spool keeps every record for an operator to decide).

A Hive namespace's properties are one map that every write replaces (the metastore's
alter_database): processes writing their claims at once can drop each other's. A claim
that reads back as nobody's, or as the very value it replaced, is written again; one
dropped later is back at the holder's next renewal.

The claim lives in the namespace of the first ``[[tables]]`` entry. A daemon without
declared tables has no claim (logged); copies of its spool are then not recognised,
but still lose nothing (segments commit by record count, orphans by incarnation).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Final

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError

from icespool.errors import IcespoolError
from icespool.runtime.retry import Backoff
from icespool.spool import Incarnation

__all__ = ["SpoolClaim", "SpoolContestedError", "holder_key"]

_log = logging.getLogger("icespool.claim")

_POLL: Final = 1.0  # how often a watched claim is read again
_CATALOG_RETRY: Final = Backoff(attempts=6, base=0.5, cap=5.0)
_LOST_WRITES: Final = 5  # writes of a claim that reads back as nobody's


class SpoolContestedError(IcespoolError):
    """Another live process holds this spool's identity (a copy of its directory)."""


def holder_key(spool_id: str) -> str:
    return f"icespool.spool.{spool_id}.holder"


def _holder(value: str | None) -> tuple[Incarnation, str] | None:
    """(incarnation, beat) of a claim value, or None for a free or unreadable one."""
    if not value:
        return None
    record, _, beat = value.rpartition(" ")
    found = Incarnation.parse(record)
    return None if found is None else (found, beat)


class SpoolClaim:
    """This process's claim on ``spool_id`` in ``catalog`` (see the module doc)."""

    def __init__(
        self,
        catalog: Catalog,
        namespace: tuple[str, ...],
        spool_id: str,
        me: Incarnation,
        *,
        ttl: float,
        request_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        """``on_lost(reason)``: told once when another process takes the claim over."""
        self._catalog = catalog
        self._namespace = namespace
        self.namespace = ".".join(namespace)
        self._key = holder_key(spool_id)
        self._spool_id = spool_id
        self._me = me
        self.ttl = ttl
        self._renew = ttl / 3
        self._timeout = request_timeout
        self._clock = clock
        self._beat = 0
        self._renewed_at: float | None = None
        self.lost: str | None = None  # why this process must never commit again
        self._on_lost = on_lost
        # The incarnation whose lapsed claim this process took over (None: it was free,
        # this process's own, or its holder had provably ended).
        self.adopted: Incarnation | None = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ catalog calls

    async def _call(
        self, fn: Callable[[], object], attempts: int = _CATALOG_RETRY.attempts
    ) -> object:
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(self._timeout):
                    return await asyncio.to_thread(fn)
            except NoSuchNamespaceError:
                raise
            except Exception as exc:
                if attempt == attempts:
                    raise
                _log.warning(
                    "spool claim in namespace %s: %s: %s (retrying)",
                    self.namespace,
                    type(exc).__name__,
                    exc,
                )
                await asyncio.sleep(_CATALOG_RETRY.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read(self, attempts: int = _CATALOG_RETRY.attempts) -> str | None:
        properties = await self._call(
            lambda: self._catalog.load_namespace_properties(self._namespace), attempts
        )
        assert isinstance(properties, dict)
        value = properties.get(self._key)
        return value if isinstance(value, str) else None

    async def _write(self) -> None:
        self._beat += 1
        value = f"{self._me.record} {self._beat}"
        started = self._clock()
        await self._call(
            lambda: self._catalog.update_namespace_properties(
                self._namespace, updates={self._key: value}
            )
        )
        self._renewed_at = started

    # ------------------------------------------------------------------ lifecycle

    async def acquire(self) -> None:
        """Take the claim, waiting out another incarnation's until it lapses; raises
        `SpoolContestedError` when a live process holds it."""
        value = await self._read()
        holder = _holder(value)
        if holder is not None and holder[0].tag != self._me.tag:
            other = holder[0]
            if other.gone(self._me):
                _log.info(
                    "spool %s: taking its claim over from %s, which has ended",
                    self._spool_id,
                    other.describe(),
                )
            elif not other.same_kernel(self._me):
                await self._wait_lapse(other, value)
            else:
                raise self._contested(other, "it is running on this machine")
        for _ in range(_LOST_WRITES):
            await self._write()
            # Two processes that took a free claim at once: the later write wins, the
            # other sees it on reading back.
            now = await self._read()
            back = _holder(now)
            if back is not None and now != value:
                break
            # Nobody's, or exactly the value this process replaced (an ended or lapsed
            # holder's, beat and all): another process's write of the namespace's
            # properties replaced the whole map (the Hive Metastore's alter_database
            # does) with one it had read before ours. A live holder's has a new beat.
            await asyncio.sleep(random.uniform(0.05, 0.25))
        if back is None or back[0].tag != self._me.tag:
            other_text = back[0].describe() if back else "nobody"
            raise SpoolContestedError(
                f"spool {self._spool_id}: its claim in namespace {self.namespace} was taken "
                f"by {other_text} while this process took it; a copy of this data directory "
                "runs elsewhere: stop one of them"
            )
        self._task = asyncio.create_task(self._renewing(), name="spool-claim")

    async def _wait_lapse(self, other: Incarnation, value: str | None) -> None:
        _log.warning(
            "spool %s is claimed by %s, which may still run on another machine (a copy "
            "of this data directory, or this spool's previous container); waiting %.0fs "
            "for its claim to lapse before committing anything",
            self._spool_id,
            other.describe(),
            self.ttl,
        )
        deadline = self._clock() + self.ttl
        while self._clock() < deadline:
            await asyncio.sleep(_POLL)
            now = await self._read()
            if now != value:
                holder = _holder(now)
                if holder is None:
                    return  # released: free to take
                raise self._contested(holder[0], "it renewed its claim just now")
        _log.warning(
            "spool %s: the claim of %s lapsed (unchanged for %.0fs); adopting the spool",
            self._spool_id,
            other.describe(),
            self.ttl,
        )
        self.adopted = other

    def _contested(self, other: Incarnation, why: str) -> SpoolContestedError:
        return SpoolContestedError(
            f"spool {self._spool_id} (this data directory) is held by {other.describe()}: "
            f"{why}. A copy of this data directory (a restored volume, cp -a, a cloned VM) "
            "must not run beside its original: stop one of them. A copy whose original is "
            f"gone for good is adopted once the original's claim lapses ({self.ttl:.0f}s "
            f"unchanged, namespace property {self._key} in {self.namespace})"
        )

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self._renew)
            try:
                holder = _holder(await self._read())
                if holder is not None and holder[0].tag != self._me.tag:
                    self.lost = (
                        f"spool {self._spool_id}: {holder[0].describe()} took its claim over "
                        "(this process was paused or cut off past the claim's lapse); this "
                        "process commits nothing more and takes no more records, its spool "
                        "keeps every record it acked: stop it, and restart it once the other "
                        "one is stopped"
                    )
                    _log.error("%s", self.lost)
                    if self._on_lost is not None:
                        self._on_lost(self.lost)
                    return
                await self._write()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning(
                    "spool %s: renewing its claim failed: %s: %s",
                    self._spool_id,
                    type(exc).__name__,
                    exc,
                )

    def commit_refusal(self) -> str | None:
        """Why this process must not commit now (None: it may)."""
        if self.lost is not None:
            return self.lost
        if self._renewed_at is None:
            return f"spool {self._spool_id}: its claim is not taken yet"
        age = self._clock() - self._renewed_at
        if age > self.ttl - self._renew:
            return (
                f"spool {self._spool_id}: its claim was last renewed {age:.0f}s ago (the "
                f"catalog did not answer, or this process was paused); commits wait for the "
                "next renewal"
            )
        return None

    async def release(self) -> None:
        """Give the claim up (clean shutdown), if it is still this process's."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.lost is not None or self._renewed_at is None:
            return
        try:
            holder = _holder(await self._read(attempts=1))
            if holder is not None and holder[0].tag == self._me.tag:
                # One try: a shutdown does not wait for a catalog that is down.
                await self._call(
                    lambda: self._catalog.update_namespace_properties(
                        self._namespace, removals={self._key}
                    ),
                    attempts=1,
                )
        except Exception as exc:
            _log.warning(
                "spool %s: releasing its claim failed (a successor waits for it to lapse): %s: %s",
                self._spool_id,
                type(exc).__name__,
                exc,
            )
