"""Prometheus metrics the daemon exports (prefix ``icespool_``, units in the names).

One registry per daemon instance, so several in-process daemons (tests) never
share counters. Dashboards and alert rules in ``deploy/`` may use only these names.
"""

from __future__ import annotations

import platform
from importlib import metadata

import pyarrow
import pyiceberg
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# `*_created` series double every counter's cardinality and nothing here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FILE_SIZE_BUCKETS = tuple(float(2**n) for n in range(16, 33, 2))  # 64 KiB .. 4 GiB
# HTTP acks: the goal is a 20 ms p99, so the buckets are dense around it (1 ms .. 10 s).
_ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class Metrics:
    """Every metric of one daemon, registered in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # process_* (RSS, CPU seconds, open fds, start time) and python_info: this
        # registry is the daemon's own, so the default registry's copies never reach it.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.build_info = Gauge(
            "icespool_build_info",
            "Always 1; the labels name the running versions",
            ["version", "python", "pyarrow", "pyiceberg"],
            registry=r,
        )
        self.build_info.labels(
            version=_version("icespool"),
            python=platform.python_version(),
            pyarrow=pyarrow.__version__,
            pyiceberg=pyiceberg.__version__,
        ).set(1)
        self.records_acked = Counter(
            "icespool_records_acked_total",
            "Records acknowledged (in the spool)",
            ["table"],
            registry=r,
        )
        self.records_committed = Counter(
            "icespool_records_committed_total",
            "Records committed to Iceberg",
            ["table"],
            registry=r,
        )
        self.commits = Counter(
            "icespool_commits_total",
            "Iceberg snapshots committed",
            ["table", "reason"],
            registry=r,
        )
        self.commit_failures = Counter(
            "icespool_commit_failures_total",
            "Commit attempts that failed (the spool keeps the records)",
            ["table"],
            registry=r,
        )
        self.flush_errors = Counter(
            "icespool_flush_errors_total",
            "Failed flushes by cause: catalog or object_store (unreachable, timed out, "
            "5xx), or other; the spool keeps the records and the flush is retried",
            ["table", "cause"],
            registry=r,
        )
        self.commit_conflicts = Counter(
            "icespool_commit_conflicts_total",
            "Commit attempts the catalog refused because another writer (a replica, "
            "maintenance) committed to the table first; the commit is retried on the "
            "refreshed table",
            ["table"],
            registry=r,
        )
        self.commit_unknown_outcomes = Counter(
            "icespool_commit_unknown_outcomes_total",
            "Commit requests whose answer was lost (5xx, reset, timeout); each was resolved "
            "by reading the table back, never by committing blindly",
            ["table"],
            registry=r,
        )
        self.upsert_commits = Counter(
            "icespool_upsert_commits_total",
            "Commits of upsert tables by how they delete the older rows of the keys they "
            "change: by position (the key index located the rows; readers apply them per "
            "file) or by equality (the index could not answer yet; maintenance converts them)",
            ["table", "deletes"],
            registry=r,
        )
        self.key_index_ready = Gauge(
            "icespool_key_index_ready",
            "1 when an upsert table's key index answers for the table, 0 while it is "
            "being built or cannot read the table (commits then write equality deletes)",
            ["table"],
            registry=r,
        )
        self.commit_duration = Histogram(
            "icespool_commit_duration_seconds",
            "Time from flush start to committed snapshot (read, encode, commit)",
            ["table"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.encode_duration = Histogram(
            "icespool_encode_duration_seconds",
            "Parquet encode and upload time per flush",
            ["table"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.data_file_size = Histogram(
            "icespool_data_file_size_bytes",
            "Size of each data file written",
            ["table"],
            buckets=_FILE_SIZE_BUCKETS,
            registry=r,
        )
        self.last_commit = Gauge(
            "icespool_last_commit_timestamp_seconds",
            "Unix time of the table's last commit",
            ["table"],
            registry=r,
        )
        self.last_commit_age = Gauge(
            "icespool_table_last_commit_age_seconds",
            "Seconds since this process last committed the table (set at every scrape; "
            "absent until its first commit)",
            ["table"],
            registry=r,
        )
        self.queue_records = Gauge(
            "icespool_queue_records",
            "Records acknowledged and not yet committed",
            ["table"],
            registry=r,
        )
        self.queue_bytes = Gauge(
            "icespool_queue_bytes",
            "Spool bytes of the table not yet committed",
            ["table"],
            registry=r,
        )
        self.oldest_pending_age = Gauge(
            "icespool_oldest_pending_age_seconds",
            "Age of the oldest uncommitted record of the table",
            ["table"],
            registry=r,
        )
        self.batch_timeout_stretch = Gauge(
            "icespool_batch_timeout_stretch_seconds",
            "How much longer than batch_timeout the table's age trigger waits because its "
            "commits met other writers' (replicas on one table; 0: none)",
            ["table"],
            registry=r,
        )
        self.spool_bytes = Gauge("icespool_spool_bytes", "Bytes in the spool", registry=r)
        self.spool_max_bytes = Gauge(
            "icespool_spool_max_bytes", "Configured spool.max_bytes", registry=r
        )
        self.spool_segments = Gauge(
            "icespool_spool_segments", "Segment files in the spool", registry=r
        )
        self.spool_quarantine_bytes = Gauge(
            "icespool_spool_quarantine_bytes",
            "Bytes of quarantined segment files (they count against spool.max_bytes)",
            registry=r,
        )
        self.spool_unreadable = Gauge(
            "icespool_spool_unreadable",
            "1 while a spool directory cannot be read (path, errno name); /v1/status "
            "spool.problem and the log give the error text",
            ["path", "error"],
            registry=r,
        )
        self.quarantined_segments = Counter(
            "icespool_quarantined_segments_total",
            "Spool segments moved to quarantine/: failed verification, or rows the table "
            "cannot take (those also in icespool_uncommittable_segments_total)",
            registry=r,
        )
        self.uncommittable_segments = Counter(
            "icespool_uncommittable_segments_total",
            "Spool segments quarantined because the table cannot take their rows "
            "(reason: schema, encode, rejected, metadata)",
            ["table", "reason"],
            registry=r,
        )
        self.table_degraded = Gauge(
            "icespool_table_degraded",
            "1 while a table cannot commit (its last flush failed, or it cannot be loaded)",
            ["table"],
            registry=r,
        )
        self.truncated_segments = Counter(
            "icespool_truncated_segments_total",
            "Spool segments whose torn tail was cut at recovery",
            registry=r,
        )
        self.backpressure = Counter(
            "icespool_backpressure_total",
            "Ingest requests refused because a queue or the spool was full",
            ["table", "reason"],
            registry=r,
        )
        self.pressure_flushes = Counter(
            "icespool_pressure_flushes_total",
            "Tables flushed early because the spool refused an append for lack of room "
            "(reason: disk_bytes, disk_inodes, max_bytes)",
            ["reason"],
            registry=r,
        )
        for reason in ("disk_bytes", "disk_inodes", "max_bytes"):
            self.pressure_flushes.labels(reason=reason)  # at zero from the start
        self.dead_letters = Counter(
            "icespool_dead_letters_total",
            "Records sent to a dead-letter destination",
            ["table", "reason"],
            registry=r,
        )
        self.records_rejected = Counter(
            "icespool_records_rejected_total",
            "Records of HTTP ingest requests answered 400 (Kafka's bad records are "
            "icespool_dead_letters_total instead)",
            ["table", "reason"],
            registry=r,
        )
        self.kafka_lag = Gauge(
            "icespool_kafka_lag_records",
            "Consumer lag per partition (high watermark - committed offset)",
            ["topic", "partition"],
            registry=r,
        )
        self.kafka_records = Counter(
            "icespool_kafka_records_consumed_total",
            "Kafka records fetched, before de-duplication and routing",
            ["topic"],
            registry=r,
        )
        self.kafka_partition_changes = Counter(
            "icespool_kafka_partition_changes_total",
            "Partitions found changed under the tables' offsets at assignment: "
            "recreated (a topic deleted and re-created, or a log truncated: read from its "
            "start), retention (records deleted before they were read: skipped to the "
            "first kept offset)",
            ["topic", "kind"],
            registry=r,
        )
        self.spool_claim_changes = Counter(
            "icespool_spool_claim_changes_total",
            "The spool's claim in the catalog (a copy of its directory elsewhere): adopted "
            "(a lapsed claim of another process taken over at start), lost (another process "
            "took it over: this one commits and acks nothing more)",
            ["kind"],
            registry=r,
        )
        self.kafka_duplicates = Counter(
            "icespool_kafka_duplicates_dropped_total",
            "Kafka records dropped because the table already holds their offset",
            ["table"],
            registry=r,
        )
        self.kafka_paused = Gauge(
            "icespool_kafka_paused_partitions",
            "Assigned partitions paused by backpressure",
            registry=r,
        )
        self.kafka_connected = Gauge(
            "icespool_kafka_connected",
            "1 while the Kafka source is connected to its brokers, else 0 (no series "
            "without a Kafka source)",
            ["source"],
            registry=r,
        )
        self.http_requests = Counter(
            "icespool_http_requests_total",
            "HTTP requests by route and status code",
            ["route", "code"],
            registry=r,
        )
        self.http_ack_duration = Histogram(
            "icespool_http_ack_duration_seconds",
            "Time from an ingest request's start to its 200 ack (every record spooled)",
            ["table"],
            buckets=_ACK_BUCKETS,
            registry=r,
        )
        self.http_connections_closed = Counter(
            "icespool_http_connections_closed_total",
            "HTTP connections the daemon closed on its own: per_ip_limit (503: its IP's "
            "queue was full, or it waited header_timeout for a place), per_ip_shed (closed "
            "without a request to admit a waiting one from the same IP), header_timeout "
            "(408), idle_timeout (kept alive with no request)",
            ["reason"],
            registry=r,
        )
        self.http_connections_parked = Gauge(
            "icespool_http_connections_parked",
            "HTTP connections accepted but not read yet: their client IP is at "
            "http.max_connections_per_ip with every connection in use",
            registry=r,
        )
        self.ready = Gauge(
            "icespool_ready", "1 when recovery is done and the catalog reachable", registry=r
        )
        # The table's shape: set after each of this process's commits (snapshots, data
        # files) and maintenance runs (all four), never computed at scrape.
        self.table_snapshots = Gauge(
            "icespool_table_snapshots",
            "Snapshots in the table's metadata (after this process's last commit or "
            "maintenance run)",
            ["table"],
            registry=r,
        )
        self.table_manifests = Gauge(
            "icespool_table_manifests",
            "Manifests of the table's current snapshot (at the last maintenance run)",
            ["table"],
            registry=r,
        )
        self.table_data_files = Gauge(
            "icespool_table_data_files",
            "Data files of the table's current snapshot",
            ["table"],
            registry=r,
        )
        self.table_metadata_bytes = Gauge(
            "icespool_table_metadata_bytes",
            "Size of the table's current metadata.json (at the last maintenance run)",
            ["table"],
            registry=r,
        )
        self.maintenance_runs = Counter(
            "icespool_maintenance_runs_total",
            "Maintenance tasks run per table: task expire/defaults/compact/orphans (outcome "
            "ok, failed, or conflict: another writer changed the inputs first and nothing "
            "was committed), or lease (outcome skipped: another replica maintains the table)",
            ["table", "task", "outcome"],
            registry=r,
        )
        self.maintenance_duration = Histogram(
            "icespool_maintenance_duration_seconds",
            "Time one maintenance task took, per task",
            ["task"],
            buckets=(*_DURATION_BUCKETS, 300, 600),
            registry=r,
        )
        self.maintenance_delete_errors = Counter(
            "icespool_maintenance_delete_errors_total",
            "Files maintenance failed to delete (kept and retried by the next run)",
            ["table"],
            registry=r,
        )
        self.maintenance_files_kept = Gauge(
            "icespool_maintenance_files_kept",
            "Data files of this spool the last orphan sweep kept because no snapshot names "
            "their segment any more: the table lost commits that held acked rows (a "
            "catalog restored from a backup, or failed over to a lagging replica)",
            ["table"],
            registry=r,
        )
        self.maintenance_files_removed = Counter(
            "icespool_maintenance_files_removed_total",
            "Files maintenance deleted, by kind (data_file, manifest, manifest_list, ...)",
            ["table", "kind"],
            registry=r,
        )

    def table(self, name: str) -> None:
        """Create the per-table series at zero so dashboards show them before traffic."""
        for metric in (
            self.records_acked,
            self.records_committed,
            self.commit_failures,
            self.commit_conflicts,
        ):
            metric.labels(table=name)
        for gauge in (
            self.queue_records,
            self.queue_bytes,
            self.oldest_pending_age,
            self.table_degraded,
            self.batch_timeout_stretch,
        ):
            gauge.labels(table=name).set(0)

    def set_table_shape(
        self,
        table: str,
        *,
        snapshots: int | None = None,
        manifests: int | None = None,
        data_files: int | None = None,
        metadata_bytes: int | None = None,
    ) -> None:
        """Record what is known of a table's shape (None: not measured this time)."""
        for gauge, value in (
            (self.table_snapshots, snapshots),
            (self.table_manifests, manifests),
            (self.table_data_files, data_files),
            (self.table_metadata_bytes, metadata_bytes),
        ):
            if value is not None:
                gauge.labels(table=table).set(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
