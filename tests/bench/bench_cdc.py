"""Keyed changes into Iceberg: icespool (HTTP ``POST /changes``) vs pyiceberg
``table.upsert()``, on the same machine in one run; Spark's read of the merged table
before and after compaction.

    python tests/bench/bench_cdc.py [--changes 1000000] [--keys 100000] [--batch 50000]
                                    [--pyiceberg-budget 600]
    python tests/bench/bench_cdc.py --live [--keys 100000] [--rate 2000] [--deletes 0.3]
        [--live-seconds 60] [--live-changes 2000000] [--baseline-tree PATH]

``--live`` measures only the write side at a 1 s commit cadence: position deletes beside
the equality-delete path (tests/bench/_cdc_live.py says how). Without it:

1. A deterministic stream of ``--changes`` changes over ``--keys`` ids (85 % upserts of a
   4-column row, 15 % deletes), cut into batches of ``--batch`` changes.
2. icespool: an in-process daemon (`Icespool` + its real HTTP server) with upsert tables
   (``key = ["id"]``); each batch is one NDJSON ``POST /v1/tables/{t}/changes`` body.
   Twice: (a) with ``POST /flush`` after each, so every batch is one Iceberg commit (data
   files + equality deletes), the baseline's commit granularity; (b) the table's own
   policy (a commit per 500,000 changes). Timed from the first request to the last
   commit, then Spark's ``count(*)`` of the merged table (Spark warmed up on a small
   upsert table first, so no cold JVM is charged to either side).
3. pyiceberg 0.12: per batch, the last change per key (upsert() refuses duplicate keys in
   its input), ``table.delete(In("id", deleted))`` then ``table.upsert(rows)``: its
   copy-on-write delete + overwrite. Runs batches until ``--pyiceberg-budget`` seconds are
   spent; when that is before the end, the rate is measured ON THAT PREFIX and printed as
   such (the baseline's per-batch cost grows with the table, so a prefix rate flatters it).
4. Both final tables are checked against the state computed from the changes (Spark
   reads icespool's merged table; pyiceberg's over its prefix).
5. Spark reads icespool's merged table (noop sink, best of 3) before and after
   ``rewrite_data_files`` (delete-file-threshold 1) + ``rewrite_position_delete_files``.
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

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import In
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cdc_live import live
from _spark import BENCH_CONF

from icespool.config import Config, validate_config
from icespool.http import start_http
from icespool.lifecycle.service import Icespool
from icespool.spark.conf import RUNTIME_DIR_ENV
from icespool.spark.session import spark_session

REPO = Path(__file__).resolve().parents[2]
CATALOG = "bench_cdc"
ICE = "cdc.items"
ICE_BATCHED = "cdc.items_batched"
WARM = "cdc.warm_up"
BASE = "cdc.items_pyiceberg"
COLUMNS = ["id", "name", "qty", "note"]
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "qty", "type": "long"},
    {"name": "note", "type": "string"},
]
DELETE_SHARE = 0.15


def stream(changes: int, keys: int, seed: int = 16) -> pa.Table:
    """The changes: id, name, qty (= the change's position), note, and op (0 upsert,
    1 delete), vectorized."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, changes, dtype=np.int64)
    ops = (rng.random(changes) < DELETE_SHARE).astype(np.int8)
    position = np.arange(changes, dtype=np.int64)
    name = pc.binary_join_element_wise(
        "item-",
        pc.cast(pa.array(ids), pa.string()),
        "-",
        pc.cast(pa.array(position), pa.string()),
        "",
    )
    note = pc.if_else(
        pa.array(position % 5 == 0),
        pa.nulls(changes, pa.string()),
        pa.array(np.char.mod("n%d", position % 97)),
    )
    return pa.table({"id": ids, "name": name, "qty": position, "note": note, "op": ops})


def last_per_key(changes: pa.Table) -> pa.Table:
    """The last change of each key (vectorized: the first row of each key in reverse)."""
    reverse = changes.take(pa.array(np.arange(changes.num_rows - 1, -1, -1)))
    _, first = np.unique(reverse.column("id").to_numpy(), return_index=True)
    return reverse.take(pa.array(first))


def final_state(changes: pa.Table) -> dict[int, tuple[Any, ...]]:
    last = last_per_key(changes)
    alive = last.filter(pc.equal(last.column("op"), 0))
    rows = zip(*(alive.column(c).to_pylist() for c in COLUMNS), strict=True)
    return {row[0]: row for row in rows}


def ndjson(batch: pa.Table) -> bytes:
    ops = np.where(batch.column("op").to_numpy() == 1, "delete", "upsert")
    lines = []
    for i, name, qty, note, op in zip(
        batch.column("id").to_pylist(),
        batch.column("name").to_pylist(),
        batch.column("qty").to_pylist(),
        batch.column("note").to_pylist(),
        ops,
        strict=True,
    ):
        if op == "delete":
            lines.append(f'{{"id":{i},"_op":"delete"}}')
        else:
            shown = "null" if note is None else f'"{note}"'
            lines.append(f'{{"id":{i},"name":"{name}","qty":{qty},"note":{shown},"_op":"upsert"}}')
    return ("\n".join(lines) + "\n").encode()


async def icespool_run(
    config: Config, bodies: list[bytes], table: str, *, flush_each: bool
) -> tuple[float, int]:
    """POST every body to /changes of ``table``; with ``flush_each`` a flush after each
    (one commit per batch), else the table's own policy (max_batch_records) and one
    flush at the end. Returns (seconds until the last commit, commits)."""
    service = Icespool(config)
    await service.start()
    http = await start_http(service, "127.0.0.1", 0, max_body_bytes=256 << 20)
    base = f"http://127.0.0.1:{http.port}/v1/tables/{table}"
    try:
        async with aiohttp.ClientSession() as session:
            began = time.perf_counter()
            for body in bodies:
                async with session.post(
                    f"{base}/changes", data=body, headers={"Content-Type": "application/x-ndjson"}
                ) as reply:
                    assert reply.status == 200, await reply.text()
                if flush_each:
                    async with session.post(f"{base}/flush") as reply:
                        assert reply.status == 200, await reply.text()
            async with session.post(f"{base}/flush") as reply:
                assert reply.status == 200, await reply.text()
            seconds = time.perf_counter() - began
    finally:
        await http.stop()
        await service.stop()
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    commits = len(catalog.load_table(table).metadata.snapshots)
    catalog.engine.dispose()  # type: ignore[attr-defined]
    return seconds, commits


def pyiceberg_run(config: Config, batches: list[pa.Table], budget: float) -> tuple[float, int]:
    """The baseline: delete + upsert per batch until ``budget`` s; (seconds, batches done)."""
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "qty", LongType()),
        NestedField(4, "note", StringType()),
        identifier_field_ids=[1],
    )
    table = catalog.create_table(BASE, schema, properties={"format-version": "2"})
    arrow_schema = schema.as_arrow()
    began = time.perf_counter()
    done = 0
    for batch in batches:
        last = last_per_key(batch)
        deleted = last.filter(pc.equal(last.column("op"), 1)).column("id").to_pylist()
        upserts = last.filter(pc.equal(last.column("op"), 0)).select(COLUMNS).cast(arrow_schema)
        if deleted:
            table.delete(In("id", deleted))
        table.upsert(upserts, join_cols=["id"])
        done += 1
        elapsed = time.perf_counter() - began
        print(f"  pyiceberg batch {done}: {elapsed:.1f} s so far", flush=True)
        if elapsed > budget:
            break
    seconds = time.perf_counter() - began
    catalog.engine.dispose()  # type: ignore[attr-defined]
    return seconds, done


def read_seconds(spark: Any, table: str, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        spark.sql(f"SELECT * FROM {table}").write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - began)
    return best


def files(spark: Any, table: str) -> str:
    """The live files of ``table`` by content (0 data, 1 position deletes, 2 equality)."""
    counts = dict.fromkeys((0, 1, 2), 0)
    for row in spark.sql(f"SELECT content, count(*) FROM {table}.files GROUP BY content").collect():
        counts[row[0]] = row[1]
    return (
        f"{counts[0]} data files, {counts[2]} equality-delete files, "
        f"{counts[1]} position-delete files"
    )


def check(got: list[tuple[Any, ...]], expected: dict[int, tuple[Any, ...]], what: str) -> None:
    rows = {row[0]: row for row in got}
    assert len(rows) == len(got), f"{what}: a key twice"
    assert rows == expected, (
        f"{what}: {len(rows)} rows, {len(expected)} expected; "
        f"{len(rows.keys() ^ expected.keys())} keys differ"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--pyiceberg-budget", type=float, default=600.0)
    parser.add_argument(
        "--live",
        action="store_true",
        help="only the write side at a 1 s cadence, position beside equality deletes",
    )
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--deletes", type=float, default=0.3)
    parser.add_argument("--live-seconds", type=float, default=60.0)
    parser.add_argument("--live-changes", type=int, default=2_000_000)
    parser.add_argument("--baseline-tree", type=Path, default=None)
    args = parser.parse_args()
    if args.live:
        return asyncio.run(live(args))
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")

    changes = stream(args.changes, args.keys)
    batches = [changes.slice(i, args.batch) for i in range(0, args.changes, args.batch)]
    bodies = [ndjson(b) for b in batches]
    expected = final_state(changes)
    print(
        f"{args.changes:,} changes over {args.keys:,} keys in {len(batches)} batches of "
        f"{args.batch:,} ({sum(map(len, bodies)) / 2**20:.0f} MiB of NDJSON); "
        f"{len(expected):,} rows in the final state"
    )

    with tempfile.TemporaryDirectory(prefix="icespool-bench-cdc-") as tmp:
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
                "http": {"listen": "127.0.0.1:0"},
                "defaults": {"batch_timeout": "600s", "max_batch_records": 2_000_000},
                "tables": [
                    {"name": ICE, "create": True, "key": ["id"], "schema": SCHEMA},
                    {
                        "name": ICE_BATCHED,
                        "create": True,
                        "key": ["id"],
                        "schema": SCHEMA,
                        "max_batch_records": 500_000,
                    },
                    {"name": WARM, "create": True, "key": ["id"], "schema": SCHEMA},
                ],
            }
        )
        spark = spark_session(
            config,
            runtime_dir=runtime,
            app_name="icespool-bench-cdc",
            master="local[2]",
            conf={
                **BENCH_CONF,
                "spark.sql.adaptive.enabled": "false",
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            # Spark's JVM, catalog and Iceberg's delete-applying read path warmed on a
            # small table first: the timed counts below are not charged a cold start.
            asyncio.run(icespool_run(config, bodies[:2], WARM, flush_each=True))
            spark.sql(f"SELECT count(*) FROM {CATALOG}.{WARM}").collect()

            ice = f"{CATALOG}.{ICE}"
            rates: dict[str, tuple[float, float]] = {}
            for table, flush_each, label in (
                (ICE, True, "flush after every batch: one commit per batch"),
                (ICE_BATCHED, False, "the table's own policy: a commit per 500,000 changes"),
            ):
                seconds, commits = asyncio.run(
                    icespool_run(config, bodies, table, flush_each=flush_each)
                )
                began = time.perf_counter()
                count = spark.sql(f"SELECT count(*) FROM {CATALOG}.{table}").first()[0]
                counted = time.perf_counter() - began
                assert count == len(expected), (count, len(expected))
                rates[table] = (args.changes / seconds, args.changes / (seconds + counted))
                print(
                    f"icespool HTTP /changes ({label}): {args.changes:,} changes in {commits} "
                    f"commits in {seconds:.1f} s ({rates[table][0]:,.0f} changes/s); Spark's "
                    f"count(*) of the merged table {counted:.1f} s; committed and visible in "
                    f"Spark: {seconds + counted:.1f} s ({rates[table][1]:,.0f} changes/s)"
                )
                got = [
                    tuple(r)
                    for r in spark.sql(
                        f"SELECT {', '.join(COLUMNS)} FROM {CATALOG}.{table}"
                    ).collect()
                ]
                check(got, expected, f"{table} through Spark")

            base_seconds, done = pyiceberg_run(config, batches, args.pyiceberg_budget)
            base_changes = done * args.batch
            prefix = changes.slice(0, base_changes)
            began = time.perf_counter()
            spark.sql(f"SELECT count(*) FROM {CATALOG}.{BASE}").collect()
            base_counted = time.perf_counter() - began
            base_got = [
                tuple(r)
                for r in spark.sql(f"SELECT {', '.join(COLUMNS)} FROM {CATALOG}.{BASE}").collect()
            ]
            check(base_got, final_state(prefix), "pyiceberg's table through Spark")
            base = (base_changes / base_seconds, base_changes / (base_seconds + base_counted))
            scope = (
                "all of them"
                if base_changes >= args.changes
                else f"MEASURED ON A PREFIX of {base_changes:,} changes ({done} of "
                f"{len(batches)} batches; budget {args.pyiceberg_budget:.0f} s), the rest not run"
            )
            print(
                f"pyiceberg 0.12 delete()+upsert() per batch of {args.batch:,}: "
                f"{base_changes:,} changes committed in {base_seconds:.1f} s "
                f"({base[0]:,.0f} changes/s; {scope}); Spark's count(*) {base_counted:.1f} s; "
                f"committed and visible: {base[1]:,.0f} changes/s"
            )
            for table, (committed, visible) in rates.items():
                print(
                    f"ratio {table} / pyiceberg: committed {committed / base[0]:,.1f}x, "
                    f"committed and visible in Spark {visible / base[1]:,.1f}x (target >= 20x)"
                )

            batched = f"{CATALOG}.{ICE_BATCHED}"
            print(
                f"\nSpark read of {batched} ({files(spark, batched)}): "
                f"{read_seconds(spark, batched):.2f} s (best of 3, all columns, noop sink)"
            )
            print(f"Spark read of {ice} ({files(spark, ice)}):")
            before = read_seconds(spark, ice)
            print(f"  before compaction: {before:.2f} s (best of 3, all columns, noop sink)")
            began = time.perf_counter()
            rewritten = spark.sql(
                f"CALL {CATALOG}.system.rewrite_data_files(table => '{ICE}', options => "
                "map('delete-file-threshold', '1', 'min-input-files', '1', "
                "'remove-dangling-deletes', 'true'))"
            ).first()
            spark.sql(
                f"CALL {CATALOG}.system.rewrite_position_delete_files(table => '{ICE}', "
                "options => map('rewrite-all', 'true'))"
            ).collect()
            print(
                f"  Spark compaction: {rewritten.rewritten_data_files_count} data files -> "
                f"{rewritten.added_data_files_count} in {time.perf_counter() - began:.1f} s"
            )
            after = read_seconds(spark, ice)
            print(
                f"  after compaction ({files(spark, ice)}): {after:.2f} s "
                f"(before / after: {before / after:.1f}x)"
            )
            got = [tuple(r) for r in spark.sql(f"SELECT {', '.join(COLUMNS)} FROM {ice}").collect()]
            check(got, expected, "icespool's table after compaction")
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
