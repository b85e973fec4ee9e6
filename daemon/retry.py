"""The one retry helper: bounded attempts, full-jitter exponential backoff.

Every conflict retry (a data commit, a property-only commit, a schema change) and
every reconnect backoff in the daemon takes its delays from a `Backoff`, so they
all behave alike: jittered (replicas that collided do not collide again in step),
capped, and bounded in attempts where a caller must eventually give up.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pyiceberg.exceptions import CommitFailedException

__all__ = ["Backoff", "retry_conflicts"]

_T = TypeVar("_T")
_log = logging.getLogger("icespool.retry")


@dataclass(frozen=True)
class Backoff:
    """``attempts`` tries in all (the first included); before try ``n + 1`` wait
    ``delay(n)``: uniform in [ceiling / 2, ceiling], ``ceiling = min(cap, base * 2**(n-1))``.
    """

    attempts: int = 12
    base: float = 0.05
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """The pause after failed try number ``attempt`` (1-based)."""
        ceiling = min(self.cap, self.base * (2 ** max(0, attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)


#: Commits of Iceberg metadata that another writer may race (a catalog's swap).
CONFLICTS = Backoff()


def retry_conflicts(
    attempt: Callable[[], _T],
    *,
    what: str,
    backoff: Backoff = CONFLICTS,
    conflict: type[BaseException] | tuple[type[BaseException], ...] = CommitFailedException,
) -> _T:
    """Call ``attempt`` until it does not raise ``conflict`` (blocking).

    ``attempt`` must refresh what it builds on each time (a conflict means another
    writer changed the table). After ``backoff.attempts`` conflicts the last one is
    raised: callers keep what they had (the spool, the partition's position) and
    try again later.
    """
    for number in range(1, backoff.attempts + 1):
        try:
            return attempt()
        except conflict as exc:
            if number == backoff.attempts:
                raise
            _log.info("%s: conflict (attempt %d/%d): %s", what, number, backoff.attempts, exc)
            time.sleep(backoff.delay(number))
    raise AssertionError("unreachable")  # pragma: no cover
