"""Segments keep their acked order across a process whose clock was wrong.

Segment ids are uuid7s (their first 48 bits are the wall clock), and a table's
segments are committed oldest id first; on an upsert table the last change per key
wins, so a segment committed out of its acked order would put an older value back.
A process running with its clock hours ahead leaves a segment behind (a crash); the
next process, with the right clock, acks more for the same table while the leftover
is still spooled (its recovery commit failed). Its new segment must sort after the
leftover.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from icespool.spool import Spool

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
TABLE = "ns.t"

_AHEAD = """
import asyncio, os, sys
import pyarrow as pa
from icespool.spool import Spool

async def main() -> None:
    spool = Spool(sys.argv[1])
    await spool.open()
    await spool.append("ns.t", pa.record_batch({"id": [1]}))
    await spool.seal("ns.t")
    os._exit(0)  # a crash: the segment stays for the next process

asyncio.run(main())
"""


@pytest.mark.parametrize("offset", ["+3h", "+400d"])
async def test_a_segment_acked_after_a_clock_ahead_sorts_after_its_leftovers(
    tmp_path: Path, offset: str
) -> None:
    if not FAKETIME.exists():
        raise AssertionError(f"{FAKETIME} is missing: `make test-deps` installs faketime")
    env = {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    subprocess.run([sys.executable, "-c", _AHEAD, str(tmp_path)], env=env, check=True, timeout=60)
    async with Spool(tmp_path) as spool:
        [leftover] = spool.recovered.segments
        await spool.append(TABLE, pa.record_batch({"id": [2]}))
        newer = await spool.seal(TABLE)
        assert newer is not None
        assert [s.id for s in spool.segments(TABLE)] == [leftover.id, newer.id]
