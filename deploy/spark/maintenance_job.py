"""Table maintenance for tables fed by icespool: compaction, snapshot expiry, orphan removal.

    python deploy/spark/maintenance_job.py --config /etc/icespool/icespool.toml \\
        --table demo.events [--table demo.other ...]

Safe while the daemon keeps committing (Iceberg validates the compaction against
concurrent appends; the daemon retries its own commits on conflict). The defaults suit
icespool tables:

- ``rewrite_data_files`` (binpack to 512 MiB files, only where >= 5 files can be merged):
  icespool commits one snapshot per flush, so a table gathers many mid-sized files.
- ``rewrite_manifests``: every flush adds a manifest; fewer manifests plan faster.
- ``expire_snapshots`` older than 7 days, always keeping the last 100: the daemon's
  exactly-once bookkeeping reads the ``icespool.segments`` snapshot summaries (see
  daemon/committer.py). A segment still in a spool after its snapshot expired (a crash
  between commit and spool delete, then a downtime longer than the retention) would be
  committed twice. Keep the retention longer than any daemon outage you would recover
  from, and longer than the interval of incremental jobs (they need their start snapshot).
- ``remove_orphan_files`` older than 3 days: the daemon writes data files before the
  commit that references them; an in-flight flush must never look like an orphan.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["MaintenancePolicy", "MaintenanceResult", "main", "maintain"]


@dataclass(frozen=True)
class MaintenancePolicy:
    target_file_size_bytes: int = 512 * 2**20
    min_input_files: int = 5
    expire_older_than: dt.timedelta = dt.timedelta(days=7)
    retain_last: int = 100
    orphan_older_than: dt.timedelta = dt.timedelta(days=3)


@dataclass(frozen=True)
class MaintenanceResult:
    rewritten_data_files: int
    added_data_files: int
    rewritten_manifests: int
    expired_data_files: int
    expired_manifest_lists: int
    orphan_files: tuple[str, ...]


def _timestamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("TIMESTAMP '%Y-%m-%d %H:%M:%S.%f UTC'")


def maintain(
    spark: Any,
    catalog: str,
    table: str,
    policy: MaintenancePolicy | None = None,
    *,
    now: dt.datetime | None = None,
) -> MaintenanceResult:
    """Run the four procedures on ``catalog``.``table`` (``namespace.table``)."""
    policy = policy or MaintenancePolicy()
    now = now or dt.datetime.now(dt.UTC)
    rewrite = spark.sql(
        f"CALL {catalog}.system.rewrite_data_files(table => '{table}', options => map("
        f"'min-input-files', '{policy.min_input_files}', "
        f"'target-file-size-bytes', '{policy.target_file_size_bytes}', "
        "'partial-progress.enabled', 'true'))"
    ).first()
    manifests = spark.sql(f"CALL {catalog}.system.rewrite_manifests(table => '{table}')").first()
    expire = spark.sql(
        f"CALL {catalog}.system.expire_snapshots(table => '{table}', "
        f"older_than => {_timestamp(now - policy.expire_older_than)}, "
        f"retain_last => {policy.retain_last})"
    ).first()
    orphans = spark.sql(
        f"CALL {catalog}.system.remove_orphan_files(table => '{table}', "
        f"older_than => {_timestamp(now - policy.orphan_older_than)})"
    ).collect()
    return MaintenanceResult(
        rewritten_data_files=int(rewrite.rewritten_data_files_count),
        added_data_files=int(rewrite.added_data_files_count),
        rewritten_manifests=int(manifests.rewritten_manifests_count),
        expired_data_files=int(expire.deleted_data_files_count),
        expired_manifest_lists=int(expire.deleted_manifest_lists_count),
        orphan_files=tuple(sorted(row.orphan_file_location for row in orphans)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True, help="the daemon's icespool.toml")
    parser.add_argument("--table", required=True, action="append", help="namespace.table")
    parser.add_argument("--runtime-dir", help="local Iceberg Spark runtime (make spark-runtime)")
    parser.add_argument("--expire-days", type=float, default=7.0)
    parser.add_argument("--orphan-days", type=float, default=3.0)
    args = parser.parse_args(argv)

    from icespool.config import load_config
    from icespool.spark.session import spark_session

    config = load_config(args.config)
    policy = MaintenancePolicy(
        expire_older_than=dt.timedelta(days=args.expire_days),
        orphan_older_than=dt.timedelta(days=args.orphan_days),
    )
    spark = spark_session(config, runtime_dir=args.runtime_dir, app_name="icespool-maintenance")
    try:
        for table in args.table:
            result = maintain(spark, config.catalog.name, table, policy)
            print(f"{table}: {result}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
