"""What a flush answers: `FlushResult`, one for a flush of several commits too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["FlushResult"]


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What one flush committed. ``snapshot_id`` is None when nothing was pending."""

    table: str
    reason: str
    snapshot_id: int | None
    records: int
    files: int = 0
    bytes: int = 0
    duration_ms: float = 0.0
    segments: tuple[str, ...] = ()
    already_committed: bool = False
    quarantined: tuple[str, ...] = ()
    # Attempts of the commit the catalog refused because another writer committed first.
    conflicts: int = 0

    def followed_by(self, later: FlushResult) -> FlushResult:
        """One answer for a flush that committed a backlog in several snapshots: this
        one's, then ``later``'s."""
        quarantined = self.quarantined + later.quarantined
        if self.snapshot_id is None:
            return dataclasses.replace(later, quarantined=quarantined)
        if later.snapshot_id is None:
            return dataclasses.replace(self, quarantined=quarantined)
        return FlushResult(
            table=later.table,
            reason=later.reason,
            snapshot_id=later.snapshot_id,  # the newest; the others precede it
            records=self.records + later.records,
            files=self.files + later.files,
            bytes=self.bytes + later.bytes,
            duration_ms=later.duration_ms,
            segments=self.segments + later.segments,
            already_committed=self.already_committed and later.already_committed,
            quarantined=quarantined,
            conflicts=self.conflicts + later.conflicts,
        )
