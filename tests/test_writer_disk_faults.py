"""A table writer whose spool disk fails: the flush commits what it can (issue 11, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from spooltests._faulty_fs import FaultyFileSystem
from test_writer import TABLE, _batch, _config, _rows

from daemon import Icespool
from spool import SpoolIOError


async def test_a_failed_seal_still_commits_the_sealed_segments(tmp_path: Path) -> None:
    config = _config(tmp_path)
    ice = Icespool(config)
    fs = FaultyFileSystem()
    ice._spool._fs = fs  # the spool's file-system seam; the daemon never sets it
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
