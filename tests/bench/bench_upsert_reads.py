"""Reads of a live upsert table against an append-only table of the same rows, while a
real ``icespool run`` feeds it changes every second: what a CDC user's queries pay for
freshness.

    python tests/bench/bench_upsert_reads.py [--minutes 15] [--rate 2000] [--keys 100000]
        [--deletes 0.3] [--probe-every 30] [--batch-timeout 1s] [--format-version 2]
        [--baseline-tree PATH] [--catalog postgres|sqlite]

1. One ``icespool run`` (PostgreSQL catalog by default, local warehouse, default
   maintenance: every 5 minutes) with an upsert table ``bench.upserts`` (key ``id``; long
   id, long score, string city). With ``--baseline-tree`` (a checkout of another
   revision, its ``make pkgroot`` done), a second daemon of THAT tree writes
   ``bench.upserts_baseline`` on the same catalog with its own spool, fed the same
   changes: the before and after of one run.
2. All ``--keys`` ids are upserted once, then ``--rate`` changes a second over HTTP
   ``POST /v1/tables/{t}/changes`` (NDJSON, one body every 100 ms), ``--deletes`` of them
   deletes, the rest upserts of a random id, for ``--minutes``.
3. Every ``--probe-every`` seconds one warm Spark session (local[2]) copies the upsert
   table's current rows into the append-only table ``bench.appends`` (INSERT OVERWRITE:
   the same rows, compact), then times ``count(*)`` and ``GROUP BY city`` on each table
   (best of three, the tables in turn), and counts each table's live delete files by
   kind.
4. Per probe: delete files (equality / position), both query times and their ratios;
   then the median and worst ratios. The daemons' commit durations (their logs) give
   commit p50/p99, and their metrics how each upsert commit deleted.

Spark answers the append table's ``count(*)`` from its metadata; the GROUP BY reads
every row of both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _upsert_daemons as daemons_
from _spark import BENCH_CONF
from _upsert_daemons import Daemon
from bench_write_path import run_main
from support.postgres import create_database, drop_database

from icespool.cdc import live_files
from icespool.config import validate_config
from icespool.iceberg import load_catalog
from icespool.spark.conf import RUNTIME_DIR_ENV
from icespool.spark.session import spark_session

REPO = Path(__file__).resolve().parents[2]
UPSERTS = "bench.upserts"
BASELINE = "bench.upserts_baseline"
APPENDS = "bench.appends"


@dataclass
class Probe:
    at: float
    deletes: dict[str, tuple[int, int]]  # table -> (equality, position) delete files
    count_ms: dict[str, float]
    group_ms: dict[str, float]


async def _feed(
    session: aiohttp.ClientSession, daemons: list[Daemon], args: argparse.Namespace, until: float
) -> None:
    rng = random.Random(11)
    per_body = max(1, args.rate // 10)
    next_at = time.monotonic()
    while time.monotonic() < until:
        body = daemons_.changes(rng, per_body, args.keys, args.deletes)
        await asyncio.gather(*(daemons_.post(session, d, body, per_body) for d in daemons))
        next_at += 0.1
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def _delete_files(catalog: Any, table: str) -> tuple[int, int]:
    loaded = catalog.load_table(table)
    snapshot = loaded.metadata.current_snapshot()
    if snapshot is None:
        return 0, 0
    live = live_files(loaded.io, loaded.metadata, snapshot)
    equality = sum(1 for d in live.deletes if d.is_equality)
    return equality, len(live.deletes) - equality


def _timed_ms(spark: Any, sql: str) -> float:
    began = time.perf_counter()
    spark.sql(sql).collect()
    return (time.perf_counter() - began) * 1000


def _probe(spark: Any, catalog: Any, tables: list[str], began: float) -> Probe:
    spark.sql(f"INSERT OVERWRITE bench.{APPENDS} SELECT * FROM bench.{UPSERTS}")
    deletes = {t: _delete_files(catalog, t) for t in tables}
    count_ms: dict[str, float] = {}
    group_ms: dict[str, float] = {}
    # Best of three, the tables taken in turn: one query's time on a shared machine
    # varies by half, and the tables are read at nearly the same moment.
    for _ in range(3):
        for table in [*tables, APPENDS]:
            name = f"bench.{table}"
            count = _timed_ms(spark, f"SELECT count(*) FROM {name}")
            group = _timed_ms(spark, f"SELECT city, count(*), sum(score) FROM {name} GROUP BY city")
            count_ms[table] = min(count, count_ms.get(table, count))
            group_ms[table] = min(group, group_ms.get(table, group))
    return Probe(time.monotonic() - began, deletes, count_ms, group_ms)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--deletes", type=float, default=0.3)
    parser.add_argument("--probe-every", type=float, default=30.0)
    parser.add_argument("--batch-timeout", default="1s")
    parser.add_argument("--format-version", type=int, default=2, choices=[2, 3])
    parser.add_argument("--baseline-tree", type=Path, default=None)
    parser.add_argument("--catalog", choices=["postgres", "sqlite"], default="postgres")
    args = parser.parse_args()
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")
    database = create_database("bench_upsert_reads") if args.catalog == "postgres" else None
    with tempfile.TemporaryDirectory(prefix="bench-upsert-reads-") as tmp:
        directory = Path(tmp)
        catalog_props = daemons_.catalog_props(directory, database)
        shape = {"batch_timeout": args.batch_timeout, "format_version": args.format_version}
        daemons = [daemons_.start(directory, catalog_props, UPSERTS, **shape)]
        if args.baseline_tree is not None:
            daemons.append(
                daemons_.start(directory, catalog_props, BASELINE, tree=args.baseline_tree, **shape)
            )
        try:
            return await _run(args, directory, catalog_props, daemons, runtime)
        finally:
            daemons_.stop(daemons)
            if database is not None:
                drop_database(database)


async def _run(
    args: argparse.Namespace,
    directory: Path,
    catalog_props: dict[str, Any],
    daemons: list[Daemon],
    runtime: str,
) -> int:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for daemon in daemons:
            await daemons_.ready(session, daemon)
        await daemons_.load_keys(session, daemons, args.keys)
        config = validate_config(
            {"catalog": catalog_props, "spool": {"dir": str(directory / "bench-spool")}}
        )
        catalog = load_catalog(config.catalog.name, config.catalog.properties())
        spark = spark_session(
            config,
            runtime_dir=runtime,
            app_name="icespool-bench-upsert-reads",
            master="local[2]",
            conf={**BENCH_CONF, "spark.sql.adaptive.enabled": "false"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS bench.{APPENDS} (id bigint, score bigint, city string) "
            f"USING iceberg TBLPROPERTIES ('format-version'='{args.format_version}')"
        )
        await asyncio.sleep(3)  # the initial load committed (batch_timeout)
        tables = [d.table for d in daemons]
        # A warm session: the JVM's JIT and Iceberg's read path exercised on every
        # table before the first timed probe.
        for _ in range(3):
            await asyncio.to_thread(_probe, spark, catalog, tables, time.monotonic())
        began = time.monotonic()
        until = began + args.minutes * 60
        feeder = asyncio.create_task(_feed(session, daemons, args, until))
        probes: list[Probe] = []
        header = (
            "  t(s) "
            + "".join(f"| {t:>22} del eq/pos  count ms  group ms " for t in tables)
            + f"| {APPENDS} count/group ms"
        )
        print(header, flush=True)
        next_probe = began + args.probe_every
        while time.monotonic() < until:
            await asyncio.sleep(max(0.0, next_probe - time.monotonic()))
            next_probe += args.probe_every
            probe = await asyncio.to_thread(_probe, spark, catalog, tables, began)
            probes.append(probe)
            line = f"{probe.at:6.0f} "
            for t in tables:
                eq, pos = probe.deletes[t]
                line += f"| {eq:>5}/{pos:<5} {probe.count_ms[t]:>8.0f} {probe.group_ms[t]:>9.0f}   "
            line += f"| {probe.count_ms[APPENDS]:.0f}/{probe.group_ms[APPENDS]:.0f}"
            print(line, flush=True)
        await feeder
        counts = {d.table: await daemons_.metrics(session, d) for d in daemons}
    _summary(args, daemons, probes, counts)
    return 0


def _summary(
    args: argparse.Namespace,
    daemons: list[Daemon],
    probes: list[Probe],
    counts: dict[str, dict[str, float]],
) -> None:
    print()
    print(
        f"{args.minutes:g} min, {args.rate} changes/s over {args.keys} keys, "
        f"{args.deletes:.0%} deletes, batch_timeout {args.batch_timeout}, "
        f"format-version {args.format_version}, {len(probes)} probes"
    )
    for daemon in daemons:
        t = daemon.table
        group = [p.group_ms[t] / p.group_ms[APPENDS] for p in probes]
        count = [p.count_ms[t] / p.count_ms[APPENDS] for p in probes]
        commits = daemons_.commit_ms(daemon)
        p50, p99 = daemons_.quantile(commits, 0.5), daemons_.quantile(commits, 0.99)
        kinds = {
            kind: counts[t].get(f'icespool_upsert_commits_total{{deletes="{kind}"}}', 0)
            for kind in ("position", "equality")
        }
        print(
            f"{t}: GROUP BY / append median {statistics.median(group):.2f}x worst "
            f"{max(group):.2f}x; count(*) median {statistics.median(count):.2f}x worst "
            f"{max(count):.2f}x; commits {len(commits)} p50 {p50:.0f} ms "
            f"p99 {p99:.0f} ms; upsert commits by deletes {kinds}; "
            f"changes acked {daemon.changes}, failed posts {daemon.failed_posts}"
        )


if __name__ == "__main__":
    run_main(main, "the daemons")
