"""The key index of an upsert table (`icespool.cdc.KeyIndex`) at 100,000 and 10,000,000
keys: its memory and disk per key, how long a build from the table takes, and what a
commit asks of it (locate the keys it changes; take its changes).

    python tests/bench/bench_key_index.py [--keys 100000 10000000] [--cache-mib 64]
        [--file-rows 1000000]

Per size: a local SQLite catalog and warehouse; a table (``id`` long key, ``score`` long,
``city`` string) of ``--keys`` rows appended with pyiceberg in data files of
``--file-rows``; then, in a child process of its own (so its memory is the index's):

1. the build: `KeyIndex.sync` from the table's data files (seconds, the child's peak
   RSS beside its RSS before the build: the page cache is ``--cache-mib``, the rest is
   the Parquet reads of one file's key column at a time), the index file's size per key;
2. locate: 2,000 random keys (a 1 s commit at 2,000 changes/s), 50 times, p50 / p99;
3. take a commit: those keys' rows moved to a new data file (`KeyIndex.committed`),
   p50 / p99 over 20 commits.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "score", LongType(), required=False),
    NestedField(3, "city", StringType(), required=False),
    identifier_field_ids=[1],
)


def _catalog(directory: Path) -> SqlCatalog:
    return SqlCatalog(
        "bench",
        uri=f"sqlite:///{directory / 'catalog.db'}",
        warehouse=(directory / "warehouse").as_uri(),
    )


def make_table(directory: Path, keys: int, file_rows: int) -> None:
    catalog = _catalog(directory)
    catalog.create_namespace("b")
    table = catalog.create_table("b.t", SCHEMA, properties={"format-version": "2"})
    cities = pa.array([f"city-{i:02d}" for i in range(50)])
    arrow = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("score", pa.int64()),
            pa.field("city", pa.string()),
        ]
    )
    for start in range(0, keys, file_rows):
        ids = np.arange(start, min(keys, start + file_rows), dtype=np.int64)
        city = cities.take(pa.array(ids % 50))
        table.append(pa.table({"id": ids, "score": ids * 7, "city": city}, schema=arrow))


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def measure(directory: Path, cache_mib: int, keys: int) -> dict[str, Any]:
    """The child's part: build, locate, take commits; figures as a dict."""
    from icespool.cdc import Change, KeyIndex, NewFile, key_values

    table = _catalog(directory).load_table("b.t")
    rss_before = _rss_kib()
    index = KeyIndex(directory / "index.sqlite3", [1], cache_bytes=cache_mib * 2**20)
    began = time.perf_counter()
    index.sync(table)
    build = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rng = random.Random(34)
    locate_ms: list[float] = []
    for _ in range(50):
        wanted = key_values([pa.array(rng.sample(range(keys), 2000), pa.int64())])
        began = time.perf_counter()
        located = index.locate(wanted)
        locate_ms.append((time.perf_counter() - began) * 1000)
        assert located.rows == 2000, located.rows
    commit_ms: list[float] = []
    template = next(iter(located.files.values())).file
    snapshot = index.snapshot_id
    for n in range(20):
        wanted_keys = rng.sample(range(keys), 2000)
        values = key_values([pa.array(wanted_keys, pa.int64())])
        located = index.locate(values)
        new_file = _data_file_like(template, f"{directory}/new-{n}.parquet", len(values))
        change = Change(located, [NewFile(new_file, 0, values)])
        began = time.perf_counter()
        assert index.committed(10_000 + n, snapshot, 10_000 + n, change, {0: True})
        commit_ms.append((time.perf_counter() - began) * 1000)
        snapshot = 10_000 + n
    assert index.rows() == keys, index.rows()
    disk = index.disk_bytes()
    index.close()
    return {
        "build_s": build,
        "rss_before_kib": rss_before,
        "peak_kib": peak,
        "disk_bytes": disk,
        "locate_ms": locate_ms,
        "commit_ms": commit_ms,
    }


def _data_file_like(template: Any, path: str, rows: int) -> Any:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=template.partition,
        record_count=rows,
        file_size_in_bytes=template.file_size_in_bytes,
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 10_000_000])
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--file-rows", type=int, default=1_000_000)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.cache_mib, args.keys[0])))
        return 0
    print(f"key index, page cache {args.cache_mib} MiB (the key_index_memory default: 64 MiB)")
    for keys in args.keys:
        with tempfile.TemporaryDirectory(prefix="bench-key-index-") as tmp:
            directory = Path(tmp)
            began = time.perf_counter()
            make_table(directory, keys, args.file_rows)
            made = time.perf_counter() - began
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(directory),
                    "--keys",
                    str(keys),
                    "--cache-mib",
                    str(args.cache_mib),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
        grown = (got["peak_kib"] - got["rss_before_kib"]) * 1024
        locate, commit = got["locate_ms"], got["commit_ms"]
        print(
            f"{keys:>12,} keys (table written in {made:.0f} s): build {got['build_s']:.1f} s "
            f"({keys / got['build_s']:,.0f} keys/s); memory: peak RSS "
            f"{got['peak_kib'] / 1024:.0f} MiB, {grown / 2**20:.0f} MiB over the process "
            f"before the build ({grown / keys:.1f} B/key); disk "
            f"{got['disk_bytes'] / 2**20:.0f} MiB ({got['disk_bytes'] / keys:.0f} B/key); "
            f"locate 2,000 keys p50 {statistics.median(locate):.1f} ms p99 "
            f"{_quantile(locate, 0.99):.1f} ms; take a commit of 2,000 changed keys p50 "
            f"{statistics.median(commit):.1f} ms p99 {_quantile(commit, 0.99):.1f} ms",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
