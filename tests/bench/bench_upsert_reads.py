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
   the same rows, compact), then times ``count(*)`` and ``GROUP BY city`` on each table,
   and counts each table's live delete files by kind.
4. Per probe: delete files (equality / position), both query times and their ratios;
   then the median and worst ratios. The daemons' commit durations (their logs) give
   commit p50/p99, and their metrics how each upsert commit deleted.

Spark answers the append table's ``count(*)`` from its metadata; the GROUP BY reads
every row of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spark import BENCH_CONF
from bench_write_path import _LIVE, free_port, icespool_command, run_main, to_toml
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
COLUMNS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "score", "type": "long"},
    {"name": "city", "type": "string"},
]
CITIES = [f"city-{i:02d}" for i in range(50)]


@dataclass
class Probe:
    at: float
    deletes: dict[str, tuple[int, int]]  # table -> (equality, position) delete files
    count_ms: dict[str, float]
    group_ms: dict[str, float]


@dataclass
class Daemon:
    table: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    failed_posts: int = 0
    changes: int = 0
    commits: list[float] = field(default_factory=list)


def _catalog(args: argparse.Namespace, directory: Path, database: str | None) -> dict[str, Any]:
    uri = (
        f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
        if database is not None
        else f"sqlite:///{directory / 'catalog.db'}"
    )
    return {
        "name": "bench",
        "type": "sql",
        "uri": uri,
        "warehouse": (directory / "warehouse").as_uri(),
    }


def _config(
    args: argparse.Namespace, directory: Path, catalog: dict[str, Any], table: str, port: int
) -> dict[str, Any]:
    props = {"format-version": str(args.format_version)}
    return {
        "catalog": catalog,
        "spool": {"dir": str(directory / f"spool-{table}")},
        "http": {"listen": f"127.0.0.1:{port}"},
        "defaults": {"batch_timeout": args.batch_timeout},
        "log": {"level": "info", "format": "json"},
        "tables": [
            {"name": table, "create": True, "schema": COLUMNS, "key": ["id"], "properties": props}
        ],
    }


def _start(
    args: argparse.Namespace,
    directory: Path,
    catalog: dict[str, Any],
    table: str,
    tree: Path | None,
) -> Daemon:
    port = free_port()
    config = directory / f"{table}.toml"
    config.write_text(to_toml(_config(args, directory, catalog, table, port)))
    log = directory / f"{table}.log"
    env = dict(os.environ)
    command = icespool_command()
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "build" / "pkgroot")
        command = [sys.executable, "-m", "icespool"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    _LIVE.add(proc)
    return Daemon(table, port, proc, log)


async def _ready(session: aiohttp.ClientSession, daemon: Daemon) -> None:
    for _ in range(600):
        try:
            async with session.get(f"http://127.0.0.1:{daemon.port}/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if daemon.proc.poll() is not None:
            raise SystemExit(f"{daemon.table}: the daemon exited; see {daemon.log}")
        await asyncio.sleep(0.1)
    raise SystemExit(f"{daemon.table}: not ready after 60s; see {daemon.log}")


def _body(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _upsert(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "score": rng.randrange(10**6), "city": rng.choice(CITIES), "_op": "upsert"}


def _changes(rng: random.Random, count: int, keys: int, deletes: float) -> bytes:
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        key = rng.randrange(keys)
        if rng.random() < deletes:
            rows.append({"id": key, "_op": "delete"})
        else:
            rows.append(
                {
                    "id": key,
                    "score": rng.randrange(10**6),
                    "city": rng.choice(CITIES),
                    "_op": "upsert",
                }
            )
    return _body(rows)


async def _post(session: aiohttp.ClientSession, daemon: Daemon, body: bytes, count: int) -> None:
    url = f"http://127.0.0.1:{daemon.port}/v1/tables/{daemon.table}/changes"
    headers = {"Content-Type": "application/x-ndjson"}
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status == 200:
                daemon.changes += count
            else:
                daemon.failed_posts += 1
    except aiohttp.ClientError:
        daemon.failed_posts += 1


async def _feed(
    session: aiohttp.ClientSession, daemons: list[Daemon], args: argparse.Namespace, until: float
) -> None:
    rng = random.Random(11)
    per_body = max(1, args.rate // 10)
    next_at = time.monotonic()
    while time.monotonic() < until:
        body = _changes(rng, per_body, args.keys, args.deletes)
        await asyncio.gather(*(_post(session, d, body, per_body) for d in daemons))
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
    for table in [*tables, APPENDS]:
        name = f"bench.{table}"
        count_ms[table] = _timed_ms(spark, f"SELECT count(*) FROM {name}")
        group_ms[table] = _timed_ms(
            spark, f"SELECT city, count(*), sum(score) FROM {name} GROUP BY city"
        )
    return Probe(time.monotonic() - began, deletes, count_ms, group_ms)


def _commit_ms(daemon: Daemon) -> list[float]:
    out: list[float] = []
    for line in daemon.log.read_text(errors="replace").splitlines():
        if '"committed ' not in line and "committed " not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("table") == daemon.table and "duration_ms" in record:
            out.append(float(record["duration_ms"]))
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _upsert_counts(session: aiohttp.ClientSession, daemon: Daemon) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{daemon.port}/metrics") as resp:
        text = await resp.text()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("icespool_upsert_commits_total{"):
            kind = line.split('deletes="', 1)[1].split('"', 1)[0]
            counts[kind] = float(line.rsplit(" ", 1)[1])
    return counts


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
        catalog_props = _catalog(args, directory, database)
        daemons = [_start(args, directory, catalog_props, UPSERTS, None)]
        if args.baseline_tree is not None:
            daemons.append(_start(args, directory, catalog_props, BASELINE, args.baseline_tree))
        try:
            return await _run(args, directory, catalog_props, daemons, runtime)
        finally:
            for daemon in daemons:
                daemon.proc.terminate()
            for daemon in daemons:
                try:
                    daemon.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    daemon.proc.kill()
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
            await _ready(session, daemon)
        # The initial load: every key once (one body per 10,000).
        rng = random.Random(3)
        for start in range(0, args.keys, 10_000):
            rows = [
                {
                    "id": i,
                    "score": rng.randrange(10**6),
                    "city": rng.choice(CITIES),
                    "_op": "upsert",
                }
                for i in range(start, min(args.keys, start + 10_000))
            ]
            await asyncio.gather(*(_post(session, d, _body(rows), len(rows)) for d in daemons))
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
        counts = {d.table: await _upsert_counts(session, d) for d in daemons}
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
        commits = _commit_ms(daemon)
        print(
            f"{t}: GROUP BY / append median {statistics.median(group):.2f}x worst "
            f"{max(group):.2f}x; count(*) median {statistics.median(count):.2f}x worst "
            f"{max(count):.2f}x; commits {len(commits)} p50 {_quantile(commits, 0.5):.0f} ms "
            f"p99 {_quantile(commits, 0.99):.0f} ms; upsert commits by deletes {counts[t]}; "
            f"changes acked {daemon.changes}, failed posts {daemon.failed_posts}"
        )


if __name__ == "__main__":
    run_main(main, "the daemons")
