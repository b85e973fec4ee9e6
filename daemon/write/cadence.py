"""How long past ``batch_timeout`` a table waits while its commits collide with other
writers' (replicas of this daemon committing to the same table).

Each replica commits on its own timer, so N replicas at ``batch_timeout`` make N commits
per interval, and a commit whose swap another one beat is retried from a fresh read:
the more replicas, the more of their commit time goes into retries, the slower each
commit, the wider the window for the next collision. A replica that meets conflicts
spaces its commits: each commit that met one adds a quarter of ``batch_timeout`` to the
table's wait, each that met none takes a sixteenth away, never more than one
``batch_timeout`` in all. In the steady state about one commit in five meets a
conflict; with no other writer (or once they are gone) the wait is ``batch_timeout``
again within 16 clean commits. Size triggers are not stretched.
"""

from __future__ import annotations

__all__ = ["Cadence"]

_GROW = 1 / 4
_SHRINK = 1 / 16


class Cadence:
    """A table's contention stretch (seconds past ``batch_timeout``)."""

    def __init__(self) -> None:
        self.stretch = 0.0

    def committed(self, conflicts: int, batch_timeout: float) -> None:
        """After one of the table's flushes landed, having met ``conflicts``."""
        if conflicts:
            self.stretch = min(batch_timeout, self.stretch + batch_timeout * _GROW)
        else:
            self.stretch = max(0.0, self.stretch - batch_timeout * _SHRINK)

    def timeout(self, batch_timeout: float) -> float:
        """How old the oldest waiting record gets before the table commits."""
        return batch_timeout + min(self.stretch, batch_timeout)
