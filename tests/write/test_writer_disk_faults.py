"""A table writer whose spool disk fails: the flush commits what it can (issue 11, item 4)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.faulty_fs import FaultyFileSystem
from test_writer import TABLE, _batch, _config, _rows

from icespool import BackpressureError, Icespool
from icespool.spool import SpoolIOError


async def test_a_failed_seal_still_commits_the_sealed_segments(tmp_path: Path) -> None:
    config = _config(tmp_path)
    fs = FaultyFileSystem()
    ice = Icespool(config, fs=fs)  # the spool's file-system seam; the daemon never sets it
    async with ice:
        writer = ice.writer(TABLE)
        await writer.append(_batch(range(100)))
        assert await ice._spool.seal(TABLE) is not None  # a sealed segment waits
        await writer.append(_batch(range(100, 150)))  # the open one
        fs.inject("write", "enospc")  # no room for the open segment's seal
        with pytest.raises(SpoolIOError, match="sealing"):
            await writer.flush()
        # Committing frees space; the unsealable segment's verified prefix went too.
        assert [r["id"] for r in _rows(config)] == list(range(150))
        assert ice._spool.stats().segments == 0
        again = await writer.flush()
        assert again.records == 0
    assert [r["id"] for r in _rows(config)] == list(range(150))


async def test_quarantined_bytes_are_reported_and_count_against_the_spool(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        await ice.writer(TABLE).append(_batch(range(100)))
        info = await ice._spool.seal(TABLE)
        assert info is not None
        await ice._spool.quarantine(info.id, "cannot commit: example")
        spool = ice.status()["spool"]
        assert (spool["quarantine_bytes"], spool["quarantined_segments"]) == (info.bytes, 1)
        ice.refresh_gauges()
        exposition = ice.metrics.exposition().decode()
        assert f"icespool_spool_quarantine_bytes {float(info.bytes)}" in exposition
        # An operator deletes it after inspection: it stops counting at the next look.
        for path in (tmp_path / "spool" / "quarantine").iterdir():
            path.unlink()
        assert ice.status()["spool"]["quarantine_bytes"] == 0


async def test_a_full_spool_commits_its_tables_instead_of_refusing_until_batch_timeout(
    tmp_path: Path,
) -> None:
    """The spool reaches max_bytes long before the table's size trigger (batch_timeout
    1h): the refused append starts a commit, so room comes back within seconds."""
    config = _config(tmp_path)
    spool = config.spool.model_copy(update={"max_bytes": 256 << 10, "segment_max_bytes": 64 << 10})
    config = config.model_copy(update={"spool": spool})
    acked: list[int] = []
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        refused = None
        for start in range(0, 100_000, 1000):
            try:
                await writer.append(_batch(range(start, start + 1000)))
            except BackpressureError as exc:
                refused = str(exc)
                break
            acked += range(start, start + 1000)
        assert refused is not None and "spool is full" in refused, refused
        for _ in range(100):  # the commit the refusal started frees the spool
            if ice._spool.stats().bytes == 0:
                break
            await asyncio.sleep(0.05)
        await writer.append(_batch(range(200_000, 201_000)))
        acked += range(200_000, 201_000)
        await writer.flush()
    assert [r["id"] for r in _rows(config)] == acked
