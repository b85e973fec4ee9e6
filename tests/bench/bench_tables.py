"""Width: one daemon with thousands of tables (issue 13), beside a few-table baseline.

Run: /work/main/.venv/bin/python tests/bench/bench_tables.py [--tables 1000,10000]
         [--baseline 10] [--modes declared,kafka] [--catalog sqlite|postgres]
         [--rows 10] [--grace 900] [--dir DIR]

Each size runs in a real `icespool run` child (tests/support/daemon_harness), and the
baseline (--baseline tables, default 10) runs first in the same invocation, so every
figure is also given per table: (figure at N - figure at baseline) / (N - baseline).

declared: N `[[tables]]` entries (create = true, `id long, v string`).
  1. first start: creates the N tables, until /readyz answers 200;
  2. RSS and CPU of the idle daemon (3 s after ready, CPU over 5 s);
  3. --rows records POSTed to every table (32 requests in flight), then one
     POST .../flush per table: the time of the flushes is "commit a little into each";
  4. GET /v1/status and GET /metrics: time and size with N tables;
  5. --rows more records into every table (acked, not committed: batch_timeout 1h),
     SIGTERM: the time until the process exits ("drain"), and its exit status;
  6. restart: time to ready loading N existing tables, idle RSS, SIGTERM (idle drain).
kafka: one topic (4 partitions) routed by the field `r` to `k<tag>.{value}` with
  auto_create (max_tables above N): --rows records per route.
  1. start, produce, until every record is committed ("commit a little into each",
     which includes creating the N tables from their first records);
  2. --rows more per route, until all are acked; SIGTERM: the drain;
  3. restart: time to ready with N auto-created tables; SIGTERM.

Every table is then checked through the catalog: its snapshot says 2 x --rows records
(each acked id committed exactly once; ids of a sample of 50 tables read back in full).
Throughout, the daemon's systemd watchdog (NOTIFY_SOCKET, WATCHDOG_USEC = 2 s, a ping
every second from the event loop) is received here: the longest gap between pings is
the longest the event loop was blocked, the STATUS= lines show progress.

10,000 tables on the SQLite catalog take a while (every commit is a write to one
SQLite file); --catalog postgres uses 127.0.0.1:5432 database `test` (trust auth) and
removes its namespaces at the end. Figures are printed; the script does not fail on a
miss (the issue's targets: shutdown within its grace with 1,000 tables, RSS per idle
table measured and bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import itertools

from support.daemon_harness import CATALOG_NAME, NDJSON, Daemon, DaemonDir, ndjson
from support.kafka_harness import Broker, TansuBroker, create_topic, produce_values

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PG_URI = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
WATCHDOG_USEC = 2_000_000
PARTITIONS = 4
HTTP_CONCURRENCY = 32


# ------------------------------------------------------------------ the process


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:13]) / CLOCK_TICKS


class Watchdog:
    """Receives the daemon's notify datagrams: ping gaps and the latest STATUS=."""

    def __init__(self, directory: Path) -> None:
        self.address = str(directory / "notify.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        self._sock.settimeout(0.2)
        self.pings: list[float] = []
        self.status = ""
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            now = time.monotonic()
            for line in data.decode(errors="replace").splitlines():
                if line == "WATCHDOG=1":
                    self.pings.append(now)
                elif line.startswith("STATUS="):
                    self.status = line.removeprefix("STATUS=")

    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}

    def mark(self) -> int:
        return len(self.pings)

    def longest_gap(self, since: int = 0) -> float:
        pings = self.pings[since:]
        return max((b - a for a, b in itertools.pairwise(pings)), default=0.0)

    def figures(self) -> tuple[int, int]:
        """(acked, committed) from a "serving ..." STATUS line (0, 0 otherwise)."""
        words = self.status.replace(",", "").split()
        if not self.status.startswith("serving"):
            return 0, 0
        return int(words[3]), int(words[6])

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._sock.close()


# ------------------------------------------------------------------ results


@dataclass
class Run:
    mode: str
    tables: int
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, key: str, value: float, text: str) -> None:
        self.figures[key] = value
        print(f"  [{self.mode} {self.tables:>6}] {key:<28} {text}", flush=True)


def per_table(big: Run, base: Run, key: str) -> float | None:
    if key not in big.figures or key not in base.figures or big.tables == base.tables:
        return None
    return (big.figures[key] - base.figures[key]) / (big.tables - base.tables)


# ------------------------------------------------------------------ helpers


async def bounded(
    items: Sequence[Any], run: Callable[[Any], Awaitable[Any]], limit: int
) -> list[Any]:
    results: list[Any] = [None] * len(items)
    indexes = iter(range(len(items)))

    async def worker() -> None:
        for i in indexes:
            results[i] = await run(items[i])

    await asyncio.gather(*(worker() for _ in range(min(limit, len(items)))))
    return results


async def post_rows(
    daemon: Daemon, session: aiohttp.ClientSession, tables: Sequence[str], first_id: int, rows: int
) -> None:
    async def post(i: int) -> None:
        start = first_id + i * rows
        body = ndjson({"id": start + k, "v": "x"} for k in range(rows))
        for _ in range(50):
            async with session.post(
                daemon.records_url(tables[i]), data=body, headers={"Content-Type": NDJSON}
            ) as resp:
                text = await resp.text()
                if resp.status == 200:
                    return
                if resp.status != 503:
                    raise RuntimeError(f"{tables[i]}: {resp.status} {text}\n{daemon.tail()}")
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{tables[i]}: still 503 after 50 tries")

    await bounded(list(range(len(tables))), post, HTTP_CONCURRENCY)


async def flush_all(daemon: Daemon, session: aiohttp.ClientSession, tables: Sequence[str]) -> None:
    async def flush(table: str) -> None:
        async with session.post(daemon.flush_url(table)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"flush {table}: {resp.status} {text}")

    await bounded(list(tables), flush, HTTP_CONCURRENCY)


async def timed_get(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.get(url) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {url}: {resp.status}")
    return time.perf_counter() - started, len(body)


async def idle_figures(run: Run, daemon: Daemon, label: str) -> None:
    assert daemon.pid is not None
    await asyncio.sleep(3)
    run.put(f"rss_{label}_mib", rss_mib(daemon.pid), f"{rss_mib(daemon.pid):.0f} MiB")
    before = cpu_seconds(daemon.pid)
    await asyncio.sleep(5)
    share = (cpu_seconds(daemon.pid) - before) / 5
    run.put(f"idle_cpu_{label}", share, f"{share * 100:.1f} % of a core")


async def sigterm(run: Run, daemon: Daemon, dog: Watchdog, label: str, grace: float) -> None:
    mark = dog.mark()
    assert daemon.pid is not None
    pid, cpu_before = daemon.pid, cpu_seconds(daemon.pid)
    cpu_last = cpu_before
    started = time.perf_counter()
    daemon.signal(signal.SIGTERM)
    exiting = asyncio.ensure_future(daemon.wait_exit(grace + 60))
    while not exiting.done():  # the daemon's CPU until it is gone: is the drain CPU-bound?
        with contextlib.suppress(OSError, IndexError):
            cpu_last = cpu_seconds(pid)
        await asyncio.wait({exiting}, timeout=0.1)
    code = exiting.result()
    seconds = time.perf_counter() - started
    cores = (cpu_last - cpu_before) / seconds if seconds else 0.0
    log = daemon.log()
    clean = "stopped cleanly" in log
    run.put(
        f"{label}_s",
        seconds,
        f"{seconds:.1f} s, exit {code}, {'stopped cleanly' if clean else 'NOT clean'}, "
        f"{cores:.2f} cores busy, longest watchdog gap {dog.longest_gap(mark):.1f} s",
    )
    if code != 0 or not clean:
        run.notes.append(f"{label}: exit {code}, clean={clean}")


def verify(
    home: DaemonDir, tables: Sequence[str], rows: int, ids_of: Callable[[int], set[int]]
) -> str:
    """Every table holds exactly 2 x rows records (snapshot summary), and a sample of 50
    tables holds exactly the ids acked into it."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    sample = set(random.Random(7).sample(range(len(tables)), min(50, len(tables))))

    def check(i: int) -> str | None:
        table = catalog.load_table(tables[i])
        snapshot = table.current_snapshot()
        total = int(snapshot.summary["total-records"]) if snapshot and snapshot.summary else 0
        if total != 2 * rows:
            return f"{tables[i]}: {total} records, expected {2 * rows}"
        if i in sample:
            ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
            if sorted(ids) != sorted(ids_of(i)) or len(set(ids)) != len(ids):
                return f"{tables[i]}: ids differ from the acked ones"
        return None

    with ThreadPoolExecutor(8) as pool:
        problems = [p for p in pool.map(check, range(len(tables))) if p]
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
    if problems:
        return f"FAILED ({len(problems)} tables): {'; '.join(problems[:5])}"
    return f"ok: {len(tables)} tables x {2 * rows} records, ids exactly once in 50 sampled"


def drop_namespaces(uri: str, namespaces: Iterable[str]) -> None:
    """PostgreSQL: remove this run's rows from the shared catalog database."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    with engine.begin() as conn:
        for ns in namespaces:
            for table in ("iceberg_tables", "iceberg_namespace_properties"):
                with contextlib.suppress(Exception):
                    conn.execute(
                        sqlalchemy.text(
                            f"DELETE FROM {table} WHERE catalog_name = :c AND table_namespace = :n"
                        ),
                        {"c": CATALOG_NAME, "n": ns},
                    )
    engine.dispose()


def home_for(root: Path, catalog: str) -> DaemonDir:
    return DaemonDir(root, catalog_uri=PG_URI if catalog == "postgres" else None)


def common_extra(grace: float) -> str:
    return f'\n[timeouts]\nshutdown_grace = "{int(grace)}s"\n'


# ------------------------------------------------------------------ declared tables


async def declared(n: int, args: argparse.Namespace, root: Path, namespaces: list[str]) -> Run:
    run = Run("declared", n)
    tag = uuid.uuid4().hex[:6]
    ns = f"w{tag}"
    namespaces.append(ns)
    tables = [f"{ns}.t{i:05d}" for i in range(n)]
    declarations = "".join(
        f'\n[[tables]]\nname = "{t}"\ncreate = true\n'
        'schema = [{ name = "id", type = "long", required = true }, '
        '{ name = "v", type = "string" }]\n'
        for t in tables
    )
    home = home_for(root / f"declared-{n}", args.catalog)
    extra = declarations + common_extra(args.grace)
    home.write_config(batch_timeout="1h", encode_workers=4, extra=extra)
    dog = Watchdog(home.root)
    daemon = Daemon(home)
    rows = args.rows
    try:
        started = time.perf_counter()
        daemon.start(env=dog.env())
        await daemon.wait_ready(within=7200)
        seconds = time.perf_counter() - started
        run.put("ready_create_s", seconds, f"{seconds:.1f} s (first start: creates the tables)")
        await idle_figures(run, daemon, "ready")
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=3600),
            connector=aiohttp.TCPConnector(limit=HTTP_CONCURRENCY),
        ) as session:
            started = time.perf_counter()
            await post_rows(daemon, session, tables, 0, rows)
            seconds = time.perf_counter() - started
            run.put("ingest_s", seconds, f"{seconds:.1f} s ({rows} rows into each table)")
            mark = dog.mark()
            started = time.perf_counter()
            await flush_all(daemon, session, tables)
            seconds = time.perf_counter() - started
            run.put(
                "commit_s",
                seconds,
                f"{seconds:.1f} s (one flush per table; watchdog gap "
                f"{dog.longest_gap(mark):.1f} s)",
            )
            await idle_figures(run, daemon, "committed")
            for route in ("v1/status", "metrics"):
                seconds, size = await timed_get(session, f"{daemon.url}/{route}")
                key = route.replace("v1/", "")
                run.put(
                    f"{key}_ms", seconds * 1000, f"{seconds * 1000:.0f} ms, {size / 1024:.0f} KiB"
                )
            await post_rows(daemon, session, tables, n * rows, rows)
        await sigterm(run, daemon, dog, "drain", args.grace)
        left = len(home.spool_files())
        if left:
            run.notes.append(f"{left} spool files left after the drain")
        # Restart: loading N existing tables.
        started = time.perf_counter()
        daemon.start(env=dog.env())
        await daemon.wait_ready(within=7200)
        seconds = time.perf_counter() - started
        run.put("ready_load_s", seconds, f"{seconds:.1f} s (restart: loads the tables)")
        await idle_figures(run, daemon, "restart")
        await sigterm(run, daemon, dog, "idle_stop", args.grace)
        result = await asyncio.to_thread(
            verify,
            home,
            tables,
            rows,
            lambda i: (
                {i * rows + k for k in range(rows)} | {n * rows + i * rows + k for k in range(rows)}
            ),
        )
        print(f"  [declared {n:>6}] check: {result}", flush=True)
        if not result.startswith("ok"):
            run.notes.append(result)
    finally:
        daemon.cleanup()
        dog.close()
    return run


# ------------------------------------------------------------------ Kafka routing


async def routed(
    n: int, args: argparse.Namespace, root: Path, broker: Broker, namespaces: list[str]
) -> Run:
    run = Run("kafka", n)
    tag = uuid.uuid4().hex[:6]
    ns = f"k{tag}"
    namespaces.append(ns)
    topic = f"width-{tag}"
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    routes = [f"r{i:05d}" for i in range(n)]
    tables = [f"{ns}.{r}" for r in routes]
    rows = args.rows
    home = home_for(root / f"kafka-{n}", args.catalog)
    extra = (
        common_extra(args.grace)
        + f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "width-{tag}"
topics = ["{topic}"]
route_field = "r"
table_template = "{ns}.{{value}}"
auto_create = true
max_tables = {n + 10}
"""
    )
    home.write_config(batch_timeout="5s", encode_workers=4, extra=extra)
    dog = Watchdog(home.root)
    daemon = Daemon(home)

    def values(first: int) -> list[bytes]:
        # Route by route, spread over the partitions by the producer's key hash.
        return [
            json.dumps({"id": first + i * rows + k, "r": routes[i]}).encode()
            for k in range(rows)
            for i in range(n)
        ]

    async def wait_figures(want_acked: int, want_committed: int, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            acked, committed = dog.figures()
            if acked >= want_acked and committed >= want_committed:
                return
            if not daemon.running:
                raise RuntimeError(f"daemon exited\n{daemon.tail()}")
            await asyncio.sleep(0.5)
        raise RuntimeError(f"not there within {within:.0f}s: {dog.status}\n{daemon.tail()}")

    try:
        started = time.perf_counter()
        daemon.start(env=dog.env())
        await daemon.wait_ready(within=600)
        seconds = time.perf_counter() - started
        run.put("ready_empty_s", seconds, f"{seconds:.1f} s (no routed tables yet)")
        mark = dog.mark()
        started = time.perf_counter()
        await produce_values(broker.bootstrap, topic, values(0), linger_ms=20)
        await wait_figures(n * rows, n * rows, 7200)
        seconds = time.perf_counter() - started
        run.put(
            "commit_s",
            seconds,
            f"{seconds:.1f} s (create {n} tables from their records and commit "
            f"{rows} rows into each; watchdog gap {dog.longest_gap(mark):.1f} s)",
        )
        await idle_figures(run, daemon, "committed")
        await produce_values(broker.bootstrap, topic, values(n * rows), linger_ms=20)
        await wait_figures(2 * n * rows, 0, 7200)
        await sigterm(run, daemon, dog, "drain", args.grace)
        started = time.perf_counter()
        daemon.start(env=dog.env())
        await daemon.wait_ready(within=7200)
        seconds = time.perf_counter() - started
        run.put("ready_load_s", seconds, f"{seconds:.1f} s (restart: {n} auto-created tables)")
        await idle_figures(run, daemon, "restart")
        await sigterm(run, daemon, dog, "idle_stop", args.grace)
        result = await asyncio.to_thread(
            verify,
            home,
            tables,
            rows,
            lambda i: (
                {i * rows + k for k in range(rows)} | {n * rows + i * rows + k for k in range(rows)}
            ),
        )
        print(f"  [kafka {n:>6}] check: {result}", flush=True)
        if not result.startswith("ok"):
            run.notes.append(result)
    finally:
        daemon.cleanup()
        dog.close()
    return run


# ------------------------------------------------------------------ main


def report(runs: Sequence[Run], baseline: int) -> None:
    print("\n== per-table figures: (N - baseline) / (N - baseline tables) ==")
    keys = [
        ("ready_create_s", 1000, "ms to create + load at start"),
        ("ready_load_s", 1000, "ms to load at start"),
        ("commit_s", 1000, "ms to commit a little"),
        ("drain_s", 1000, "ms to drain on SIGTERM"),
        ("rss_ready_mib", 1024, "KiB RSS, idle after start"),
        ("rss_committed_mib", 1024, "KiB RSS, idle after commits"),
        ("rss_restart_mib", 1024, "KiB RSS, idle after restart"),
        ("status_ms", 1000, "us per /v1/status"),
        ("metrics_ms", 1000, "us per /metrics"),
    ]
    for mode in ("declared", "kafka"):
        base = next((r for r in runs if r.mode == mode and r.tables == baseline), None)
        if base is None:
            continue
        for run in runs:
            if run.mode != mode or run is base:
                continue
            parts = []
            for key, scale, label in keys:
                value = per_table(run, base, key)
                if value is not None:
                    parts.append(f"{value * scale:.2f} {label}")
            print(f"{mode} {run.tables} vs {base.tables}: " + "; ".join(parts))
            for note in run.notes:
                print(f"  NOTE: {note}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tables", default="1000,10000")
    parser.add_argument("--baseline", type=int, default=10)
    parser.add_argument("--modes", default="declared,kafka")
    parser.add_argument("--catalog", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--grace", type=float, default=900.0)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    sizes = [args.baseline, *(int(x) for x in args.tables.split(",") if x)]
    modes = args.modes.split(",")
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-tables-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"bench_tables: sizes {sizes}, modes {modes}, catalog {args.catalog}, dir {root}")
    namespaces: list[str] = []
    runs: list[Run] = []
    broker = TansuBroker.start(root) if "kafka" in modes else None
    try:
        for n in sizes:
            if "declared" in modes:
                runs.append(await declared(n, args, root, namespaces))
            if "kafka" in modes and broker is not None:
                runs.append(await routed(n, args, root, broker, namespaces))
        report(runs, args.baseline)
    finally:
        if broker is not None:
            broker.stop()
        if args.catalog == "postgres":
            drop_namespaces(PG_URI, namespaces)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
