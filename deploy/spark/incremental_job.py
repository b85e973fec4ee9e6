"""Incremental PySpark job: process only the snapshots added to a table since the last run.

    python deploy/spark/incremental_job.py --config /etc/icespool/icespool.toml \\
        --table demo.events --state /var/lib/jobs/events.state.json --output /data/events-out

Each run reads the appends between the snapshot stored in ``--state`` (exclusive) and the
table's current snapshot (inclusive) with Iceberg's incremental read
(``start-snapshot-id``/``end-snapshot-id``), writes them as Parquet under
``--output/<start>-<end>/`` (overwrite: a rerun after a crash rewrites the same range, so the
output is exactly once), and only then stores the new position. The first run processes the
whole table as of its current snapshot.

Only ``append`` snapshots are read: a compaction (``rewrite_data_files``, a ``replace``
snapshot) moves rows without adding any, so it never makes the job process rows twice.
If the stored snapshot was expired, Iceberg cannot tell what came after it and the job
fails: keep snapshot retention longer than the job's interval (see maintenance_job.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["IncrementalRun", "current_snapshot_id", "main", "run_incremental"]


@dataclass(frozen=True)
class IncrementalRun:
    """What one run did: the snapshot range (start exclusive) and the rows processed."""

    start_snapshot_id: int | None
    end_snapshot_id: int | None
    rows: int


def current_snapshot_id(spark: Any, table: str) -> int | None:
    """The table's current snapshot (None for a table without data)."""
    row = spark.sql(
        f"SELECT snapshot_id FROM {table}.history WHERE is_current_ancestor "
        "ORDER BY made_current_at DESC LIMIT 1"
    ).first()
    return None if row is None else int(row[0])


def _load_state(path: Path, table: str) -> int | None:
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if state.get("table") != table:
        raise SystemExit(f"{path} holds the position of {state.get('table')!r}, not {table!r}")
    value = state.get("snapshot_id")
    return None if value is None else int(value)


def _save_state(path: Path, table: str, snapshot_id: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"table": table, "snapshot_id": snapshot_id}) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_parquet(output: Path) -> Callable[[Any, int | None, int], int]:
    """A processor that writes each range's rows to ``output/<start>-<end>/`` (overwrite)."""

    def process(df: Any, start: int | None, end: int) -> int:
        df.write.mode("overwrite").parquet(str(output / f"{start or 0}-{end}"))
        return int(df.count())

    return process


def run_incremental(
    spark: Any,
    table: str,
    state_path: Path,
    process: Callable[[Any, int | None, int], int],
) -> IncrementalRun:
    """Process the snapshots added since the stored position, then store the new one.

    ``table`` is the full Spark name (``catalog.namespace.table``); ``process(df, start,
    end)`` handles the new rows and returns how many it handled.
    """
    start = _load_state(state_path, table)
    end = current_snapshot_id(spark, table)
    if end is None or end == start:
        return IncrementalRun(start, end, 0)
    if start is None:
        df = spark.sql(f"SELECT * FROM {table} VERSION AS OF {end}")
    else:
        df = (
            spark.read.format("iceberg")
            .option("start-snapshot-id", str(start))
            .option("end-snapshot-id", str(end))
            .load(table)
        )
    rows = process(df, start, end)
    _save_state(state_path, table, end)
    return IncrementalRun(start, end, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True, help="the daemon's icespool.toml")
    parser.add_argument("--table", required=True, help="namespace.table")
    parser.add_argument("--state", required=True, type=Path, help="position file (JSON)")
    parser.add_argument("--output", required=True, type=Path, help="Parquet output directory")
    parser.add_argument("--runtime-dir", help="local Iceberg Spark runtime (make spark-runtime)")
    args = parser.parse_args(argv)

    from icespool.config import load_config
    from icespool.spark.session import spark_session

    config = load_config(args.config)
    spark = spark_session(config, runtime_dir=args.runtime_dir, app_name="icespool-incremental")
    try:
        table = f"{config.catalog.name}.{args.table}"
        run = run_incremental(spark, table, args.state, write_parquet(args.output))
    finally:
        spark.stop()
    print(
        f"{table}: processed {run.rows} rows of snapshots "
        f"({run.start_snapshot_id}, {run.end_snapshot_id}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
