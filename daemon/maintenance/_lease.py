"""One maintainer per table across replicas: a lease kept in the table's metadata.

The lease is the table property ``icespool.maintenance.lease`` =
``"<owner-id> <expires-epoch-ms>"`` (empty or absent: free). The owner id is the
replica's spool id, unique per replica and stable across its restarts, so a replica
that restarts within its own lease simply keeps it.

Taking or renewing it is a metadata commit carrying `AssertProperty` (the property
still has the value this attempt read). A SQL catalog validates that against the
metadata it then swaps by compare-and-swap on metadata_location, so of two replicas
that read the same expired lease exactly one commit lands; the other re-reads and
sees the winner. Every maintenance commit carries the same requirement with the
lease's current value, so a replica whose lease was taken over (it stalled past the
expiry) cannot commit anything more, and its runs stop at the lease's expiry too.

Expiry is judged on the wall clock of the replica that wants the lease: clocks must
agree within ``_CLOCK_MARGIN`` (NTP does far better), which the holder keeps free at
the end of its lease. A lease value that stays unchanged for ``unrenewed_for(ttl)``
on the observer's own monotonic clock has ended too, whatever its expiry says: a
replica whose clock ran far ahead and then died does not hold its tables until its
clock's idea of the expiry comes round.

Catalogs that send requirements to a server (REST) cannot check this one; the
scheduler then does not maintain unless ``[maintenance] lease = "none"`` says an
operator runs maintenance on one replica only (docs/maintenance.md).

Everything here blocks (catalog commits); the scheduler runs it in the table's lane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pyiceberg.table import Table

from icespool.config import LEASE_CLOCK_MARGIN
from icespool.iceberg import AssertProperty, commit_properties
from icespool.runtime.retry import Backoff

__all__ = [
    "LEASE_PROPERTY",
    "Lease",
    "LeaseHeld",
    "acquire",
    "parse_lease",
    "release",
    "unrenewed_for",
]

LEASE_PROPERTY: Final = "icespool.maintenance.lease"
# Wall clocks of replicas may differ by this much; a holder stops this long before
# its lease ends, so a successor's clock may run ahead by as much. (check-config
# refuses a lease too short to leave its holder time to work after this margin.)
_CLOCK_MARGIN: Final = LEASE_CLOCK_MARGIN
# A lease commit meets the table's ingest commits (a catalog swap race): retry a few
# times, then give up until the next run.
_LEASE_CONFLICTS: Final = Backoff(attempts=4, base=0.05, cap=0.5)


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this replica holds."""

    owner: str
    expires_ms: int

    @property
    def value(self) -> str:
        return f"{self.owner} {self.expires_ms}"

    def requirement(self) -> AssertProperty:
        """What every commit made under this lease requires: the lease is still it."""
        return AssertProperty(key=LEASE_PROPERTY, value=self.value)

    def remaining(self, now: float | None = None) -> float:
        """Seconds this replica may still act on the lease (its end less the clock margin)."""
        now = time.time() if now is None else now
        return self.expires_ms / 1000 - _CLOCK_MARGIN - now


@dataclass(frozen=True, slots=True)
class LeaseHeld:
    """Another replica holds the lease until ``expires_ms``."""

    holder: str
    expires_ms: int
    # The property's value as read (what `acquire`'s ``lapsed`` is asked about).
    value: str = field(default="", compare=False)


def parse_lease(value: str | None) -> tuple[str, int] | None:
    """``(owner, expires_ms)`` of a lease property value; None when free. A value
    that is not a lease (edited by hand) counts as free: taking it is still a
    compare-and-swap, so at most one replica does."""
    if not value:
        return None
    owner, _, expires = value.rpartition(" ")
    if not owner or not expires.isdigit():
        return None
    return owner, int(expires)


def _never(value: str) -> bool:
    return False


def acquire(
    table: Table, owner: str, ttl: float, *, lapsed: Callable[[str], bool] = _never
) -> Lease | LeaseHeld:
    """Take the lease of ``table`` for ``owner``, or renew it when less than half of
    ``ttl`` is left; or report who holds it. Raises CommitFailedException when the
    swap kept failing (the next run tries again).

    ``lapsed(value)``: whether another replica's lease ``value`` has ended whatever
    its expiry says (`unrenewed_for` tells when). Its expiry is its holder's wall
    clock: a holder whose clock ran a day ahead, then died, would hold the table for
    a day by every other clock."""

    def decide(properties: Mapping[str, str]) -> dict[str, str]:
        now_ms = int(time.time() * 1000)
        value = properties.get(LEASE_PROPERTY)
        held = parse_lease(value)
        if held is not None:
            holder, expires_ms = held
            if holder != owner and expires_ms > now_ms and not (value and lapsed(value)):
                return {}
            if holder == owner and expires_ms - now_ms - _CLOCK_MARGIN * 1000 > ttl * 500:
                return {}  # more than half of it is left (as `Lease.remaining` counts)
        return {LEASE_PROPERTY: f"{owner} {now_ms + int(ttl * 1000)}"}

    commit_properties(table, decide, guard=(LEASE_PROPERTY,), retry=_LEASE_CONFLICTS)
    held = parse_lease(table.metadata.properties.get(LEASE_PROPERTY))
    if held is None:  # pragma: no cover - decide() always leaves a lease behind
        raise AssertionError("no lease after acquiring one")
    holder, expires_ms = held
    if holder == owner:
        return Lease(owner, expires_ms)
    return LeaseHeld(holder, expires_ms, table.metadata.properties.get(LEASE_PROPERTY, ""))


def unrenewed_for(ttl: float) -> float:
    """Seconds (on the observer's monotonic clock, from when it first saw the value)
    after which another replica's lease value, unchanged, has ended whatever its
    expiry says. The holder wrote it no later than it was first seen, and stops acting
    on it ``ttl - _CLOCK_MARGIN`` seconds after writing (its remaining time is its
    expiry less its own clock, so the offset of its clock cancels out); a live holder
    renews it, changing the value, before half of ``ttl`` is left. Assumes the
    replicas' ``lease_ttl`` agree (as they do when they share a config)."""
    return ttl + _CLOCK_MARGIN


def release(table: Table, lease: Lease) -> bool:
    """Give the lease up (clean shutdown), if it is still this one. Returns whether
    anything was committed."""
    return commit_properties(
        table,
        lambda current: {LEASE_PROPERTY: ""} if current.get(LEASE_PROPERTY) == lease.value else {},
        guard=(LEASE_PROPERTY,),
        retry=_LEASE_CONFLICTS,
    )
