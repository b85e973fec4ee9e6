"""fsync mode: concurrent appenders share fsyncs (counted at the os level)."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.spool_helpers import batch, read_all
from support.witness_fs import WitnessFileSystem

from icespool.spool import FileSystem, Spool


class _CountingFileSystem(FileSystem):
    """The real syscalls, counted (through the spool's file-system seam)."""

    def __init__(self) -> None:
        self.n = 0

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self.n += 1
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        self.n += 1
        os.fsync(fd)


async def test_32_concurrent_appenders_share_fsyncs(tmp_path: Path) -> None:
    fs = _CountingFileSystem()
    per_appender = 25
    async with Spool(tmp_path, durability="fsync", fs=fs) as spool:
        before = fs.n

        async def appender(k: int) -> None:
            for j in range(per_appender):
                await spool.append("ns.t", batch(k * 100 + j), {"k": k, "j": j})

        await asyncio.gather(*(appender(k) for k in range(32)))
        appends = 32 * per_appender
        syscalls = fs.n - before
        assert spool.stats().appends == appends
        assert spool.stats().fsyncs <= syscalls
        # Far below one per append: each round of 32 waiters shares one.
        assert syscalls <= appends // 8, f"{syscalls} fsync calls for {appends} appends"
        await spool.seal("ns.t")
        got = await read_all(spool, "ns.t")
    per_k: dict[int, list[int]] = {}
    for _, meta in got:
        assert isinstance(meta, dict)
        per_k.setdefault(int(meta["k"]), []).append(int(meta["j"]))
    assert per_k == {k: list(range(per_appender)) for k in range(32)}


async def test_page_cache_mode_never_fsyncs_on_append(tmp_path: Path) -> None:
    fs = _CountingFileSystem()
    async with Spool(tmp_path, fs=fs) as spool:
        before = fs.n  # opening syncs the spool's id file once
        await asyncio.gather(*(spool.append("ns.t", batch(i)) for i in range(50)))
        assert fs.n == before and spool.stats().fsyncs == 0


async def test_reads_and_deletes_for_commits_run_in_the_owners_executor(tmp_path: Path) -> None:
    """Appends (the ack path) stay in the spool's threads; reading a sealed segment
    back (its checksums, its decode) and deleting it run where the owner said."""
    fs = WitnessFileSystem()
    commit = ThreadPoolExecutor(2, thread_name_prefix="commit-side")
    try:
        async with Spool(tmp_path, fs=fs, commit_executor=commit) as spool:
            for k in range(3):
                await spool.append("ns.t", batch(k), {"k": k})
            info = await spool.seal("ns.t")
            assert info is not None
            data = await spool.read(info.id)
            assert list(data.metas) == [{"k": 0}, {"k": 1}, {"k": 2}]
            await spool.delete(info.id)
            assert spool.segments("ns.t") == []
    finally:
        commit.shutdown()
    assert fs.threads("writev") == {"icespool-spool"}
    assert fs.threads("read_bytes") == {"commit-side"}
    assert fs.threads("unlink") == {"commit-side"}
