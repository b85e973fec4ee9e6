"""The figures /v1/status, /metrics, the CLI and the systemd STATUS line read.

`StatusReport` reads the writers, the spool and the lanes; the service adds what
only it knows (readiness, draining, the start's wait) in `Icespool.status`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icespool.config import Config
from icespool.lifecycle.spool_watch import SpoolWatch
from icespool.maintenance import MaintenanceScheduler
from icespool.metrics import Metrics
from icespool.runtime.lanes import LanePool
from icespool.spool import Spool
from icespool.write.writer import TableWriter

if TYPE_CHECKING:
    from icespool.kafka import KafkaSource

__all__ = ["StatusReport", "Totals"]

# /v1/status lists at most this many quarantined segments (and counts all of them).
_STATUS_QUARANTINE_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Totals:
    """Figures over every table, from one pass over the writers (no metric collection)."""

    tables: int
    acked: int  # records acknowledged by this process
    committed: int  # records committed by this process
    pending: int  # records acknowledged and not committed yet (recovered ones included)
    spool_bytes: int


class StatusReport:
    """The per-table, spool, quarantine and Kafka parts of the status, and the gauges
    refreshed on every /metrics scrape."""

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics,
        spool: Spool,
        watch: SpoolWatch,
        pool: LanePool,
        maintenance: MaintenanceScheduler,
        writers: Mapping[str, TableWriter],
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._spool = spool
        self._watch = watch
        self._pool = pool
        self._maintenance = maintenance
        self._writers = writers

    def spool_parts(self) -> dict[str, Any]:
        """The ``quarantine``, ``spool`` and ``tables`` entries of /v1/status."""
        # Re-counts files an operator removed by hand; never raises for the directory.
        quarantine = self._watch.quarantined()
        stats = self._spool.stats()
        lanes = self._pool.stats()
        tables: dict[str, Any] = {}
        now = time.monotonic()
        for name, writer in self._writers.items():
            last = writer.last_commit
            at, since = writer.last_commit_wall, writer.last_commit_at
            tables[name] = {
                "pending_records": writer.pending_records,
                "pending_bytes": writer.pending_bytes,
                "oldest_pending_age_seconds": round(writer.oldest_pending_age(), 3),
                "spool_segments": stats.tables[name].segments if name in stats.tables else 0,
                "encode_queue": lanes[name]["pending"] if name in lanes else 0,
                "last_commit": None
                if last is None
                else {
                    "snapshot_id": last.snapshot_id,
                    "reason": last.reason,
                    "records": last.records,
                    "files": last.files,
                    "duration_ms": last.duration_ms,
                    "at": None if at is None else round(at, 3),
                    "age_seconds": None if since is None else round(max(0.0, now - since), 1),
                },
                "maintenance": self._maintenance.status(name),
                "key_index": writer.key_index,
            }
        return {
            "quarantine": {
                "segments": len(quarantine),
                "bytes": sum(q.bytes for q in quarantine),
                "listed": [
                    {
                        "id": q.id,
                        "table": q.table,
                        "bytes": q.bytes,
                        "reason": q.reason,
                        "at": round(q.at, 3),
                    }
                    for q in quarantine[:_STATUS_QUARANTINE_LIMIT]
                ],
            },
            "spool": {
                "dir": str(self._config.spool.dir),
                "bytes": stats.bytes,
                "max_bytes": self._config.spool.max_bytes,
                "segments": stats.segments,
                "durability": self._config.spool.durability,
                # Quarantined files count against max_bytes (docs/guarantees.md).
                "quarantine_bytes": stats.quarantine_bytes,
                "quarantined_segments": stats.quarantined,
                # Why the spool directory cannot be read (null: it can); the figures
                # above are then the last ones read.
                "problem": self._watch.problem,
            },
            "tables": tables,
        }

    def totals(self) -> Totals:
        """Acked, committed and pending records over every table, and the spool's
        bytes: one pass over the writers (the systemd STATUS line asks at every tick;
        reading each table's series back from the metric registry collected the whole
        registry once per table, O(tables^2))."""
        acked = committed = pending = 0
        for writer in self._writers.values():
            acked += writer.acked_records
            committed += writer.committed_records
            pending += writer.pending_records
        return Totals(len(self._writers), acked, committed, pending, self._spool.used_bytes)

    def refresh_gauges(self, *, ready: bool) -> None:
        """Bring the readiness, spool and last-commit-age gauges up to date."""
        self._metrics.ready.set(1 if ready else 0)
        self._watch.quarantined()  # re-counts files an operator removed by hand
        stats = self._spool.stats()
        self._metrics.spool_bytes.set(stats.bytes)
        self._metrics.spool_quarantine_bytes.set(stats.quarantine_bytes)
        self._metrics.spool_segments.set(stats.segments)
        now = time.monotonic()
        for name, writer in self._writers.items():  # O(tables), one label lookup each
            if writer.last_commit_at is not None:
                age = self._metrics.last_commit_age.labels(table=name)
                age.set(now - writer.last_commit_at)


def kafka_status(sources: Sequence[KafkaSource]) -> dict[str, Any]:
    """The ``kafka`` entry of /v1/status: each source, its assignments and their lag."""
    reports = [s.status() for s in sources]
    assignments = [a for s in reports for a in s["assignments"]]
    return {
        "sources": reports,
        "assignments": [{"topic": a["topic"], "partition": a["partition"]} for a in assignments],
        "lag": {f"{a['topic']}[{a['partition']}]": a["lag"] for a in assignments},
    }
