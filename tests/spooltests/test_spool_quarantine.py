"""A sealed segment its owner cannot commit is quarantined with its reason and can be restored."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.spool_helpers import batch, read_all

from icespool.spool import SegmentCorruptError, Spool, UnknownSegmentError

TABLE = "ns.events"


async def test_quarantine_keeps_reason_and_restore_brings_it_back(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        spool_id = spool.id
        await spool.append(TABLE, batch(0, rows=3), {"n": 0})
        first = await spool.seal(TABLE)
        await spool.append(TABLE, batch(1, rows=4), {"n": 1})
        second = await spool.seal(TABLE)
        assert first is not None and second is not None
        moved = await spool.quarantine(first.id, "encode failed: example")
        assert moved.table == TABLE and moved.reason == "encode failed: example"
        assert [s.id for s in spool.segments(TABLE)] == [second.id]
        assert spool.stats().bytes == second.bytes
    async with Spool(tmp_path) as spool:
        assert spool.id == spool_id  # the identity survives a restart
        listed = spool.quarantined()
        assert [(q.id, q.table, q.reason) for q in listed] == [
            (first.id, TABLE, "encode failed: example")
        ]
        # Recovery does not bring a quarantined segment back by itself.
        assert [s.id for s in spool.recovered.segments] == [second.id]
        restored = await spool.restore(first.id)
        assert restored.rows == 3 and restored.table == TABLE
        assert [m for _, m in await read_all(spool, TABLE)] == [{"n": 0}, {"n": 1}]
        assert spool.quarantined() == []
        with pytest.raises(UnknownSegmentError):
            await spool.restore(first.id)


async def test_restore_refuses_a_segment_that_does_not_verify(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        await spool.append(TABLE, batch(0, rows=3))
        info = await spool.seal(TABLE)
        assert info is not None
        moved = await spool.quarantine(info.id, "cannot commit")
    raw = bytearray(moved.path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    moved.path.write_bytes(bytes(raw))
    async with Spool(tmp_path) as spool:
        with pytest.raises(SegmentCorruptError, match="does not verify"):
            await spool.restore(info.id)
        assert [q.id for q in spool.quarantined()] == [info.id]
        assert spool.segments(TABLE) == []
