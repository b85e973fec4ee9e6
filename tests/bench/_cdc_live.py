"""`bench_cdc.py --live`: an upsert table's write side at a 1 s commit cadence, this
tree's position deletes beside the equality-delete path in the same run.

The equality-delete path is ``--baseline-tree`` (a checkout of the revision before key
indexes, its ``make pkgroot`` done) or, without one, this tree with its key index
unavailable (a file where its directory would be: every commit deletes by key, and
maintenance converts those deletes). Each side runs alone (a fresh ``icespool run``,
PostgreSQL catalog, ``batch_timeout = "1s"``), in the order equality, position,
position, equality, so a drift of the machine weighs on both:

1. every one of ``--keys`` ids upserted once, committed;
2. ``--rate`` changes a second (``--deletes`` of them deletes) for ``--live-seconds``:
   the commit durations (flush start to commit, the daemon's log) give p50 / p99;
3. ``--live-changes`` changes posted as fast as the daemon acks them (4 requests in
   flight, 2,000 changes each): changes/s from the first post to the moment the daemon's
   ``icespool_records_committed_total`` reaches its acked count (visible to readers).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _upsert_daemons as daemons_
import aiohttp
from _upsert_daemons import Daemon
from support.postgres import create_database, drop_database

from icespool.write import KEY_INDEX_DIR

__all__ = ["live"]

TABLE = "bench.cdc_live"
_BODY = 2_000
_IN_FLIGHT = 4


@dataclass(frozen=True)
class Run:
    side: str
    commits: list[float]  # ms, at the cadence
    rate: float  # changes/s to visible, as fast as acked
    kinds: dict[str, float]  # upsert commits by how they deleted


async def _visible(session: aiohttp.ClientSession, daemon: Daemon, within: float = 600) -> None:
    """Wait until every change the daemon acked is committed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        samples = await daemons_.metrics(session, daemon)
        acked = samples.get("icespool_records_acked_total", 0.0)
        if acked and samples.get("icespool_records_committed_total", 0.0) >= acked:
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"{daemon.table}: not all committed after {within:.0f}s; see {daemon.log}")


async def _cadence(
    session: aiohttp.ClientSession, daemon: Daemon, args: argparse.Namespace
) -> None:
    rng = random.Random(11)
    per_body = max(1, args.rate // 10)
    next_at = time.monotonic()
    until = next_at + args.live_seconds
    while time.monotonic() < until:
        data = daemons_.changes(rng, per_body, args.keys, args.deletes)
        await daemons_.post(session, daemon, data, per_body)
        next_at += 0.1
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _flood(session: aiohttp.ClientSession, daemon: Daemon, bodies: list[bytes]) -> float:
    queue = list(reversed(bodies))

    async def poster() -> None:
        while queue:
            await daemons_.post(session, daemon, queue.pop(), _BODY)

    began = time.perf_counter()
    await asyncio.gather(*(poster() for _ in range(_IN_FLIGHT)))
    await _visible(session, daemon)
    return time.perf_counter() - began


async def _run(side: str, tree: Path | None, args: argparse.Namespace, bodies: list[bytes]) -> Run:
    database = create_database("bench_cdc_live")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cdc-live-") as tmp:
            directory = Path(tmp)
            spool = directory / "spool"
            if side == "equality" and tree is None:
                spool.mkdir()
                (spool / KEY_INDEX_DIR).write_text("no key index: delete by key\n")
            daemon = daemons_.start(
                directory,
                daemons_.catalog_props(directory, database),
                TABLE,
                batch_timeout="1s",
                format_version=2,
                tree=tree,
                spool=spool,
            )
            try:
                timeout = aiohttp.ClientTimeout(total=120)
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    await daemons_.ready(session, daemon)
                    await daemons_.load_keys(session, [daemon], args.keys)
                    await _visible(session, daemon)
                    await asyncio.sleep(2)  # the key index built from the loaded table
                    before = len(daemons_.commit_ms(daemon))
                    await _cadence(session, daemon, args)
                    await _visible(session, daemon)
                    commits = daemons_.commit_ms(daemon)[before:]
                    seconds = await _flood(session, daemon, bodies)
                    samples = await daemons_.metrics(session, daemon)
                if daemon.failed_posts:
                    raise SystemExit(f"{side}: {daemon.failed_posts} posts failed")
            finally:
                daemons_.stop([daemon])
    finally:
        drop_database(database)
    kinds = {
        kind: samples.get(f'icespool_upsert_commits_total{{deletes="{kind}"}}', 0.0)
        for kind in ("position", "equality")
    }
    return Run(side, commits, len(bodies) * _BODY / seconds, kinds)


def _line(run: Run) -> str:
    p50 = daemons_.quantile(run.commits, 0.5)
    p99 = daemons_.quantile(run.commits, 0.99)
    return (
        f"{run.side:>9}: at the cadence {len(run.commits)} commits p50 {p50:.0f} ms p99 "
        f"{p99:.0f} ms; as fast as acked {run.rate:,.0f} changes/s to visible; upsert "
        f"commits by deletes {run.kinds}"
    )


async def live(args: argparse.Namespace) -> int:
    rng = random.Random(5)
    count = max(1, args.live_changes // _BODY)
    bodies = [daemons_.changes(rng, _BODY, args.keys, args.deletes) for _ in range(count)]
    baseline = (
        f"--baseline-tree {args.baseline_tree}"
        if args.baseline_tree is not None
        else "this tree with its key index unavailable"
    )
    print(
        f"live: {args.keys:,} keys, {args.rate:,} changes/s for {args.live_seconds:g} s, then "
        f"{count * _BODY:,} changes as fast as acked; {args.deletes:.0%} deletes; "
        f"batch_timeout 1s; equality path: {baseline}",
        flush=True,
    )
    runs: list[Run] = []
    for side in ("equality", "position", "position", "equality"):
        tree = args.baseline_tree if side == "equality" else None
        runs.append(await _run(side, tree, args, bodies))
        print(_line(runs[-1]), flush=True)
    by_side = {side: [r for r in runs if r.side == side] for side in ("equality", "position")}
    rates = {side: statistics.mean(r.rate for r in rs) for side, rs in by_side.items()}
    p99 = {
        side: daemons_.quantile([c for r in rs for c in r.commits], 0.99)
        for side, rs in by_side.items()
    }
    print(
        f"position / equality: changes/s to visible {rates['position'] / rates['equality']:.2f}x "
        f"(target >= 0.8x); commit p99 at the cadence {p99['position']:.0f} ms "
        f"(target <= 1000 ms) beside {p99['equality']:.0f} ms"
    )
    return 0
