"""icespool beside Apache Iceberg's Kafka Connect sink: same broker, topic, catalog and disk.

Run: python tests/bench/bench_vs_connect.py [--events 5000000] [--runs 3] [--intervals 1,60]
         [--latency-seconds 20] [--latency-intervals 1] [--spark] [--connect-tasks 1]
         [--dir DIR]
     or: ... bench_vs_connect.py --exactly-once [--events N] [--kills 3] [--intervals 1]

Started by the script: an Apache Kafka 4.1.1 broker (support/apache_kafka.py), a database
of its own in the test PostgreSQL (127.0.0.1:5432) holding ONE Iceberg SQL/JDBC catalog,
and a warehouse directory under --dir. The sink is Iceberg 1.11.0's IcebergSinkConnector in
a Kafka Connect 4.1.1 standalone worker (support/iceberg_sink.py; its plugin folder is
copied from Maven Central on first use, and the bench says how long that took), its
JdbcCatalog set by icespool.spark.conf.catalog_options from the daemon's [catalog], so both
systems keep their tables in the same ``iceberg_tables`` rows under the same catalog name
and Spark and pyiceberg read both the same way. Every table is created beforehand by the
daemon's own code (load_declared: same schema, same properties).

One topic of 6 partitions gets --events JSON events (_events.py, ids 0..N-1, about 170 B)
before anything is timed. For each commit interval (the sink's
iceberg.control.commit.interval-ms, icespool's batch_timeout) and run, each system reads
that topic into a fresh table, in alternating order; timed from its consumer's partition
assignment (from its log; start-up is shown apart) to the first catalog load (every 50 ms)
that shows all N rows. CPU seconds and peak RSS are the process tree's (/proc, every
100 ms: the Connect JVM; the daemon and any child). Each finished table is checked: rows,
distinct ids, duplicates and missing ids, its data files and snapshots.

Beside them, in each run of the first interval: Kafka's own ConsumerPerformance (the
broker's release jars) on the same topic, the fastest this broker and machine deliver
records at all; and bench_kafka.py's bare pipes (aiokafka, and librdkafka when
confluent-kafka is importable: it is not a dependency), consumers that keep nothing.

Then produce -> visible at half the slower system's median rate (--latency-intervals),
as bench_kafka.py measures it, and optionally (--spark) one Spark GROUP BY over each
system's last table. --exactly-once instead kills each system (kill -9 of its process
tree) --kills times mid-stream, restarts it, and counts duplicates and missing ids.
Ratios within a run are the figures that count: the 2 cores are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _events import COLUMNS, ndjson_body
from _spark import BENCH_CONF
from _vs_runs import (
    KillRun,
    LatencyResult,
    Throughput,
    kill_run,
    latency_run,
    throughput_run,
)
from _vs_systems import Contender, DaemonContender, SinkContender
from bench_kafka import PARTITIONS, Run, bare_pipe, librdkafka_pipe, pct, produce_topic, spread
from bench_write_path import _LIVE, mib, run_main
from support.apache_kafka import LIBS, KafkaBroker
from support.iceberg_sink import ICEBERG_VERSION, USER_JVM_OPTIONS, ensure_plugin
from support.jvm import find_java
from support.kafka_harness import create_topic
from support.postgres import create_database, drop_database, sqlalchemy_uri

from icespool.config import validate_config
from icespool.iceberg._catalog import load_catalog
from icespool.iceberg._tables import load_declared
from icespool.spark.conf import catalog_options

TOPIC = "events"
CATALOG = "bench"
# Iceberg Java writes gzip into a table that does not name a codec (zstd is only written
# into the properties of tables Java itself creates); pyiceberg writes zstd either way.
# Both tables name it, as a table Spark or the sink's auto-create made would.
TABLE_PROPERTIES = {"write.parquet.compression-codec": "zstd"}
SINK, ICE = "Connect sink", "icespool"


# ------------------------------------------------------------------ the shared catalog


class Setup:
    """The broker, the catalog (a database of its own) and how to build each contender."""

    def __init__(self, directory: Path, broker: KafkaBroker, database: str, args: Any) -> None:
        self.directory = directory
        self.broker = broker
        self.args = args
        self.catalog_raw = {
            "name": CATALOG,
            "type": "sql",
            "uri": sqlalchemy_uri(database),
            "warehouse": (directory / "warehouse").as_uri(),
        }
        self.config = self._config("bench.unused")
        self.java_catalog, _ = catalog_options(self.config.catalog)
        self.tables: dict[tuple[str, float], str] = {}  # last table per (system, interval)

    def _config(self, table: str) -> Any:
        return validate_config(
            {
                "catalog": self.catalog_raw,
                "spool": {"dir": str(self.directory / "unused-spool")},
                "tables": [
                    {
                        "name": table,
                        "create": True,
                        "schema": COLUMNS,
                        "properties": TABLE_PROPERTIES,
                    }
                ],
            }
        )

    def create_table(self, table: str) -> None:
        """As the daemon creates a declared table (schema, properties); kept if it exists."""
        config = self._config(table)
        catalog = load_catalog(config.catalog.name, config.catalog.properties())
        load_declared(catalog, table, config.tables[0])
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()

    def make(self, system: str, interval_s: float) -> Any:
        def build(table: str, topic: str, tag: str) -> Contender:
            self.create_table(table)
            root = self.directory / tag
            if system == SINK:
                control = f"control-{tag}"
                if not (root / "control-created").exists():
                    asyncio.run(create_topic(self.broker.bootstrap, control, 1))
                    root.mkdir(parents=True, exist_ok=True)
                    (root / "control-created").touch()
                return SinkContender(
                    root,
                    self.broker.bootstrap,
                    table,
                    name=f"sink-{tag}",
                    topics=[topic],
                    catalog_name=CATALOG,
                    catalog=self.java_catalog,
                    control_topic=control,
                    commit_interval_ms=int(interval_s * 1000),
                    tasks=self.args.connect_tasks,
                )
            return DaemonContender(
                root,
                self.broker.bootstrap,
                table,
                topic=topic,
                group=f"icespool-{tag}",
                batch_timeout=f"{interval_s:g}s",
                catalog=self.catalog_raw,
                columns=COLUMNS,
                properties=TABLE_PROPERTIES,
            )

        return build


# ------------------------------------------------------------------ the ceiling


def consumer_performance(bootstrap: str, total: int, group: str) -> Run:
    """Kafka's ConsumerPerformance (kafka-consumer-perf-test.sh: -Xmx512M and the
    run-class JVM options) on the topic: its fetch rate (after the group join)."""
    command = [
        find_java(),
        "-Xmx512M",
        *(o for o in USER_JVM_OPTIONS if not o.startswith("-Xm")),
        "-cp",
        f"{LIBS}/*",
        "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        TOPIC,
        "--messages",
        str(total),
        "--group",
        group,
        "--timeout",
        "120000",
    ]
    # The only child this process reaps meanwhile: its rusage is the JVM's, to the end.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _LIVE.add(proc)  # type: ignore[arg-type]
    out, _ = proc.communicate(timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in out.splitlines() if line.count(",") >= 9]
    if proc.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"ConsumerPerformance exited with {proc.returncode}:\n{out[-3000:]}")
    values = dict(zip(lines[-2].split(", "), lines[-1].split(", "), strict=False))
    fetch_ms = float(values["fetch.time.ms"])
    rows = int(values["data.consumed.in.nMsg"])
    return Run(
        "Kafka ConsumerPerformance (fetch rate)",
        rows,
        fetch_ms / 1e3,
        note=f"group join {float(values['rebalance.time.ms']) / 1e3:.1f}s (not timed); "
        "CPU includes the JVM's start",
        cpu_s=cpu_s,
    )


# ------------------------------------------------------------------ Spark


def spark_group_by(setup: Setup) -> list[str]:
    """One GROUP BY over each system's last table; the answers must agree."""
    from icespool.spark.session import spark_session

    runtime = os.environ.get("ICESPOOL_SPARK_RUNTIME") or str(
        Path(__file__).resolve().parents[2] / ".spark-runtime"
    )
    spark = spark_session(
        setup.config,
        runtime_dir=runtime,
        app_name="bench-vs-connect",
        master="local[2]",
        conf={
            **BENCH_CONF,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    lines: list[str] = []
    answers: dict[str, list[tuple[Any, ...]]] = {}
    try:
        for (system, interval), table in sorted(setup.tables.items()):
            sql = (
                f"SELECT kind, count(*), count(DISTINCT event_id), round(sum(value), 3) "
                f"FROM {CATALOG}.{table} GROUP BY kind ORDER BY kind"
            )
            best = float("inf")
            for _ in range(3):
                began = time.perf_counter()
                rows = [tuple(r) for r in spark.sql(sql).collect()]
                best = min(best, time.perf_counter() - began)
            answers[table] = rows
            lines.append(
                f"  {system:13} {interval:>4g} s  {table:28} GROUP BY kind: best of 3 "
                f"{best:.2f} s; {sum(r[1] for r in rows):,} rows"
            )
    finally:
        spark.stop()
    distinct = {repr(a) for a in answers.values()}
    lines.append(
        "  every table gives the same answer"
        if len(distinct) == 1
        else f"  ANSWERS DIFFER: {answers}"
    )
    return lines


# ------------------------------------------------------------------ printing


def _row(label: str, values: list[float], fmt: str) -> str:
    return f"  {label:58} {spread(values, fmt)}" if values else f"  {label:58} -"


def print_interval(
    interval: float, runs: dict[str, list[Throughput]], ceilings: dict[str, list[Run]]
) -> None:
    sink, ice = runs[SINK], runs[ICE]
    print(f"\n== commit interval {interval:g} s: {len(ice)} runs (min / median / max) ==")
    for label, results in ((SINK, sink), (ICE, ice)):
        print(
            _row(
                f"{label}: rows/s, assignment -> all visible",
                [r.rows_per_s for r in results],
                ",.0f",
            )
        )
        print(
            _row(
                f"{label}: CPU-s per million rows (process tree)",
                [r.cpu_per_million for r in results],
                ".2f",
            )
        )
        print(
            _row(
                f"{label}: peak RSS MiB (process tree)",
                [r.peak_rss_kib / 1024 for r in results],
                ",.0f",
            )
        )
        print(
            _row(
                f"{label}: start-up s (spawn -> assigned, not timed)",
                [r.startup for r in results],
                ".1f",
            )
        )
        print(_row(f"{label}: data files", [r.report.files for r in results], ",.0f"))
        print(_row(f"{label}: MiB written", [r.report.bytes / 2**20 for r in results], ",.1f"))
        print(
            _row(
                f"{label}: median file MiB",
                [r.report.median_file_bytes / 2**20 for r in results],
                ".2f",
            )
        )
        print(_row(f"{label}: snapshots", [r.report.snapshots for r in results], ",.0f"))
        print(
            _row(
                f"{label}: duplicates / missing (sum)",
                [r.report.duplicates + r.report.missing for r in results],
                ",.0f",
            )
        )
    print(
        _row(
            "icespool / sink: rows/s (same run)",
            [i.rows_per_s / s.rows_per_s for i, s in zip(ice, sink, strict=True)],
            ".2f",
        )
    )
    print(
        _row(
            "icespool / sink: CPU-s per million rows",
            [i.cpu_per_million / s.cpu_per_million for i, s in zip(ice, sink, strict=True)],
            ".2f",
        )
    )
    for label, results in ceilings.items():
        if not results:
            continue
        print(_row(f"{label}: rows/s", [r.rows_per_s for r in results], ",.0f"))
        print(
            _row("  its CPU-s per million rows", [r.cpu_s / r.rows * 1e6 for r in results], ".2f")
        )
        print(
            _row(
                "  icespool / it (same run)",
                [i.rows_per_s / r.rows_per_s for i, r in zip(ice, results, strict=False)],
                ".2f",
            )
        )


def print_latency(
    interval: float, rate: float, seconds: float, results: list[LatencyResult]
) -> None:
    print(
        f"\n== produce -> visible, interval {interval:g} s: {rate:,.0f} events/s (half the slower "
        f"system's median rate) for {seconds:g} s =="
    )
    print(
        f"  {'system':14} {'rows':>9} {'snapshots':>9} {'p50 s':>7} {'p99 s':>7} {'max s':>7}"
        "  (snapshot timestamp p50 / p99)"
    )
    for r in results:
        print(
            f"  {r.label:14} {r.sent:9,} {r.snapshots:9} {pct(r.seen, 0.5):7.2f} "
            f"{pct(r.seen, 0.99):7.2f} "
            f"{max(r.seen):7.2f}  ({pct(r.stamped, 0.5):.2f} / {pct(r.stamped, 0.99):.2f})"
        )


# ------------------------------------------------------------------ main


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--intervals", default="1,60", help="commit intervals, seconds")
    parser.add_argument("--latency-intervals", default="1", help="'' for none")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--spark", action="store_true", help="a Spark GROUP BY per table")
    parser.add_argument("--connect-tasks", type=int, default=1, help="the sink's tasks.max")
    parser.add_argument("--no-floors", action="store_true", help="skip the ceiling and pipes")
    parser.add_argument("--exactly-once", action="store_true", help="the kill -9 runs only")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the daemon's first run")
    args = parser.parse_args()
    intervals = [float(x) for x in args.intervals.split(",") if x]
    latency_intervals = [float(x) for x in args.latency_intervals.split(",") if x]
    began = time.perf_counter()
    print(
        f"cores: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.1f}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    built = await asyncio.to_thread(ensure_plugin)
    print(
        f"Iceberg {ICEBERG_VERSION} Kafka Connect sink: "
        + ("plugin folder cached" if built is None else f"plugin folder built in {built:.1f} s")
    )
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-vs-connect-", dir=args.dir))
    database = create_database("vs_connect")
    broker = KafkaBroker.start(directory / "kafka")
    assert broker.process is not None
    try:
        setup = Setup(directory, broker, database, args)
        print(
            f"Apache Kafka on {broker.bootstrap} (started in {broker.started_in:.1f}s); "
            f"disk {directory}"
        )
        await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        seconds = await produce_topic(broker.bootstrap, TOPIC, args.events)
        sample = ndjson_body(1000, 0).split(b"\n")[:-1]
        size = sum(map(len, sample)) / len(sample)
        print(
            f"topic {TOPIC!r}: {PARTITIONS} partitions, {args.events:,} events of {size:.0f} B "
            f"produced in {seconds:.1f}s",
            flush=True,
        )
        if args.exactly_once:
            await exactly_once(setup, intervals[0], args)
        else:
            await compare(setup, intervals, latency_intervals, args)
    finally:
        broker.stop()
        drop_database(database)
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"\nbench took {time.perf_counter() - began:.0f}s; "
        f"load average now {os.getloadavg()[0]:.1f}"
    )
    return 0


async def compare(
    setup: Setup, intervals: list[float], latency_intervals: list[float], args: Any
) -> None:
    broker, total = setup.broker, args.events
    pid = broker.process.pid if broker.process else 0
    results: dict[float, dict[str, list[Throughput]]] = {}
    ceilings: dict[str, list[Run]] = {
        "Kafka ConsumerPerformance (ceiling)": [],
        "bare aiokafka pipe (floor)": [],
        "bare librdkafka pipe (floor)": [],
    }
    for n, interval in enumerate(intervals):
        results[interval] = {SINK: [], ICE: []}
        for run in range(args.runs):
            print(
                f"\ninterval {interval:g} s, run {run + 1} (load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            if n == 0 and not args.no_floors:
                perf = await asyncio.to_thread(
                    consumer_performance, broker.bootstrap, total, f"perf-{run}"
                )
                ceilings["Kafka ConsumerPerformance (ceiling)"].append(perf)
                print(
                    f"  ConsumerPerformance {perf.rows_per_s:,.0f} rows/s; {perf.note}", flush=True
                )
                bare = await bare_pipe(broker.bootstrap, TOPIC, total, f"bare-{run}", pid)
                ceilings["bare aiokafka pipe (floor)"].append(bare)
                print(f"  bare aiokafka pipe {bare.rows_per_s:,.0f} rows/s", flush=True)
                librd = await asyncio.to_thread(
                    librdkafka_pipe, broker.bootstrap, TOPIC, total, f"librd-{run}", pid
                )
                if librd is not None:
                    ceilings["bare librdkafka pipe (floor)"].append(librd)
                    print(f"  bare librdkafka pipe {librd.rows_per_s:,.0f} rows/s", flush=True)
            order = [SINK, ICE] if run % 2 == 0 else [ICE, SINK]
            for system in order:
                short = "sink" if system == SINK else "ice"
                tag = f"{short}-{interval:g}s-r{run}"
                table = f"bench.{short}_{interval:g}s_r{run}"
                profile = None
                if args.profile and system == ICE and run == 0 and n == 0:
                    profile = Path(args.profile)
                result = await asyncio.to_thread(
                    throughput_run,
                    setup.make(system, interval),
                    setup.config.catalog,
                    table,
                    TOPIC,
                    tag,
                    total,
                    1800.0,
                    profile,
                )
                results[interval][system].append(result)
                setup.tables[(system, interval)] = table
                print(
                    f"  {system}: {result.rows_per_s:,.0f} rows/s in {result.seconds:.1f}s "
                    f"(start-up {result.startup:.1f}s not timed); {result.cpu_per_million:.2f} "
                    f"CPU-s per million rows; peak RSS {mib(result.peak_rss_kib)}; "
                    f"{result.report.text()}",
                    flush=True,
                )
                if result.report.duplicates or result.report.missing or result.report.rows != total:
                    print(
                        f"  !! {system}: the table does not hold each event exactly once",
                        flush=True,
                    )
        print_interval(interval, results[interval], ceilings if n == 0 else {})

    for interval in latency_intervals:
        measured = results.get(interval, {})
        if not all(measured.get(s) for s in (SINK, ICE)):
            print(f"\nno throughput runs at {interval:g} s: no latency run there")
            continue
        rate = round(min(median(r.rows_per_s for r in measured[s]) for s in (SINK, ICE)) / 2)
        latencies: list[LatencyResult] = []
        for system in (SINK, ICE):
            short = "sink" if system == SINK else "ice"
            topic = f"live-{short}-{interval:g}s"
            await create_topic(broker.bootstrap, topic, PARTITIONS)
            latencies.append(
                await asyncio.to_thread(
                    latency_run,
                    setup.make(system, interval),
                    setup.config,
                    f"bench.live_{short}_{interval:g}s",
                    topic,
                    f"live-{short}-{interval:g}s",
                    rate,
                    args.latency_seconds,
                    broker.bootstrap,
                    interval,
                )
            )
        print_latency(interval, rate, args.latency_seconds, latencies)

    if args.spark:
        print("\n== Spark (local[2]) over each system's last table ==", flush=True)
        for line in await asyncio.to_thread(spark_group_by, setup):
            print(line)


async def exactly_once(setup: Setup, interval: float, args: Any) -> None:
    outcomes: list[KillRun] = []
    for system in (SINK, ICE):
        short = "sink" if system == SINK else "ice"
        tag = f"eo-{short}"
        print(
            f"\n{system}: kill -9 {args.kills} times mid-stream (interval {interval:g} s)",
            flush=True,
        )
        outcome = await asyncio.to_thread(
            kill_run,
            setup.make(system, interval),
            setup.config.catalog,
            f"bench.eo_{short}",
            TOPIC,
            tag,
            args.events,
            args.kills,
            interval,
            max(10.0, 3 * interval),
        )
        outcomes.append(outcome)
        print("  " + "; ".join(outcome.kills), flush=True)
    print(
        f"\n== exactly once: {args.events:,} events, kill -9 {args.kills} times, interval "
        f"{interval:g} s (sink: Iceberg {ICEBERG_VERSION}) =="
    )
    for outcome in outcomes:
        assert outcome.report is not None
        r = outcome.report
        print(
            f"  {outcome.label:14} rows {r.rows:,}, duplicates {r.duplicates:,}, missing "
            f"{r.missing:,} ({outcome.settled}; {outcome.seconds:.0f} s)"
        )


if __name__ == "__main__":
    run_main(main, "the systems, the broker")
