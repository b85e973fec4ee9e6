"""A replica whose clock is hours off never deletes another replica's uncommitted files.

Two real `icespool run` children share one PostgreSQL catalog, one warehouse and one
table. Replica B writes a flush's data files and is paused (SIGSTOP, by the test's
``pause-before-commit`` seam) before its commit: a stalled VM, a stop-the-world pause.
Replica A runs under libfaketime with its clock hours ahead (or behind) and maintains
the table every second, its orphan sweep included. B's files stay; B resumes and
commits, and every id it acked is readable exactly once with a full scan.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir, crash_seam_env

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
IDS = range(30_000)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


def _b_files(home: DaemonDir) -> list[Path]:
    """B's data files in the shared warehouse: their names carry B's incarnation."""
    tag = (home.spool_dir / "incarnations").read_text().splitlines()[-1].split()[0]
    return sorted(p for p in home.warehouse.rglob("*.parquet") if f"-{tag}-" in p.name)


@pytest.mark.parametrize("offset", ["+3h", "-3h"], ids=["ahead", "behind"])
async def test_a_skewed_replica_keeps_a_paused_replicas_files(
    tmp_path: Path, postgres_uri: str, offset: str
) -> None:
    if not FAKETIME.exists():
        raise AssertionError(f"{FAKETIME} is missing: `make test-deps` installs faketime")
    warehouse = tmp_path / "warehouse"
    a_home = DaemonDir(tmp_path / "a", catalog_uri=postgres_uri, shared_warehouse=warehouse)
    b_home = DaemonDir(tmp_path / "b", catalog_uri=postgres_uri, shared_warehouse=warehouse)
    a_home.write_config(
        batch_timeout="1h",
        extra='\n[maintenance]\ninterval = "1s"\norphan_older_than = "1s"\n',
    )
    b_home.write_config(batch_timeout="1h", extra="\n[maintenance]\nenabled = false\n")
    a, b = Daemon(a_home), Daemon(b_home)
    try:
        b.start(env=crash_seam_env("pause-before-commit"))
        await b.wait_ready()
        async with aiohttp.ClientSession() as session:
            for start in range(IDS.start, IDS.stop, 5000):
                records = [{"id": i, "v": f"r{i}"} for i in range(start, start + 5000)]
                await b.ingest(session, records)
            flush = asyncio.create_task(b.flush(session))
            deadline = time.monotonic() + 60
            while b.pid is None or not _stopped(b.pid):
                assert time.monotonic() < deadline and not flush.done(), b.tail()
                await asyncio.sleep(0.02)
            written = _b_files(b_home)
            assert written, b.tail()

            a.start(
                env={
                    "LD_PRELOAD": str(FAKETIME),
                    "FAKETIME": offset,
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                }
            )
            await a.wait_ready()
            # A's clock is off by hours: its first run sweeps the table's data files.
            await a.wait_log("; orphans: listed", within=60)
            swept = re.search(r"; orphans: listed (\d+), removed (\d+)", a.log())
            assert swept is not None, a.tail()
            assert (int(swept.group(1)), int(swept.group(2))) == (len(written), 0), a.tail()
            assert all(path.exists() for path in written), [p for p in written if not p.exists()]

            b.signal(signal.SIGCONT)
            result = await asyncio.wait_for(flush, 60)
            assert result["records"] == len(IDS), result
        for daemon in (a, b):
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait_exit(60) == 0, daemon.tail()
    finally:
        if b.pid is not None and b.running:
            os.kill(b.pid, signal.SIGCONT)
        a.cleanup()
        b.cleanup()
    rows, _ = b_home.read_rows()  # a full scan: fails if a data file is missing
    ids = Counter(int(r["id"]) for r in rows)
    assert sorted(ids) == list(IDS) and max(ids.values()) == 1
