"""Spark read speed over a table icespool wrote vs the same rows written by Spark itself.

    python tests/bench/bench_spark_read.py [--rows 4000000] [--batches-per-flush 50]

1. The in-process `Icespool` service appends 10,000-row Arrow batches of the 8-column
   benchmark event (tests/bench/_events.py) to ``bench.events`` and flushes every
   ``--batches-per-flush`` batches (500,000 rows: the default max_batch_records), so the
   table looks like a daemon-fed one.
2. Spark copies it (CTAS) into ``bench.events_spark``: the same rows, Spark's own file
   layout and statistics, in the same catalog.
3. Interleaved, best of 5: a full scan (every column, into Spark's noop sink) and two
   filtered scans (an ``event_id`` range, a ``ts`` window) over both tables.

Prints per-query seconds, files read, and icespool's speed relative to Spark's own table
(Spark time / icespool time; target >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _events import COLUMNS, JSON_SCHEMA, decode_body, ndjson_body
from _spark import BENCH_CONF

from icespool.config import validate_config
from icespool.lifecycle.service import Icespool
from icespool.spark.conf import RUNTIME_DIR_ENV
from icespool.spark.session import spark_session

REPO = Path(__file__).resolve().parents[2]
BATCH_ROWS = 10_000
CATALOG = "bench"


async def fill(config: Any, rows: int, batches_per_flush: int) -> tuple[int, int, float]:
    """Append ``rows`` events; returns (rows, commits, seconds)."""
    template = decode_body(ndjson_body(BATCH_ROWS, 0))
    template_us = template.column("ts").cast(pa.int64())
    commits = 0
    began = time.perf_counter()
    async with Icespool(config) as service:
        writer = service.writer("bench.events")
        for n in range(rows // BATCH_ROWS):
            base = n * BATCH_ROWS
            ids = pa.array(range(base, base + BATCH_ROWS), pa.int64())
            # Shift the timestamps too, so the ts filter selects a contiguous slice.
            ts = pc.add(template_us, base // 1000 * 1_000_000).cast(pa.timestamp("us", "UTC"))
            batch = template.set_column(0, "event_id", ids).set_column(1, "ts", ts)
            await writer.append(batch.cast(JSON_SCHEMA))
            if (n + 1) % batches_per_flush == 0:
                await writer.flush()
                commits += 1
        if (await writer.flush()).snapshot_id is not None:
            commits += 1
    return rows, commits, time.perf_counter() - began


def timed(spark: Any, sql: str) -> float:
    began = time.perf_counter()
    spark.sql(sql).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def files_read(spark: Any, sql: str) -> int:
    # Run the physical plan itself: its scan node then holds the Iceberg scan metrics.
    plan = spark.sql(sql)._jdf.queryExecution().executedPlan()
    plan.execute().count()
    leaves = plan.collectLeaves()
    for i in range(leaves.size()):
        node = leaves.apply(i)
        if node.nodeName().startswith("BatchScan"):
            return int(node.metrics().get("resultDataFiles").get().value())
    return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batches-per-flush", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")

    with tempfile.TemporaryDirectory(prefix="icespool-bench-spark-") as tmp:
        raw = {
            "catalog": {
                "name": CATALOG,
                "type": "sql",
                "uri": f"sqlite:///{tmp}/catalog.db",
                "warehouse": Path(tmp, "warehouse").as_uri(),
            },
            "spool": {"dir": f"{tmp}/spool"},
            "encode": {"workers": 2},
            "tables": [{"name": "bench.events", "create": True, "schema": COLUMNS}],
        }
        config = validate_config(raw)
        rows, commits, seconds = asyncio.run(fill(config, args.rows, args.batches_per_flush))
        print(f"icespool wrote {rows:,} rows in {commits} commits ({rows / seconds:,.0f} rows/s)")

        spark = spark_session(
            config,
            runtime_dir=runtime,
            app_name="icespool-bench",
            master="local[2]",
            conf={
                **BENCH_CONF,
                "spark.sql.adaptive.enabled": "false",
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            ice, own = f"{CATALOG}.bench.events", f"{CATALOG}.bench.events_spark"
            began = time.perf_counter()
            spark.sql(f"CREATE TABLE {own} USING iceberg AS SELECT * FROM {ice}")
            print(f"Spark copied it into {own} in {time.perf_counter() - began:.1f}s")
            for name in (ice, own):
                files = spark.sql(
                    f"SELECT count(*), sum(file_size_in_bytes), sum(record_count) FROM {name}.files"
                ).first()
                print(f"  {name}: {files[0]} files, {files[1] / 2**20:.1f} MiB, {files[2]:,} rows")
            lo, hi = rows // 2, rows // 2 + rows // 100
            ts_lo = 1_714_566_896 + rows // 4 // 1000
            queries = {
                "full scan (all columns)": "SELECT * FROM {t}",
                "filter event_id range (1%)": (
                    f"SELECT * FROM {{t}} WHERE event_id BETWEEN {lo} AND {hi}"
                ),
                "filter ts window (1%)": (
                    f"SELECT * FROM {{t}} WHERE ts >= timestamp_seconds({ts_lo}) "
                    f"AND ts < timestamp_seconds({ts_lo + rows // 100 // 1000})"
                ),
                "aggregate kind, sum(value)": (
                    "SELECT kind, sum(value), count(*) FROM {t} GROUP BY kind"
                ),
            }
            for sql in queries.values():  # warm-up: JIT, metadata caches, page cache
                timed(spark, sql.format(t=ice))
                timed(spark, sql.format(t=own))
            print(
                "\n| query | icespool s | Spark-written s | files read (ice / spark) | "
                "ratio (Spark s / icespool s) |\n| --- | ---: | ---: | ---: | ---: |"
            )
            for label, sql in queries.items():
                best_ice = best_own = float("inf")
                for _ in range(args.rounds):
                    best_ice = min(best_ice, timed(spark, sql.format(t=ice)))
                    best_own = min(best_own, timed(spark, sql.format(t=own)))
                files = (files_read(spark, sql.format(t=ice)), files_read(spark, sql.format(t=own)))
                print(
                    f"| {label} | {best_ice:.3f} | {best_own:.3f} | {files[0]} / {files[1]} | "
                    f"{best_own / best_ice:.2f} |"
                )
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
