"""N icespool replicas committing to ONE Iceberg table: commit rate, conflicts, latency.

Run: .venv/bin/python tests/bench/bench_replicas.py [--replicas 1,2,4,8] [--rate 2000]
         [--seconds 60] [--dir DIR]

Started by the script, as bench_vs_connect.py does: an Apache Kafka 4.1.1 broker
(support/apache_kafka.py) and, per N, a database of its own in the test PostgreSQL
(127.0.0.1:5432) holding the SQL catalog, so every N starts on a fresh table (the
8-column event table of bench_kafka.py, created beforehand as the daemon declares it).

For each N of --replicas: a fresh topic of 16 partitions; N `icespool run` processes
(bench_kafka.KafkaDaemon) with the same config but their own spool directory and port,
ONE consumer group, batch_timeout 1s. Once every replica holds partitions (their
/v1/status), the bench produces --rate events/s in all for --seconds, each event
stamped with its produce time (bench_kafka.produce_live, ids 0..sent-1), waits until
the replicas committed every event, scrapes each one's /metrics and stops them with
SIGTERM. Printed per N:

- commits/s: snapshots the table gained during the produce window / its seconds;
- conflicts/commit: the sum of icespool_commit_conflicts_total over the replicas
  (attempts whose swap the catalog refused because another replica committed first,
  each retried) / the sum of icespool_commits_total;
- gave up: the sum of icespool_commit_failures_total (commits that failed for good
  and were retried by a later flush);
- commit ms p50/p99/mean: duration_ms of the replicas' "committed ..." log lines (the
  flush job: seal, read back, encode, commit with its retries), and the mean as a
  multiple of N=1's;
- visible p50/p99: produce -> first catalog load showing the row (every 50 ms), as
  bench_kafka's latency run computes it;
- cores: CPU of all the replicas together over the window, the broker's, and the
  rest (this bench, producing and polling the catalog, and every other process);
- a check of the table: rows = produced, 0 duplicate and 0 missing ids, else it fails.

The 2 cores are shared with other jobs: the load average (1 min, before its replicas
start) is printed per N.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import pyarrow.compute as pc
from bench_kafka import (
    TABLE,
    Cpu,
    KafkaDaemon,
    SnapshotWatcher,
    pct,
    produce_live,
    snapshot_latencies,
)
from bench_vs_connect import PG, _admin
from bench_write_path import run_main
from support.apache_kafka import KafkaBroker
from support.kafka_harness import create_topic

from icespool.iceberg._catalog import load_catalog
from icespool.iceberg._tables import load_declared

PARTITIONS = 16
BATCH_TIMEOUT = "1s"


@dataclass
class Figures:
    replicas: int
    sent: int
    window_s: float
    window_snapshots: int
    commits: float
    conflicts: float
    gave_up: float
    durations_ms: list[float]
    logged_conflicts: int
    visible: list[float]
    daemon_cpu_s: float
    broker_cpu_s: float
    rest_cpu_s: float  # this bench and every other process on the machine
    check: str
    load: float

    @property
    def commits_per_s(self) -> float:
        return self.window_snapshots / self.window_s

    @property
    def conflicts_per_commit(self) -> float:
        return self.conflicts / self.commits if self.commits else 0.0


def _catalog_raw(directory: Path, database: str) -> dict[str, str]:
    return {
        "name": "bench",
        "type": "sql",
        "uri": f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{database}",
        "warehouse": (directory / "warehouse").as_uri(),
    }


def _create_table(config: Any) -> None:
    """The table as the replicas declare it, before any starts (they would race to)."""
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    load_declared(catalog, TABLE, config.tables[0])
    _dispose(catalog)


def _dispose(catalog: Any) -> None:
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def _committed_lines(daemon: KafkaDaemon) -> list[dict[str, Any]]:
    """The replica's "committed ..." log lines (JSON), with their extra fields."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in daemon.log_path.read_text(errors="replace").splitlines():
            if '"duration_ms"' not in line or '"snapshot_id"' not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if str(entry.get("event", "")).startswith(f"committed {TABLE}"):
                    out.append(entry)
    return out


def check_table(config: Any, sent: int, window: tuple[float, float]) -> tuple[str, int]:
    """Every produced id exactly once (raises otherwise); snapshots made in ``window``."""
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    table = catalog.load_table(TABLE)
    ids = table.scan(selected_fields=("event_id",)).to_arrow()["event_id"]
    snapshots = table.snapshots()
    _dispose(catalog)
    rows = len(ids)
    distinct = pc.unique(ids)
    in_range = pc.sum(pc.and_(pc.greater_equal(distinct, 0), pc.less(distinct, sent))).as_py()
    duplicates, missing = rows - len(distinct), sent - (in_range or 0)
    if rows != sent or duplicates or missing:
        raise RuntimeError(
            f"table holds {rows:,} rows for {sent:,} produced: {duplicates:,} duplicates, "
            f"{missing:,} ids missing"
        )
    begin, end = window
    made = sum(1 for s in snapshots if begin <= s.timestamp_ms / 1e3 <= end)
    return f"{rows:,} rows = produced, 0 duplicates, 0 missing", made


async def _status(session: aiohttp.ClientSession, daemon: KafkaDaemon) -> dict[str, Any]:
    return await daemon.http_status(session)


async def wait_assigned(
    session: aiohttp.ClientSession, daemons: list[KafkaDaemon], within: float = 180.0
) -> list[int]:
    """Until every replica holds partitions and together they hold all of them."""
    deadline = time.monotonic() + within
    while True:
        held = [len((await _status(session, d))["kafka"]["assignments"]) for d in daemons]
        if min(held) > 0 and sum(held) == PARTITIONS:
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions held per replica after {within:.0f}s: {held}")
        await asyncio.sleep(0.2)


async def wait_committed(
    session: aiohttp.ClientSession, daemons: list[KafkaDaemon], sent: int, within: float
) -> list[dict[str, float]]:
    """Each replica's counters once together they committed ``sent`` records."""
    deadline = time.monotonic() + within
    while True:
        counters = [await d.counters(session) for d in daemons]
        committed = sum(int(c.get("icespool_records_committed_total", 0)) for c in counters)
        if committed >= sent:
            return counters
        if time.monotonic() > deadline:
            raise RuntimeError(f"{committed:,} of {sent:,} committed after {within:.0f}s")
        await asyncio.sleep(0.1)


async def one_n(n: int, broker: KafkaBroker, directory: Path, args: argparse.Namespace) -> Figures:
    load = os.getloadavg()[0]
    database = f"replicas_{n}_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{database}"')
    root = directory / f"n{n}"
    topic = f"live-{n}-{uuid.uuid4().hex[:6]}"
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        catalog = _catalog_raw(root, database)
        daemons = [
            KafkaDaemon(
                root / f"replica{i}",
                broker.bootstrap,
                topic,
                f"icespool-{topic}",  # ONE group for all the replicas
                BATCH_TIMEOUT,
                catalog=catalog,
            )
            for i in range(n)
        ]
        config = daemons[0].config
        await asyncio.to_thread(_create_table, config)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                for daemon in daemons:
                    daemon.start()
                for daemon in daemons:
                    await daemon.wait_ready(session, poll=0.1)
                held = await wait_assigned(session, daemons)
                print(f"N={n}: partitions per replica {held}", flush=True)
                watcher = SnapshotWatcher(config)
                watcher.start()
                pids = {f"icespool{i}": d.pid for i, d in enumerate(daemons)}
                broker_pid = broker.process.pid if broker.process else None
                cpu = Cpu(**pids, broker=broker_pid)
                began = time.time()
                sent = await produce_live(
                    broker.bootstrap, topic, args.rate, args.seconds, PARTITIONS
                )
                ended = time.time()
                used = cpu.used()
                counters = await wait_committed(session, daemons, sent, within=120)
                await asyncio.sleep(0.2)  # let the watcher see the last snapshot
                watcher.stop_event.set()
                watcher.join()
                codes = await asyncio.gather(*(asyncio.to_thread(d.stop) for d in daemons))
                if any(code != 0 for code in codes):
                    raise RuntimeError(f"replica exit statuses on SIGTERM: {codes}")
            except Exception:
                for daemon in daemons:
                    daemon.kill()
                    print(f"--- {daemon.directory.name} log tail ---\n{daemon.log_tail()}")
                raise
            finally:
                for daemon in daemons:
                    daemon.kill()
        lines = [entry for d in daemons for entry in _committed_lines(d)]
        visible, _, _ = await asyncio.to_thread(snapshot_latencies, config, watcher.seen)
        if len(visible) != sent:
            raise RuntimeError(f"{len(visible):,} rows in the data files, {sent:,} produced")
        check, made = await asyncio.to_thread(check_table, config, sent, (began, ended))
        total = {
            key: sum(c.get(key, 0.0) for c in counters)
            for key in (
                "icespool_commits_total",
                "icespool_commit_conflicts_total",
                "icespool_commit_failures_total",
            )
        }
        return Figures(
            replicas=n,
            sent=sent,
            window_s=ended - began,
            window_snapshots=made,
            commits=total["icespool_commits_total"],
            conflicts=total["icespool_commit_conflicts_total"],
            gave_up=total["icespool_commit_failures_total"],
            durations_ms=[float(e["duration_ms"]) for e in lines],
            logged_conflicts=sum(int(e.get("conflicts", 0)) for e in lines),
            visible=visible,
            daemon_cpu_s=sum(used[name] for name in pids),
            broker_cpu_s=used.get("broker", 0.0),
            rest_cpu_s=used["bench"] + used["others"],
            check=check,
            load=load,
        )
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        shutil.rmtree(root, ignore_errors=True)


def print_figures(runs: list[Figures]) -> None:
    single = next((r for r in runs if r.replicas == 1), None)
    base = mean(single.durations_ms) if single and single.durations_ms else 0.0
    print(
        f"\n{'N':>2} {'load':>4} {'events':>8} {'commits/s':>9} {'conflicts':>9} "
        f"{'/commit':>7} {'gave up':>7} {'commit ms p50':>13} {'p99':>6} {'mean':>6} "
        f"{'x N=1':>5} {'visible s p50':>13} {'p99':>5} {'cores':>5} {'broker':>6} {'rest':>5}"
    )
    for r in runs:
        d = r.durations_ms
        ratio = f"{mean(d) / base:5.2f}" if base and d else f"{'-':>5}"
        print(
            f"{r.replicas:>2} {r.load:4.1f} {r.sent:8,} {r.commits_per_s:9.2f} "
            f"{r.conflicts:9.0f} {r.conflicts_per_commit:7.3f} {r.gave_up:7.0f} "
            f"{pct(d, 0.5):13.0f} {pct(d, 0.99):6.0f} {mean(d):6.0f} {ratio} "
            f"{pct(r.visible, 0.5):13.2f} {pct(r.visible, 0.99):5.2f} "
            f"{r.daemon_cpu_s / r.window_s:5.2f} {r.broker_cpu_s / r.window_s:6.2f} "
            f"{r.rest_cpu_s / r.window_s:5.2f}"
        )
    print()
    for r in runs:
        print(
            f"N={r.replicas}: {r.window_snapshots} snapshots in {r.window_s:.1f}s; "
            f"{r.commits:.0f} commits by the replicas' counters ({len(r.durations_ms)} "
            f"'committed' log lines, their conflicts={r.logged_conflicts}); "
            f"daemons {r.daemon_cpu_s:.1f} CPU-s; table: {r.check}"
        )


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", default="1,2,4,8", help="replica counts, in order")
    parser.add_argument("--rate", type=float, default=2_000.0, help="events/s in all")
    parser.add_argument("--seconds", type=float, default=60.0, help="produce window")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    args = parser.parse_args()
    counts = [int(x) for x in args.replicas.split(",") if x]
    began = time.perf_counter()
    print(
        f"cores: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.1f}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}; {args.rate:,.0f} events/s for "
        f"{args.seconds:.0f}s per N, {PARTITIONS} partitions, batch_timeout {BATCH_TIMEOUT}"
    )
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-replicas-", dir=args.dir))
    broker = KafkaBroker.start(directory / "kafka")
    runs: list[Figures] = []
    try:
        print(f"Apache Kafka on {broker.bootstrap} (started in {broker.started_in:.1f}s)")
        for n in counts:
            runs.append(await one_n(n, broker, directory, args))
            print(f"N={n} done: {runs[-1].check}", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print_figures(runs)
    print(
        f"\nbench took {time.perf_counter() - began:.0f}s; "
        f"load average now {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    run_main(main, "the replicas, the broker")
