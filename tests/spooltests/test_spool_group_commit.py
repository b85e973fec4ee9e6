"""fsync mode: concurrent appenders share fsyncs (counted at the os level)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from spool import Spool

from ._helpers import batch, read_all


async def test_32_concurrent_appenders_share_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def counting_fdatasync(fd: int) -> None:
        calls["n"] += 1
        real_fdatasync(fd)

    def counting_fsync(fd: int) -> None:
        calls["n"] += 1
        real_fsync(fd)

    # Wrapped, not replaced: the real syscalls still run; we only count them.
    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    per_appender = 25
    async with Spool(tmp_path, durability="fsync") as spool:
        before = calls["n"]

        async def appender(k: int) -> None:
            for j in range(per_appender):
                await spool.append("ns.t", batch(k * 100 + j), {"k": k, "j": j})

        await asyncio.gather(*(appender(k) for k in range(32)))
        appends = 32 * per_appender
        syscalls = calls["n"] - before
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


async def test_page_cache_mode_never_fsyncs_on_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls["n"] += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    async with Spool(tmp_path) as spool:
        await asyncio.gather(*(spool.append("ns.t", batch(i)) for i in range(50)))
        assert calls["n"] == 0 and spool.stats().fsyncs == 0
