"""The spool under a full or failing disk, one fault at a time (issue 11, items 1 and 2).

Faults come through the spool's file-system seam (`_faulty_fs.FaultyFileSystem`);
every test checks exactly which batches are readable afterwards, also after a
crash and recovery.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from support.faulty_fs import Fault, FaultyFileSystem, crash
from support.spool_helpers import batch, read_all

from icespool.spool import SegmentInfo, Spool, SpoolFullError, SpoolIOError
from icespool.spool._segment import OpenSegment

TABLE = "ns.events"


def _ids(rows: list[tuple[object, object]]) -> list[int]:
    return [int(meta["n"]) for _, meta in rows]  # type: ignore[index]


async def _reopen_ids(directory: Path) -> tuple[list[int], int]:
    """Batch numbers readable after recovery, and how many files recovery quarantined."""
    async with Spool(directory) as spool:
        return _ids(await read_all(spool, TABLE)), len(spool.recovered.quarantined)


@pytest.mark.parametrize("fault", ["enospc", "eio", "torn"])
async def test_failed_first_batch_then_next_append_lands_in_a_verifying_segment(
    tmp_path: Path, fault: Fault
) -> None:
    # The bug: the first batch of a segment fails, the file is cut to 0
    # bytes, and the next append used to go out without the schema message.
    fs = FaultyFileSystem()
    spool = Spool(tmp_path, fs=fs)
    await spool.open()
    fs.inject("write", fault)
    with pytest.raises(SpoolIOError, match="appending"):
        await spool.append(TABLE, batch(0), {"n": 0})
    await spool.append(TABLE, batch(1), {"n": 1})
    await crash(spool)  # unsealed, as kill -9 leaves it
    assert await _reopen_ids(tmp_path) == ([1], 0)


async def test_short_writes_are_completed_not_acked_half(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    async with Spool(tmp_path, fs=fs) as spool:
        fs.inject("write", "short", "short")
        await spool.append(TABLE, batch(0), {"n": 0})
        await spool.append(TABLE, batch(1), {"n": 1})
        assert _ids(await read_all(spool, TABLE)) == []  # nothing sealed yet
    assert await _reopen_ids(tmp_path) == ([0, 1], 0)


async def test_failed_cut_after_failed_write_rotates_to_a_fresh_segment(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    spool = Spool(tmp_path, fs=fs)
    await spool.open()
    first = await spool.append(TABLE, batch(0), {"n": 0})
    # Half a message reaches the file and cannot be cut off again.
    fs.inject("write", "torn")
    fs.inject("ftruncate", "eio")
    with pytest.raises(SpoolIOError):
        await spool.append(TABLE, batch(1), {"n": 1})
    later = await spool.append(TABLE, batch(2), {"n": 2})
    assert later.segment_id != first.segment_id
    await spool.seal(TABLE)
    # The broken segment's whole messages are still readable, without its torn tail.
    assert _ids(await read_all(spool, TABLE)) == [0, 2]
    await crash(spool)
    assert await _reopen_ids(tmp_path) == ([0, 2], 0)


async def test_eio_on_fdatasync_fails_its_waiters_and_rotates(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    spool = Spool(tmp_path, durability="fsync", fs=fs)
    await spool.open()
    first = await spool.append(TABLE, batch(0), {"n": 0})
    fs.inject("fdatasync", "eio")
    outcomes = await asyncio.gather(
        *(spool.append(TABLE, batch(n), {"n": n}) for n in range(1, 6)), return_exceptions=True
    )
    # After EIO the page cache may have dropped those bytes and a second
    # fdatasync would lie: none of the appends behind the failed sync is acked.
    assert all(isinstance(o, SpoolIOError) for o in outcomes), outcomes
    later = await spool.append(TABLE, batch(6), {"n": 6})
    assert later.segment_id != first.segment_id
    await spool.seal(TABLE)
    assert _ids(await read_all(spool, TABLE)) == [0, 6]
    await crash(spool)
    fs.power_loss(tmp_path)  # only what a sync covered survives
    assert await _reopen_ids(tmp_path) == ([0, 6], 0)


async def test_enospc_at_seal_keeps_the_prefix_committable(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    spool = Spool(tmp_path, fs=fs)
    await spool.open()
    await spool.append(TABLE, batch(0), {"n": 0})
    await spool.append(TABLE, batch(1), {"n": 1})
    fs.inject("write", "enospc")
    with pytest.raises(SpoolIOError, match="sealing"):
        await spool.seal(TABLE)
    [kept] = spool.segments(TABLE)
    assert not kept.sealed and kept.batches == 2 and kept.rows == 6
    # Readable (and so committable, which frees space) without another byte written.
    assert _ids(await read_all(spool, TABLE)) == [0, 1]
    await crash(spool)
    async with Spool(tmp_path) as again:
        [recovered] = again.recovered.segments
        assert recovered.id == kept.id and recovered.sealed  # sealed once there is room
        assert _ids(await read_all(again, TABLE)) == [0, 1]
        await again.delete(recovered.id)
        assert again.stats().bytes == 0


async def test_enospc_creating_the_segment_file(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    async with Spool(tmp_path, fs=fs) as spool:
        fs.inject("open", "enospc")
        with pytest.raises(SpoolIOError, match="creating segment"):
            await spool.append(TABLE, batch(0), {"n": 0})
        await spool.append(TABLE, batch(1), {"n": 1})
        assert spool.stats().bytes == spool.stats().tables[TABLE].bytes > 0
    assert await _reopen_ids(tmp_path) == ([1], 0)


async def _torn_segment(directory: Path) -> None:
    """A segment with two acked batches and no seal (the writer was killed)."""
    spool = Spool(directory)
    await spool.open()
    await spool.append(TABLE, batch(0), {"n": 0})
    await spool.append(TABLE, batch(1), {"n": 1})
    await crash(spool)


@pytest.mark.parametrize(
    "faults",
    [("short",), ("short", "enospc"), ("enospc",), ("torn",)],
    ids=["short", "short-then-full", "full", "torn"],
)
async def test_recovery_seal_on_a_full_volume_starts_anyway(
    tmp_path: Path, faults: tuple[Fault, ...]
) -> None:
    # The crash loop: _finish ignored a short write, then ArrowInvalid
    # escaped recovery and the daemon exited on every start.
    await _torn_segment(tmp_path)
    fs = FaultyFileSystem()
    fs.inject("write", *faults)
    async with Spool(tmp_path, fs=fs) as spool:
        [info] = spool.recovered.segments
        completed = faults == ("short",)  # a short write is finished, not ignored
        assert info.sealed is completed
        assert len(spool.recovered.unsealed) == (0 if completed else 1)
        assert _ids(await read_all(spool, TABLE)) == [0, 1]
    async with Spool(tmp_path) as spool:
        [info] = spool.recovered.segments
        assert info.sealed and spool.recovered.quarantined == []
        assert _ids(await read_all(spool, TABLE)) == [0, 1]


async def test_one_file_recovery_cannot_handle_does_not_stop_the_others(tmp_path: Path) -> None:
    await _torn_segment(tmp_path)
    bad = tmp_path / "junk.arrow"  # not a segment name: quarantined at recovery
    bad.write_bytes(b"not arrow")
    fs = FaultyFileSystem()
    fs.inject("replace", "eio")  # ... but the rename into quarantine/ fails
    async with Spool(tmp_path, fs=fs) as spool:
        assert [p for p, _ in spool.recovered.failed] == [bad]
        assert _ids(await read_all(spool, TABLE)) == [0, 1]
    assert bad.exists()  # left for the next start, never deleted


async def test_quarantine_counts_against_max_bytes(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        for n in range(4):
            await spool.append(TABLE, batch(n, rows=50), {"n": n})
        info = await spool.seal(TABLE)
        assert isinstance(info, SegmentInfo)
    limit = info.bytes + batch(9, rows=50).nbytes // 2
    async with Spool(tmp_path, max_bytes=limit) as spool:
        await spool.quarantine(info.id, "cannot commit: example")
        stats = spool.stats()
        assert (stats.bytes, stats.quarantine_bytes, stats.quarantined) == (0, info.bytes, 1)
        # The live segments are gone, but the quarantined file still fills the volume.
        with pytest.raises(SpoolFullError, match="in quarantine"):
            await spool.append(TABLE, batch(9, rows=50), {"n": 9})
    async with Spool(tmp_path, max_bytes=limit) as spool:
        assert spool.stats().quarantine_bytes == info.bytes  # counted again at start
        with pytest.raises(SpoolFullError):
            await spool.append(TABLE, batch(9, rows=50), {"n": 9})
        [entry] = spool.quarantined()
        os.unlink(entry.path)  # the operator removes it after inspection
        assert spool.quarantined() == [] and spool.stats().quarantine_bytes == 0
        await spool.append(TABLE, batch(9, rows=50), {"n": 9})


def test_a_failed_fdatasync_fails_every_later_sync_of_that_segment(tmp_path: Path) -> None:
    # Linux reports a writeback error once; the next fdatasync "succeeds" although
    # the data is gone. A segment whose sync failed must never ack again.
    fs = FaultyFileSystem()
    segment = OpenSegment(tmp_path, TABLE, batch(0).schema, "0" * 36, fs)
    segment.write(batch(0), None)
    fs.inject("fdatasync", "eio")
    with pytest.raises(SpoolIOError):
        segment.sync()
    segment.write_many([(batch(1), None)])  # refused, reported per item
    for _ in range(2):
        with pytest.raises(SpoolIOError, match="fdatasync failed"):
            segment.sync()
    assert segment.durable == 0 and fs.injected == [("fdatasync", "eio")]
    segment.abandon()
