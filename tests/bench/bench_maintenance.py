"""Ingest throughput with the daemon's table maintenance running vs turned off (issue #13).

Run: PYTHONPATH=. .venv/bin/python tests/bench/bench_maintenance.py [--seconds 30]
         [--trials 2] [--clients 4] [--interval 2s] [--batch-timeout 1s] [--dir DIR]

A real `icespool run` child per trial (SQLite catalog, local warehouse, one table of the
8-column benchmark event). ``--clients`` aiohttp clients POST pre-built bodies of 1,000
events at full speed for ``--seconds``; the table commits every ``--batch-timeout``, so
it piles up small files, snapshots and manifests, which is what maintenance works on.
Then POST /flush: rows acked per second (first request to last ack) and rows committed
per second (to the end of the flush) are the figures.

Modes, interleaved (off, on, off, on, ...) and the best trial of each kept, because other
work shares the machine's cores:

  off  [maintenance] enabled = false
  on   every ``--interval``: compaction of the small files (once 5 are there), expiry
       (keep 10 snapshots, or 20 s), the orphan sweep (files older than 10 s), the shared
       I/O budget at its default (64 MiB/s)

Printed: rows/s of each trial, the best of each mode, the ratio on / off (target >= 0.9),
and what maintenance did in the last "on" trial (tasks run by outcome, files removed; the
table's data files and snapshots at the end are in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog import load_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (support)

from _events import COLUMNS, ndjson_body
from support.daemon_harness import Daemon, DaemonDir

TABLE = "bench.events"
NDJSON = {"Content-Type": "application/x-ndjson"}
BODY_ROWS = 1_000


@dataclass
class Trial:
    mode: str
    acked: int
    committed: int
    ack_seconds: float
    commit_seconds: float
    data_files: int
    snapshots: int
    maintenance: dict[str, float]

    @property
    def acked_per_s(self) -> float:
        return self.acked / self.ack_seconds

    @property
    def committed_per_s(self) -> float:
        return self.committed / self.commit_seconds


def config_text(root: Path, mode: str, interval: str, batch_timeout: str) -> str:
    maintenance = (
        "enabled = false"
        if mode == "off"
        else f"""enabled = true
interval = "{interval}"
compaction = true
min_snapshots = 10
max_snapshot_age = "20s"
orphan_older_than = "10s\""""
    )
    schema = ",\n  ".join(
        "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in column.items()) + " }"
        for column in COLUMNS
    )
    return f"""\
[catalog]
name = "bench"
type = "sql"
uri = "sqlite:///{root / "catalog.db"}"
warehouse = "{(root / "warehouse").as_uri()}"

[spool]
dir = "{root / "spool"}"

[http]
listen = "127.0.0.1:0"

[defaults]
batch_timeout = "{batch_timeout}"
max_batch_records = 1000000

[log]
level = "info"
format = "text"

[maintenance]
{maintenance}

[[tables]]
name = "{TABLE}"
create = true
schema = [
  {schema},
]
"""


def maintenance_figures(text: str) -> dict[str, float]:
    wanted = {"icespool_maintenance_runs_total", "icespool_maintenance_files_removed_total"}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("table") == TABLE:
                labels = sample.labels
                key = (
                    f"{labels['task']}:{labels['outcome']}"
                    if "task" in labels
                    else f"removed {labels['kind']}"
                )
                found[key] = found.get(key, 0.0) + sample.value
    return found


async def post_loop(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], deadline: float
) -> tuple[int, float]:
    acked, last = 0, time.perf_counter()
    k = 0
    while time.perf_counter() < deadline:
        async with session.post(url, data=bodies[k % len(bodies)], headers=NDJSON) as resp:
            payload = await resp.read()
        k += 1
        if resp.status == 200:
            acked += int(json.loads(payload)["accepted"])
            last = time.perf_counter()
        elif resp.status == 503:
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"ingest answered {resp.status}: {payload[:300]!r}")
    return acked, last


async def trial(root: Path, mode: str, args: argparse.Namespace, bodies: list[bytes]) -> Trial:
    home = DaemonDir(root)
    root.mkdir(parents=True)
    (root / "warehouse").mkdir()
    home.config_path.write_text(config_text(root, mode, args.interval, args.batch_timeout))
    daemon = Daemon(home)
    daemon.start()
    try:
        await daemon.wait_ready()
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            url = daemon.records_url(TABLE)
            began = time.perf_counter()
            results = await asyncio.gather(
                *(
                    post_loop(session, url, bodies[i:] + bodies[:i], began + args.seconds)
                    for i in range(args.clients)
                )
            )
            acked = sum(count for count, _ in results)
            last_ack = max(last for _, last in results)
            async with session.post(daemon.flush_url(TABLE)) as resp:
                assert resp.status == 200, await resp.text()
            flushed = time.perf_counter()
            figures = maintenance_figures(await daemon.metrics(session))
    finally:
        daemon.signal(15)
        await daemon.wait_exit(120)
        daemon.cleanup()
    catalog = load_catalog("bench", type="sql", uri=f"sqlite:///{root / 'catalog.db'}")
    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    committed = int(snapshot.summary["total-records"])
    data_files = int(snapshot.summary["total-data-files"])
    snapshots = len(table.metadata.snapshots)
    catalog.engine.dispose()  # type: ignore[attr-defined]
    if committed != acked:
        raise AssertionError(f"{mode}: {acked} rows acked, {committed} committed")
    return Trial(
        mode,
        acked,
        committed,
        last_ack - began,
        flushed - began,
        data_files,
        snapshots,
        figures,
    )


async def main_async(args: argparse.Namespace) -> None:
    bodies = [ndjson_body(BODY_ROWS, seed) for seed in range(16)]
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="icespool-bench-maint-", dir=args.dir) as tmp:
        for n in range(args.trials):
            for mode in ("off", "on"):
                result = await trial(Path(tmp) / f"{mode}-{n}", mode, args, bodies)
                trials.append(result)
                print(
                    f"trial {n + 1} {mode:>3}: {result.acked:,} rows, acked "
                    f"{result.acked_per_s:,.0f} rows/s, committed {result.committed_per_s:,.0f} "
                    f"rows/s; {result.data_files} data files, {result.snapshots} snapshots",
                    flush=True,
                )
    best = {
        mode: max((t for t in trials if t.mode == mode), key=lambda t: t.acked_per_s)
        for mode in ("off", "on")
    }
    best_committed = {
        mode: max(t.committed_per_s for t in trials if t.mode == mode) for mode in ("off", "on")
    }
    print(
        f"\n{args.clients} clients x {BODY_ROWS:,}-event bodies for {args.seconds:g} s, commits "
        f"every {args.batch_timeout}, maintenance every {args.interval} (best of {args.trials})\n"
        "| maintenance | acked rows/s | committed rows/s | data files at end | snapshots |\n"
        "| --- | ---: | ---: | ---: | ---: |"
    )
    for mode in ("off", "on"):
        t = best[mode]
        print(
            f"| {mode} | {t.acked_per_s:,.0f} | {best_committed[mode]:,.0f} | {t.data_files} | "
            f"{t.snapshots} |"
        )
    ratio = best["on"].acked_per_s / best["off"].acked_per_s
    committed_ratio = best_committed["on"] / best_committed["off"]
    print(
        f"\nratio on / off: acked {ratio:.2f}, committed {committed_ratio:.2f} (target >= 0.9)"
        f"{'' if min(ratio, committed_ratio) >= 0.9 else '  MISSED'}"
    )
    last_on = [t for t in trials if t.mode == "on"][-1]
    print(f"maintenance in the last 'on' trial: {last_on.maintenance}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--interval", default="2s")
    parser.add_argument("--batch-timeout", default="1s")
    parser.add_argument("--dir", type=Path, default=None)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
