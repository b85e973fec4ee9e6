"""Spark's GROUP BY on a table after 10,000 small daemon commits with maintenance running,
vs the same rows written by Spark in one job (issue #13: target >= 0.95).

    python tests/bench/bench_spark_maintained.py [--commits 10000] [--rows 100]
        [--interval 10s] [--rounds 5]

1. The in-process `Icespool` service appends ``--rows``-row Arrow batches of the 8-column
   benchmark event (tests/bench/_events.py) to ``bench.events`` and flushes after each:
   ``--commits`` commits, as fast as they go (a daemon committing every second for
   ``--commits`` seconds, compressed). Maintenance runs meanwhile at its defaults (6 h /
   10 snapshots / cap 2000, compaction of the daemon's small files), every
   ``--interval`` instead of 5 minutes, since the loop compresses hours into minutes.
   Every 1,000 commits: commits/s, and the table's snapshots, manifests, data files and
   metadata.json size (the retention figures of README "Table maintenance").
2. Spark copies the table as it is at the end into ``bench.events_spark`` in one job
   (CTAS, coalesced to a file per core: a plain CTAS would inherit the source's split
   into hundreds of small files): the same rows in Spark's own layout.
3. Interleaved, best of ``--rounds``: ``SELECT kind, sum(value), count(*) GROUP BY kind``
   (bench_spark_read.py's aggregate) on both, with the files each read: on the table as
   the loop left it (up to one ``--interval`` of commits not compacted yet, the worst a
   reader sees), and again after one more maintenance run.

Prints the ratio Spark-written seconds / icespool seconds for both states.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _events import COLUMNS, JSON_SCHEMA, decode_body, ndjson_body
from _spark import BENCH_CONF
from bench_spark_read import files_read, timed

from icespool.config import validate_config
from icespool.lifecycle.service import Icespool
from icespool.maintenance import table_shape
from icespool.spark.conf import RUNTIME_DIR_ENV
from icespool.spark.session import spark_session

REPO = Path(__file__).resolve().parents[2]
CATALOG = "bench"
TABLE = "bench.events"
AGGREGATE = "SELECT kind, sum(value), count(*) FROM {t} GROUP BY kind"


async def fill(config: Any, commits: int, rows: int) -> None:
    """``commits`` flushes of ``rows`` events each, maintenance running; prints the shape."""
    began = last = time.perf_counter()
    async with Icespool(config) as service:
        writer = service.writer(TABLE)
        catalog = service._catalog
        assert catalog is not None
        print(
            "| commits | commits/s (last 1,000) | snapshots | manifests | data files | "
            "metadata.json KiB | compactions |\n" + "| ---: " * 7 + "|",
            flush=True,
        )
        for n in range(commits):
            await writer.append(decode_body(ndjson_body(rows, n)).cast(JSON_SCHEMA))
            result = await writer.flush()
            assert result.records == rows, result
            if (n + 1) % 1000 == 0:
                now = time.perf_counter()
                table = await asyncio.to_thread(catalog.load_table, TABLE)
                shape = await asyncio.to_thread(table_shape, table)
                runs = service.metrics.registry.get_sample_value(
                    "icespool_maintenance_runs_total",
                    {"table": TABLE, "task": "compact", "outcome": "ok"},
                )
                print(
                    f"| {n + 1:,} | {1000 / (now - last):.1f} | {shape['snapshots']} | "
                    f"{shape['manifests']} | {shape['data_files']} | "
                    f"{shape['metadata_bytes'] / 1024:.0f} | {runs or 0:.0f} |",
                    flush=True,
                )
                last = now
    print(f"{commits:,} commits in {time.perf_counter() - began:.0f} s")


async def one_more_run(config: Any) -> str:
    """Start the service again and let maintenance run once (the state a reader sees
    right after a run, vs the loop's end: up to one interval of unmaintained commits)."""
    quick = config.model_copy(
        update={"maintenance": config.maintenance.model_copy(update={"interval": 1.0})}
    )
    async with Icespool(quick) as service:
        deadline = time.monotonic() + 600
        while True:
            status = service.maintenance.status(TABLE)
            if status and status["last_run"] and not status["running"]:
                return str(status["last_run"]["details"])
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.2)


def describe(spark: Any, name: str) -> str:
    files = spark.sql(
        f"SELECT count(*), sum(file_size_in_bytes), sum(record_count) FROM {name}.files"
    ).first()
    manifests = spark.sql(f"SELECT count(*) FROM {name}.manifests").first()[0]
    snapshots = spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0]
    return (
        f"{files[0]} data files, {files[1] / 2**20:.1f} MiB, {files[2]:,} rows, "
        f"{manifests} manifests, {snapshots} snapshots"
    )


def compare(spark: Any, ice: str, own: str, rounds: int) -> tuple[float, float, int, int]:
    """Best seconds of the aggregate on each table (interleaved), and files each read."""
    for _ in range(2):  # warm-up: JIT, metadata caches, page cache
        timed(spark, AGGREGATE.format(t=ice))
        timed(spark, AGGREGATE.format(t=own))
    best_ice = best_own = float("inf")
    for _ in range(rounds):
        best_ice = min(best_ice, timed(spark, AGGREGATE.format(t=ice)))
        best_own = min(best_own, timed(spark, AGGREGATE.format(t=own)))
    return (
        best_ice,
        best_own,
        files_read(spark, AGGREGATE.format(t=ice)),
        files_read(spark, AGGREGATE.format(t=own)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--interval", default="10s")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="then let Spark expire, rewrite manifests, rewrite files: the gap's causes",
    )
    args = parser.parse_args()
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")

    with tempfile.TemporaryDirectory(prefix="icespool-bench-maint-spark-", dir=args.dir) as tmp:
        config = validate_config(
            {
                "catalog": {
                    "name": CATALOG,
                    "type": "sql",
                    "uri": f"sqlite:///{tmp}/catalog.db",
                    "warehouse": Path(tmp, "warehouse").as_uri(),
                },
                "spool": {"dir": f"{tmp}/spool"},
                "encode": {"workers": 2},
                "maintenance": {"interval": args.interval},
                "tables": [{"name": TABLE, "create": True, "schema": COLUMNS}],
            }
        )
        asyncio.run(fill(config, args.commits, args.rows))

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
            ice, own = f"{CATALOG}.{TABLE}", f"{CATALOG}.bench.events_spark"
            # One job writing the rows once: a file per core, as Spark lays out a load.
            spark.sql(f"CREATE TABLE {own} USING iceberg AS SELECT /*+ COALESCE(2) */ * FROM {ice}")
            print(f"  {own} (Spark's CTAS): {describe(spark, own)}")
            rows = []
            states = ["at the last commit", "after the next maintenance run"]
            if args.diagnose:
                states += [
                    "+ Spark expire_snapshots(retain_last 1)",
                    "+ Spark rewrite_manifests",
                    "+ Spark rewrite_data_files",
                ]
            for state in states:
                if state == "after the next maintenance run":
                    print(f"one more maintenance run: {asyncio.run(one_more_run(config))}")
                elif state.startswith("+ Spark"):
                    procedure = state.split()[2].split("(")[0]
                    extra = {
                        "expire_snapshots": ", retain_last => 1, older_than => "
                        "TIMESTAMP '2999-01-01 00:00:00'",
                        "rewrite_data_files": ", options => map('min-input-files', '2')",
                    }.get(procedure, "")
                    spark.sql(
                        f"CALL {CATALOG}.system.{procedure}(table => '{CATALOG}.{TABLE}'{extra})"
                    ).collect()
                spark.sql(f"REFRESH TABLE {ice}")
                print(f"  {ice} {state}: {describe(spark, ice)}")
                rows.append((state, *compare(spark, ice, own, args.rounds)))
            print(
                f"\n{AGGREGATE.format(t='t')}, best of {args.rounds}\n"
                "| icespool table | icespool s | Spark-written s | files read (ice / spark) | "
                "ratio (Spark s / icespool s) |\n| --- | ---: | ---: | ---: | ---: |"
            )
            for state, best_ice, best_own, files_ice, files_own in rows:
                print(
                    f"| {state} | {best_ice:.3f} | {best_own:.3f} | {files_ice} / {files_own} | "
                    f"{best_own / best_ice:.2f} |"
                )
            print("target >= 0.95")
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
