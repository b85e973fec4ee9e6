"""daemon.encode_pool: flush work in threads of its own, at a lower CPU priority."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading

import pytest

from daemon.encode_pool import NICENESS, flush_calls, in_flush_thread

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


def _where() -> tuple[str, int, int, str]:
    tid = threading.get_native_id()
    return (
        threading.current_thread().name,
        tid,
        os.getpriority(os.PRIO_PROCESS, tid),
        _var.get(),
    )


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice is Linux's")
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
