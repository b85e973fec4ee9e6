"""Commit cost over a table's life: the 10,000th commit costs what the first did (issue 13).

    python tests/bench/bench_longevity.py [--commits 10000] [--baseline-commits 1000]
        [--http-commits 1000] [--keep-snapshots 360] [--expire-every 50] [--dir DIR]

One table (id long, v string; unpartitioned), 10 rows appended and flushed per commit,
SQLite SQL catalog and local warehouse, everything measured in one run:

  A. In-process: the daemon's own path (`Icespool` service -> TableWriter -> spool ->
     encode -> commit_files) in a tight loop of append + flush, ``--commits`` times,
     on a table the daemon created (its default properties: manifest merging, old
     metadata.json removal).
  B. Baseline, the same loop with the old behaviour for ``--baseline-commits``: the
     table declares ``commit.manifest-merge.enabled=false`` (each commit adds one
     manifest, as the fast append did) and
     ``write.metadata.delete-after-commit.enabled=false``, and nothing is expired.
  C. HTTP: a real `icespool run` child process; POST 10 records, POST /flush,
     ``--http-commits`` times.

Snapshot expiry is the daemon's maintenance (another part of issue 13), not the commit
path. Here it is SIMULATED in A and C between flushes: every ``--expire-every`` commits
the daemon's expiry commit keeps the newest ``--keep-snapshots`` snapshots (the
default 360 is what `history.expire.max-snapshot-age-ms` = 6 h keeps at the default
60 s batch_timeout), then the manifests and manifest lists no retained snapshot reaches
are deleted (what maintenance does after expiring). The loop commits far faster than
6 h of age could matter, so the count is what bounds the snapshots here.

Prints, per 1,000 commits: p50/p99 commit latency, live manifests (in the current
snapshot's manifest list), snapshots, the current metadata.json's size and the metadata
directory's total size. At the end: p50 of the first 500 vs the last 500 commits
(target <= 1.3x) and the metadata directory's size (target <= 64 MiB). Latency is the
wall time of one flush (seal, encode, commit, spool delete) as its caller sees it
(C: the ingest POST and the flush POST); CPU is what the committing process spent on
it (all threads), which other load on a shared machine does not inflate.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
from pyiceberg.catalog import Catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir

from icespool.config import validate_config
from icespool.config._sections import embedded_catalog
from icespool.iceberg import commit_expiry, load_catalog
from icespool.lifecycle.service import Icespool

ROWS = 10
REPORT_EVERY = 1_000
WINDOW = 500
OLD_BEHAVIOUR = {
    "commit.manifest-merge.enabled": "false",
    "write.metadata.delete-after-commit.enabled": "false",
}


# ------------------------------------------------------------------ the table's shape


@dataclass
class Shape:
    snapshots: int
    manifests: int
    data_files: int
    metadata_json: int
    metadata_dir: int
    metadata_files: int


def shape(catalog: Catalog, name: str) -> Shape:
    table = catalog.load_table(name)
    snapshot = table.current_snapshot()
    manifests = len(snapshot.manifests(table.io)) if snapshot is not None else 0
    summary = snapshot.summary if snapshot is not None else None
    data_files = int(summary.get("total-data-files") or 0) if summary is not None else 0
    directory = _local(table.metadata_location).parent
    sizes = [entry.stat().st_size for entry in os.scandir(directory) if entry.is_file()]
    return Shape(
        snapshots=len(table.metadata.snapshots),
        manifests=manifests,
        data_files=data_files,
        metadata_json=_local(table.metadata_location).stat().st_size,
        metadata_dir=sum(sizes),
        metadata_files=len(sizes),
    )


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


# ------------------------------------------------------------------ simulated maintenance


@dataclass
class Expirer:
    """Stands in for the daemon's maintenance: expire all but the newest ``keep``
    snapshots, then delete the manifest lists and manifests no retained snapshot
    reaches. Runs between flushes only (the bench never commits concurrently)."""

    catalog: Catalog
    name: str
    keep: int
    # manifest list -> its manifests (immutable files: read each once)
    _lists: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    runs: int = 0

    def run(self) -> None:
        began = time.perf_counter()
        table = self.catalog.load_table(self.name)
        current = table.current_snapshot()
        ordered = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
        old = [s.snapshot_id for s in ordered[: -self.keep] if s is not current]
        if old:
            # The daemon's expiry commit (not pyiceberg's ExpireSnapshots, which
            # deep-copies the metadata once per id).
            commit_expiry(table, lambda _: old)
        reachable: set[str] = set()
        for snapshot in table.metadata.snapshots:
            listed = self._lists.get(snapshot.manifest_list)
            if listed is None:
                listed = [m.manifest_path for m in snapshot.manifests(table.io)]
                self._lists[snapshot.manifest_list] = listed
            reachable.add(snapshot.manifest_list)
            reachable.update(listed)
        directory = _local(table.metadata_location).parent
        for entry in os.scandir(directory):
            uri = f"file://{entry.path}"
            if entry.name.endswith(".avro") and uri not in reachable:
                os.unlink(entry.path)
                self._lists.pop(uri, None)
        self.seconds += time.perf_counter() - began
        self.runs += 1


# ------------------------------------------------------------------ the loops


@dataclass
class Run:
    label: str
    latencies: list[float] = field(default_factory=list)
    # CPU seconds the committing process spent per commit: what a commit costs,
    # independent of other work on the machine (wall time also counts waiting for it).
    cpu: list[float] = field(default_factory=list)
    shapes: list[tuple[int, Shape]] = field(default_factory=list)
    seconds: float = 0.0
    expiry: Expirer | None = None

    def p50(self, part: list[float]) -> float:
        return statistics.median(part) * 1000

    def ratio(self, values: list[float]) -> tuple[float, float, float]:
        first = self.p50(values[:WINDOW])
        last = self.p50(values[-WINDOW:])
        return first, last, last / first


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _report(run: Run, catalog: Catalog, name: str, done: int, header: bool) -> None:
    current = shape(catalog, name)
    run.shapes.append((done, current))
    window = run.latencies[-REPORT_EVERY:]
    cpu = run.p50(run.cpu[-REPORT_EVERY:])
    if header:
        print(
            f"  {'commits':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu p50':>8} "
            f"{'manifests':>9} "
            f"{'snapshots':>9} {'data files':>10} {'meta.json KB':>12} {'metadata MiB':>12} "
            f"{'files':>6}"
        )
    print(
        f"  {done:>7} {run.p50(window):>8.1f} {_quantile(window, 0.99):>8.1f} "
        f"{max(window) * 1000:>8.1f} {cpu:>8.1f} {current.manifests:>9} {current.snapshots:>9} "
        f"{current.data_files:>10} {current.metadata_json / 1024:>12.1f} "
        f"{current.metadata_dir / 2**20:>12.2f} {current.metadata_files:>6}",
        flush=True,
    )


async def loop(
    run: Run,
    commits: int,
    commit: Callable[[int], Awaitable[None]],
    cpu_clock: Callable[[], float],
    catalog: Catalog,
    name: str,
    expirer: Expirer | None,
    expire_every: int,
    report_every: int = REPORT_EVERY,
) -> None:
    run.expiry = expirer
    began = time.perf_counter()
    for n in range(commits):
        cpu = cpu_clock()
        started = time.perf_counter()
        await commit(n)
        run.latencies.append(time.perf_counter() - started)
        run.cpu.append(cpu_clock() - cpu)
        done = n + 1
        if expirer is not None and done % expire_every == 0:
            await asyncio.to_thread(expirer.run)
        if done % report_every == 0 or done == commits:
            _report(run, catalog, name, done, header=len(run.shapes) == 0)
    run.seconds = time.perf_counter() - began


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has run, all its live threads, ns resolution."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            with open(f"{task.path}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return total / 1e9


def _batch(n: int) -> pa.Table:
    ids = pa.array(range(n * ROWS, (n + 1) * ROWS), pa.int64())
    return pa.table({"id": ids, "v": pa.array([f"r{n}"] * ROWS, pa.string())})


def in_process_config(directory: Path, properties: dict[str, str]) -> Any:
    raw = {
        "catalog": embedded_catalog(directory),
        "spool": {"dir": str(directory / "spool")},
        "http": {"listen": "127.0.0.1:0"},
        "tables": [
            {
                "name": "bench.t",
                "create": True,
                "batch_timeout": "1h",
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "v", "type": "string"},
                ],
                "properties": properties,
            }
        ],
    }
    return validate_config(raw)


async def in_process(
    label: str,
    directory: Path,
    commits: int,
    properties: dict[str, str],
    keep: int | None,
    expire_every: int,
) -> Run:
    config = in_process_config(directory, properties)
    run = Run(label)
    print(f"\n{label}: {commits} commits in-process ({directory})", flush=True)
    async with Icespool(config) as service:
        writer = service.writer("bench.t")
        catalog = load_catalog(config.catalog.name, config.catalog.properties())
        expirer = Expirer(catalog, "bench.t", keep) if keep is not None else None

        async def commit(n: int) -> None:
            await writer.append(_batch(n))
            result = await service.flush("bench.t")
            assert result.records == ROWS, result

        await loop(
            run, commits, commit, time.process_time, catalog, "bench.t", expirer, expire_every
        )
    return run


async def over_http(directory: Path, commits: int, keep: int, expire_every: int) -> Run:
    home = DaemonDir(directory)
    home.write_config(batch_timeout="1h")
    daemon = Daemon(home)
    run = Run("C. HTTP, real daemon")
    print(f"\n{run.label}: {commits} commits over HTTP ({directory})", flush=True)
    daemon.start()
    try:
        await daemon.wait_ready()
        catalog = load_catalog(CATALOG_NAME, home.catalog_properties)
        expirer = Expirer(catalog, TABLE, keep)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def commit(n: int) -> None:
                rows = [{"id": n * ROWS + i, "v": f"r{n}"} for i in range(ROWS)]
                await daemon.ingest(session, rows)
                answer = await daemon.flush(session)
                assert answer.get("records") == ROWS, answer

            pid = daemon.pid
            assert pid is not None
            report = min(REPORT_EVERY, max(commits // 4, 1))
            await loop(
                run,
                commits,
                commit,
                lambda: process_cpu(pid),
                catalog,
                TABLE,
                expirer,
                expire_every,
                report,
            )
    finally:
        daemon.cleanup()
    return run


# ------------------------------------------------------------------ summary


def summarize(runs: list[Run]) -> None:
    print("\nSummary (p50 commit latency, first 500 vs last 500 commits; target <= 1.3x)")
    for run in runs:
        if len(run.latencies) < 2 * WINDOW:
            print(f"  {run.label}: only {len(run.latencies)} commits, no ratio")
            continue
        first, last, ratio = run.ratio(run.latencies)
        cpu_first, cpu_last, cpu_ratio = run.ratio(run.cpu)
        end = run.shapes[-1][1]
        mean = statistics.fmean(run.latencies) * 1000
        expiry = ""
        if run.expiry is not None and run.expiry.runs:
            expiry = (
                f"; simulated expiry {run.expiry.runs} runs, "
                f"{run.expiry.seconds / run.expiry.runs * 1000:.0f} ms each"
            )
        print(
            f"  {run.label}: {len(run.latencies)} commits in {run.seconds:.0f} s; "
            f"p50 first {first:.1f} ms, last {last:.1f} ms -> {ratio:.2f}x "
            f"({'ok' if ratio <= 1.3 else 'MISS'}); mean {mean:.1f} ms, "
            f"p99 {_quantile(run.latencies, 0.99):.0f} ms, "
            f"max {max(run.latencies) * 1000:.0f} ms"
        )
        print(
            f"    CPU per commit: p50 first {cpu_first:.1f} ms, last {cpu_last:.1f} ms -> "
            f"{cpu_ratio:.2f}x; mean {statistics.fmean(run.cpu) * 1000:.1f} ms"
        )
        budget = "ok" if end.metadata_dir <= 64 * 2**20 else "MISS"
        print(
            f"    end: metadata {end.metadata_dir / 2**20:.1f} MiB in {end.metadata_files} "
            f"files ({budget}; target <= 64 MiB), {end.manifests} live manifests, "
            f"{end.snapshots} snapshots, metadata.json {end.metadata_json / 1024:.0f} KB"
            f"{expiry}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--baseline-commits", type=int, default=1_000)
    parser.add_argument("--http-commits", type=int, default=1_000)
    parser.add_argument("--keep-snapshots", type=int, default=360)
    parser.add_argument("--expire-every", type=int, default=50)
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a table property for run A (declared properties win over the defaults)",
    )
    parser.add_argument("--dir", type=Path, help="work here (kept) instead of a temp dir")
    args = parser.parse_args()
    properties = dict(item.split("=", 1) for item in args.property)

    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-longevity-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"bench_longevity: {ROWS} rows per commit, SQLite catalog, local warehouse, "
        f"simulated expiry keeps {args.keep_snapshots} snapshots every "
        f"{args.expire_every} commits; work dir {root}"
    )
    runs: list[Run] = []
    try:
        if args.commits:
            runs.append(
                asyncio.run(
                    in_process(
                        "A. daemon defaults",
                        root / "a",
                        args.commits,
                        properties,
                        args.keep_snapshots,
                        args.expire_every,
                    )
                )
            )
        if args.baseline_commits:
            runs.append(
                asyncio.run(
                    in_process(
                        "B. baseline: fast append, no expiry",
                        root / "b",
                        args.baseline_commits,
                        OLD_BEHAVIOUR,
                        None,
                        args.expire_every,
                    )
                )
            )
        if args.http_commits:
            runs.append(
                asyncio.run(
                    over_http(root / "c", args.http_commits, args.keep_snapshots, args.expire_every)
                )
            )
        summarize(runs)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
