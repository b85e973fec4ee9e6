"""icespool.write.encode_pool: flush work in threads of its own, at a lower CPU priority."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from pathlib import Path

import pytest
from support.witness_fs import WitnessFileSystem
from test_writer import TABLE, _batch, _config, _rows

from icespool import Icespool
from icespool.write.encode_pool import NICENESS, flush_calls, in_flush_thread

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


def _where() -> tuple[str, int, int, str]:
    tid = threading.get_native_id()
    return (
        threading.current_thread().name,
        tid,
        os.getpriority(os.PRIO_PROCESS, tid),
        _var.get(),
    )


async def test_flush_calls_run_in_their_own_lower_priority_threads() -> None:
    _var.set("from the caller")
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    name, tid, nice, seen = await in_flush_thread(_where)
    assert name.startswith("icespool-flush")
    assert tid != threading.get_native_id()
    assert nice == min(19, mine + NICENESS)
    assert seen == "from the caller"  # the context travels like asyncio.to_thread's
    # The default executor (the ack path's decode) keeps the daemon's priority.
    _, _, default_nice, _ = await asyncio.to_thread(_where)
    assert default_nice == mine


async def test_errors_propagate_and_running_calls_are_listed() -> None:
    started = threading.Event()
    release = threading.Event()

    def hold() -> str:
        started.set()
        assert release.wait(10)
        return "done"

    def fail() -> None:
        raise ValueError("bad rows")

    call = asyncio.ensure_future(in_flush_thread(hold))
    assert await asyncio.to_thread(started.wait, 10)
    names = [name for name, _ in flush_calls()]
    assert names == ["test_errors_propagate_and_running_calls_are_listed.<locals>.hold"]
    release.set()
    assert await call == "done"
    assert flush_calls() == []
    with pytest.raises(ValueError, match="bad rows"):
        await in_flush_thread(fail)


async def test_a_flush_reads_and_deletes_its_segments_in_the_flush_threads(tmp_path: Path) -> None:
    """A flush's spool work (reading its segments back, verifying every checksum,
    deleting them) runs at the flush's lower priority; appends keep the daemon's."""
    fs = WitnessFileSystem()
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    config = _config(tmp_path)
    async with Icespool(config, fs=fs) as ice:  # fs: the spool's seam (tests only)
        writer = ice.writer(TABLE)
        await writer.append(_batch(range(100)))
        result = await writer.flush()
    assert result.records == 100
    assert [r["id"] for r in _rows(config)] == list(range(100))
    lowered = min(19, mine + NICENESS)
    assert fs.seen["writev"] == {("icespool-spool", mine)}
    assert fs.seen["read_bytes"] == {("icespool-flush", lowered)}
    assert fs.seen["unlink"] == {("icespool-flush", lowered)}
