"""Spark's read of an upsert table after N change commits, before vs after the daemon's
compaction applies the equality deletes (issue 16: read cost must not grow with changes).

Run: .venv/bin/python tests/bench/bench_compaction_deletes.py [--commits N]
         [--changes-per-commit C] [--keys K] [--rounds R]

1. In-process `Icespool` (maintenance off): an upsert table keyed by ``id``; N commits of
   C changes each (30 % deletes) over K keys: each commit = data files of the upserts
   plus an equality-delete file for every touched key, one snapshot.
2. Spark, best of R (interleaved warm-up first): ``SELECT count(*)`` and
   ``SELECT city, count(*), sum(score) GROUP BY city`` on the table as the commits left
   it: N equality-delete files, each applying to every older data file.
3. The daemon's compaction (plan, rewrite with deletes applied, one replace commit that
   drops the delete files), timed; runs until no delete file is left.
4. The same Spark queries again. Prints both times and the ratio before / after, the
   file counts, and checks the answers are equal (and equal to the daemon's own merged
   read) before and after.
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

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _spark import BENCH_CONF

from icespool.cdc import DELETE, UPSERT, read_merged, with_ops
from icespool.config import embedded_default, validate_config
from icespool.iceberg._catalog import load_catalog
from icespool.lifecycle.service import Icespool
from icespool.maintenance import IoBudget, commit_rewrite, plan_compaction, rewrite
from icespool.spark.conf import RUNTIME_DIR_ENV
from icespool.spark.session import spark_session

REPO = Path(__file__).resolve().parents[2]
TABLE = "b.upserts"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "score", "type": "long"},
    {"name": "city", "type": "string"},
]
COUNT = "SELECT count(*) AS n FROM {t}"
AGGREGATE = "SELECT city, count(*) AS n, sum(score) AS s FROM {t} GROUP BY city ORDER BY city"


def make_config(root: Path) -> Any:
    raw = embedded_default(root / "data")
    raw["http"] = {"listen": "127.0.0.1:0"}
    raw["maintenance"] = {"enabled": False}
    raw["tables"] = [{"name": TABLE, "create": True, "schema": SCHEMA, "key": ["id"]}]
    return validate_config(raw)


async def fill(config: Any, commits: int, per_commit: int, keys: int) -> float:
    rng = np.random.default_rng(16)
    service = Icespool(config)
    await service.start()
    began = time.perf_counter()
    try:
        writer = service.writer(TABLE)
        for n in range(commits):
            ids = rng.integers(0, keys, per_commit, dtype=np.int64)
            ops = np.where(rng.random(per_commit) < 0.3, DELETE, UPSERT).astype(np.int8)
            data = pa.table(
                {
                    "id": ids,
                    "score": rng.integers(0, 1000, per_commit),
                    "city": pa.array(np.array(["Oslo", "Lima", "Pune", "Kyiv"])[ids % 4]),
                }
            )
            await writer.append(with_ops(data, pa.array(ops), ["id"]))
            await writer.flush()
            if (n + 1) % 100 == 0:
                print(f"  {n + 1} commits, {time.perf_counter() - began:.0f} s", flush=True)
    finally:
        await service.stop()
    return time.perf_counter() - began


def timed(spark: Any, sql: str) -> tuple[float, list[Any]]:
    began = time.perf_counter()
    rows = spark.sql(sql).collect()
    return time.perf_counter() - began, rows


def best(spark: Any, name: str, rounds: int) -> tuple[float, float, list[Any], list[Any]]:
    for _ in range(2):  # warm-up: JIT, metadata caches, page cache
        timed(spark, COUNT.format(t=name))
        timed(spark, AGGREGATE.format(t=name))
    count_s = agg_s = float("inf")
    count_rows: list[Any] = []
    agg_rows: list[Any] = []
    for _ in range(rounds):
        seconds, count_rows = timed(spark, COUNT.format(t=name))
        count_s = min(count_s, seconds)
        seconds, agg_rows = timed(spark, AGGREGATE.format(t=name))
        agg_s = min(agg_s, seconds)
    return count_s, agg_s, count_rows, agg_rows


def shape(spark: Any, name: str) -> str:
    data = spark.sql(f"SELECT count(*) FROM {name}.data_files").first()[0]
    deletes = spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0]
    manifests = spark.sql(f"SELECT count(*) FROM {name}.manifests").first()[0]
    return f"{data} data files, {deletes} delete files, {manifests} manifests"


def compact(table: Any) -> tuple[float, int, list[str]]:
    began = time.perf_counter()
    runs: list[str] = []
    while True:
        table.refresh()
        plans = plan_compaction(table, target_file_size=128 << 20, max_bytes=1 << 34)
        if not plans:
            break
        plan = plans[0]
        new = rewrite(
            table,
            plan,
            budget=IoBudget(None),
            row_group_records=1_000_000,
            compression="zstd",
            incarnation="0" * 12,
        )
        result = commit_rewrite(table, plan, new)
        assert result.outcome == "committed", result
        runs.append(
            f"{result.files_replaced} data files -> {result.files_added}, "
            f"{result.delete_files_removed} delete files dropped, "
            f"{result.rows_removed:,} rows deleted"
        )
    return time.perf_counter() - began, len(runs), runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--changes-per-commit", type=int, default=2_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")
    with tempfile.TemporaryDirectory(prefix="icespool-bench-cdc-compact-") as tmp:
        config = make_config(Path(tmp))
        seconds = asyncio.run(fill(config, args.commits, args.changes_per_commit, args.keys))
        changes = args.commits * args.changes_per_commit
        print(
            f"{args.commits} commits of {args.changes_per_commit:,} changes over "
            f"{args.keys:,} keys: {seconds:.0f} s"
        )
        catalog = load_catalog(config.catalog.name, config.catalog.properties())
        table = catalog.load_table(TABLE)
        spark = spark_session(
            config,
            runtime_dir=runtime,
            app_name="icespool-bench",
            master="local[2]",
            conf={
                **BENCH_CONF,
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        name = f"{config.catalog.name}.{TABLE}"
        try:
            print(f"before: {shape(spark, name)}")
            before = best(spark, name, args.rounds)
            compact_s, runs, details = compact(table)
            for line in details:
                print(f"  compaction run: {line}")
            spark.sql(f"REFRESH TABLE {name}")
            print(f"after:  {shape(spark, name)}")
            after = best(spark, name, args.rounds)
        finally:
            spark.stop()
        merged = read_merged(table)
        same = before[2] == after[2] and before[3] == after[3]
        exact = before[2][0].n == merged.num_rows
        print(f"daemon compaction: {compact_s:.1f} s in {runs} run(s) ({changes:,} changes)")
        print(
            "| query | before (s) | after (s) | before / after |\n| --- | ---: | ---: | ---: |\n"
            f"| count(*) | {before[0]:.3f} | {after[0]:.3f} | {before[0] / after[0]:.1f}x |\n"
            f"| GROUP BY city | {before[1]:.3f} | {after[1]:.3f} | {before[1] / after[1]:.1f}x |"
        )
        print(f"same answers before and after: {same}; equal to the daemon's merged read: {exact}")
        return 0 if same and exact else 1


if __name__ == "__main__":
    sys.exit(main())
