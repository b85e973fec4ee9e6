"""Compaction of the daemon's small files: time for 1,000 files, rewrite MB/s, beside a bare limit.

Run: PYTHONPATH=. .venv/bin/python tests/bench/bench_compaction.py [--files N] [--rows R]
         [--budget BYTES_PER_S] [--dir DIR]

A table (SQLite catalog, local warehouse) gets ``--files`` daemon-written files of
``--rows`` 8-column events each (163-byte JSON events, the write-path benchmark's), all
committed in one snapshot. Then one compaction run: plan, rewrite (unlimited budget, or
``--budget``), commit one replace snapshot. Printed: each step's time, input and output
bytes, rewrite MB/s (input read + output written, per second of rewrite), and the bare
limit measured in the same run on the same files: ``pq.read_table`` of every file and one
``pq.write_table`` (zstd) of the lot, no Iceberg. Every id is checked exactly once after.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (support)

from _events import COLUMNS, decode_body, ndjson_body
from support.maintenance_helpers import live_files, local_path, sql_catalog

from icespool.iceberg import commit_files
from icespool.iceberg._catalog import ensure_table
from icespool.iceberg._parquet import encode_data_files
from icespool.maintenance import IoBudget, commit_rewrite, plan_compaction, rewrite
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema
from icespool.spool import new_uuid7

MB = 1_000_000
TARGET = 128 * 2**20


def _setup(directory: Path, files: int, rows: int) -> tuple[object, int]:
    catalog = sql_catalog(directory)
    schema = parse_schema(COLUMNS)
    table = ensure_table(catalog, "b.events", schema, parse_partition_spec(schema, []), {}, True)
    arrow = arrow_schema_for(table)
    segments, written = [], []
    for n in range(files):
        batch = conform(decode_body(ndjson_body(rows, n)), arrow)
        segment = new_uuid7()
        written += encode_data_files(
            table,
            [batch],
            target_file_size=TARGET,
            row_group_records=2**20,
            compression="zstd",
            file_prefix=segment,
        )
        segments.append(segment)
    commit_files(table, written, segment_ids=segments, summary={})
    return table, sum(f.file_size_in_bytes for f in written)


def _bare_limit(paths: list[str], out: Path) -> float:
    started = time.perf_counter()
    tables = [pq.read_table(local_path(p)) for p in paths]
    pq.write_table(pa.concat_tables(tables), out, compression="zstd")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--budget", type=float, default=None, help="bytes/s (default: none)")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        table, input_bytes = _setup(directory, args.files, args.rows)
        print(
            f"setup: {args.files} files x {args.rows} rows, {input_bytes / MB:.2f} MB, "
            f"{time.perf_counter() - started:.1f} s"
        )
        paths = sorted(live_files(table))  # type: ignore[arg-type]
        bare = _bare_limit(paths, directory / "bare.parquet")

        budget = IoBudget(args.budget)
        t0 = time.perf_counter()
        table.refresh()  # type: ignore[attr-defined]
        (plan,) = plan_compaction(
            table,  # type: ignore[arg-type]
            target_file_size=TARGET,
            max_bytes=1 << 40,
            max_files=args.files,
        )
        t1 = time.perf_counter()
        new = rewrite(  # type: ignore[arg-type]
            table,
            plan,
            budget=budget,
            row_group_records=2**20,
            compression="zstd",
            incarnation="0" * 12,
        )
        t2 = time.perf_counter()
        result = commit_rewrite(table, plan, new)  # type: ignore[arg-type]
        t3 = time.perf_counter()

        out = sum(f.file_size_in_bytes for f in new)
        ids = table.scan(selected_fields=("event_id",)).to_arrow().column("event_id")  # type: ignore[attr-defined]
        assert sorted(ids.to_pylist()) == list(range(args.files * args.rows)), (
            "rows lost or doubled"
        )
        assert result.outcome == "committed"
        print(
            f"plan: {t1 - t0:.3f} s; rewrite: {t2 - t1:.3f} s; commit: {t3 - t2:.3f} s; "
            f"total: {t3 - t0:.2f} s"
        )
        print(
            f"{len(plan.files)} files, {plan.bytes / MB:.2f} MB -> {len(new)} file(s), "
            f"{out / MB:.2f} MB"
        )
        print(
            f"rewrite: {(plan.bytes + out) / MB / (t2 - t1):.1f} MB/s read+written, "
            f"{plan.bytes / MB / (t2 - t1):.1f} MB/s of input, "
            f"{args.files * args.rows / (t2 - t1):,.0f} rows/s"
        )
        print(
            f"bare limit (pq.read_table x {len(paths)} + one pq.write_table): {bare:.3f} s; "
            f"rewrite / bare = {(t2 - t1) / bare:.2f}x the time"
        )
        if args.budget:
            # The bucket starts with one second of credit (burst_seconds=1).
            measured = (budget.used - args.budget) / MB / (t2 - t1)
            print(
                f"budget {args.budget / MB:.2f} MB/s: measured {measured:.2f} MB/s after the burst"
            )


if __name__ == "__main__":
    main()
