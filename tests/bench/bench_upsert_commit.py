"""Upsert-table commits beside append commits of the same rows, and beside pyiceberg's
copy-on-write ``table.upsert`` (issue 16), measured in one run.

Run: .venv/bin/python tests/bench/bench_upsert_commit.py [--changes N] [--keys K]
         [--batches B] [--pyiceberg-changes M]

  A. In-process `Icespool`: N changes (30 % deletes) over K keys appended to an upsert
     table in B batches, then ONE flush (last change per key, data files + equality
     deletes, one snapshot); beside the same N rows appended to an append table and
     flushed. Prints changes/s committed and the ratio.
  B. M changes over K/10 keys in batches of M/10: icespool (append + flush per batch)
     beside pyiceberg ``table.upsert`` per batch (same SQLite catalog), both ending in the
     same merged state (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from icespool.cdc import DELETE, UPSERT, read_merged, with_ops
from icespool.config import embedded_default, validate_config
from icespool.iceberg._catalog import load_catalog
from icespool.lifecycle.service import Icespool

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
    {"name": "city", "type": "string"},
]


def changes(count: int, keys: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, count, dtype=np.int64)
    ops = np.where(rng.random(count) < 0.3, DELETE, UPSERT).astype(np.int8)
    table = pa.table(
        {
            "id": ids,
            "name": pa.array(np.char.add("n", np.arange(count).astype(str))),
            "score": rng.integers(0, 10**6, count),
            "city": pa.array(np.array(["Oslo", "Lima", "Pune", "Kyiv"])[ids % 4]),
        }
    )
    return table, ops


def config(root: Path, key: bool) -> Any:
    raw = embedded_default(root / "data")
    raw["http"] = {"listen": "127.0.0.1:0"}
    raw["defaults"] = {"max_batch_records": 50_000_000, "max_batch_bytes": "4GiB"}
    table: dict[str, Any] = {"name": "b.t", "create": True, "schema": SCHEMA}
    if key:
        table["key"] = ["id"]
    raw["tables"] = [table]
    return validate_config(raw)


async def flush_all(root: Path, key: bool, batches: list[pa.Table | pa.RecordBatch]) -> float:
    service = Icespool(config(root, key))
    await service.start()
    try:
        writer = service.writer("b.t")
        for batch in batches:
            await writer.append(batch)
        started = time.perf_counter()
        await writer.flush()
        return time.perf_counter() - started
    finally:
        await service.stop()


async def part_a(args: argparse.Namespace) -> None:
    data, ops = changes(args.changes, args.keys, 1)
    step = args.changes // args.batches
    change_batches = [
        with_ops(data.slice(i, step), pa.array(ops[i : i + step]), ["id"])
        for i in range(0, args.changes, step)
    ]
    plain = [data.slice(i, step) for i in range(0, args.changes, step)]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        append_s = await flush_all(Path(a), False, plain)
        upsert_s = await flush_all(Path(b), True, change_batches)
    print(f"A. {args.changes:,} changes over {args.keys:,} keys, one flush each:")
    print(f"   append table: {append_s:.2f} s ({args.changes / append_s:,.0f} rows/s)")
    print(f"   upsert table: {upsert_s:.2f} s ({args.changes / upsert_s:,.0f} changes/s)")
    print(f"   upsert / append time: {upsert_s / append_s:.2f}x")


async def part_b(args: argparse.Namespace) -> None:
    count, keys = args.pyiceberg_changes, max(1, args.keys // 10)
    data, ops = changes(count, keys, 2)
    step = count // 10
    with tempfile.TemporaryDirectory() as root_text:
        root = Path(root_text)
        cfg = config(root / "ice", True)
        service = Icespool(cfg)
        await service.start()
        started = time.perf_counter()
        try:
            writer = service.writer("b.t")
            for i in range(0, count, step):
                await writer.append(
                    with_ops(data.slice(i, step), pa.array(ops[i : i + step]), ["id"])
                )
                await writer.flush()
            ice_s = time.perf_counter() - started
            ours = read_merged(service.tables.require_catalog().load_table("b.t"))
        finally:
            await service.stop()
        other = config(root / "pyi", True)
        service = Icespool(other)  # creates the table (v2, identifier fields), then leaves
        await service.start()
        await service.stop()
        catalog = load_catalog(other.catalog.name, other.catalog.properties())
        table = catalog.load_table("b.t")
        arrow_schema = table.schema().as_arrow()
        started = time.perf_counter()
        for i in range(0, count, step):
            chunk = data.slice(i, step)
            chunk_ops = ops[i : i + step]
            # pyiceberg has no deletes in upsert(): the batch's last change per key,
            # upserts via upsert(), deletes via delete() (two commits per batch).
            last = {int(k): j for j, k in enumerate(chunk.column("id").to_numpy())}
            idx = np.array(sorted(last.values()))
            ups = idx[chunk_ops[idx] == UPSERT]
            dels = idx[chunk_ops[idx] == DELETE]
            if len(ups):
                table.upsert(chunk.take(ups).cast(arrow_schema), join_cols=["id"])
            if len(dels):
                from pyiceberg.expressions import In

                table.delete(In("id", [int(v) for v in chunk.column("id").take(dels).to_pylist()]))
        pyi_s = time.perf_counter() - started
        theirs = table.scan().to_arrow()
        catalog.engine.dispose()
    same = (
        ours.sort_by("id")
        .select(["id", "name"])
        .equals(
            theirs.sort_by("id").select(["id", "name"]).cast(ours.select(["id", "name"]).schema)
        )
    )
    print(f"B. {count:,} changes over {keys:,} keys in 10 batches (commit per batch):")
    print(f"   pyiceberg upsert+delete: {pyi_s:.2f} s ({count / pyi_s:,.0f} changes/s)")
    print(f"   icespool:                {ice_s:.2f} s ({count / ice_s:,.0f} changes/s)")
    print(f"   icespool / pyiceberg speed: {pyi_s / ice_s:.1f}x; same merged state: {same}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--pyiceberg-changes", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(part_a(args))
    asyncio.run(part_b(args))


if __name__ == "__main__":
    main()
