"""Another writer rolls the table back while a real `icespool run` child commits.

An operator (pyiceberg's ``manage_snapshots().rollback_to_snapshot``) keeps moving the
table's main branch back one snapshot while the daemon ingests and commits round after
round. A rolled-back commit's rows leave the table (the operator's choice) and are
never committed again; every other acked round is in the table exactly once; a full
scan succeeds; the daemon stays up.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import aiohttp
from support.daemon_harness import Daemon, DaemonDir

ROUNDS = 16
PER_ROUND = 500


def _roll_back_repeatedly(home: DaemonDir, stop: threading.Event, done: list[int]) -> None:
    table, catalog = home.load_table()
    try:
        while not stop.wait(0.15):
            try:
                table = table.refresh()
                current = table.current_snapshot()
                if current is None or current.parent_snapshot_id is None:
                    continue
                with table.manage_snapshots() as manage:
                    manage.rollback_to_snapshot(current.parent_snapshot_id)
                done.append(current.snapshot_id)
            except Exception:  # a conflict with the daemon's commit: try again
                continue
    finally:
        catalog.engine.dispose()


async def test_rollbacks_under_a_committing_daemon(tmp_path: Path, postgres_uri: str) -> None:
    home = DaemonDir(tmp_path / "d", catalog_uri=postgres_uri)
    home.write_config(
        batch_timeout="1h",
        extra='\n[maintenance]\ninterval = "1s"\norphan_older_than = "1s"\n',
    )
    daemon = Daemon(home)
    stop = threading.Event()
    rolled_back: list[int] = []
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession() as session:
            await daemon.ingest(session, [{"id": i, "v": "r"} for i in range(PER_ROUND)])
            await daemon.flush(session)
            roller = threading.Thread(
                target=_roll_back_repeatedly, args=(home, stop, rolled_back), daemon=True
            )
            roller.start()
            for n in range(1, ROUNDS):
                ids = range(n * PER_ROUND, (n + 1) * PER_ROUND)
                await daemon.ingest(session, [{"id": i, "v": "r"} for i in ids])
                await daemon.flush(session)
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.to_thread(roller.join, 30)
            await daemon.wait_log("; orphans: listed", within=30)
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0, daemon.tail()
    finally:
        stop.set()
        daemon.cleanup()
    assert rolled_back, "the operator never managed a rollback"
    rows, table = home.read_rows()  # a full scan: fails if a data file is missing
    ids = Counter(int(r["id"]) for r in rows)
    assert max(ids.values()) == 1
    # Whole rounds are in or out; what is out is a rolled-back snapshot's, none twice.
    rounds = Counter(i // PER_ROUND for i in ids)
    assert set(rounds.values()) == {PER_ROUND}, rounds
    holders: Counter[str] = Counter()
    for snapshot in table.metadata.snapshots:
        segments = (snapshot.summary or {}).get("icespool.segments") if snapshot.summary else None
        for segment in (segments or "").split(","):
            if segment:
                holders[segment] += 1
    assert len(holders) == ROUNDS and set(holders.values()) == {1}, holders
    print(f"{len(rounds)} of {ROUNDS} rounds in the table, {len(rolled_back)} rollbacks")
    assert len(rounds) < ROUNDS
