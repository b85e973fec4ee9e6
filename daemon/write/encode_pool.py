"""Where a flush's heavy work runs: threads of their own, at a lower CPU priority.

A flush encodes up to ``max_batch_records`` rows into Parquet and then writes the
commit's manifests: about a second of CPU per million rows. In the event loop's
default executor it ran beside the decode of every HTTP request that arrived
meanwhile and took an equal share of the cores, so a request overlapping an encode
waited for it (ack p99 116-149 ms at half load, issue #17), although nothing in
the ack path needs the encode.

Here the encode and commit calls run in their own threads (and so do the spool's
reads of a flush's segments and their deletion, through `flush_executor`), each
lowered by `NICENESS` (Linux keeps a nice value per thread), so when a request's
decode and an encode both want a core, the decode gets it and the encode uses what
is left: throughput is the same (the encode still gets every idle cycle), acks stop
paying for flushes. The pool is separate from the default executor so the lowered
threads never run an ack's work, and so the decode of a request never queues behind
flush work for a thread either.

The executor is tracked like the default one (`TrackedExecutor`): the daemon names
calls still running when its shutdown grace is over and exits without joining them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

from icespool.runtime.blocking import TrackedExecutor

__all__ = ["NICENESS", "flush_calls", "flush_executor", "in_flush_thread"]

#: How much lower than the daemon a flush thread runs (nice +10: about a tenth of a
#: core's share when a nice-0 thread of the daemon wants the same core).
NICENESS: Final = 10

_P = ParamSpec("_P")
_T = TypeVar("_T")

_lock = threading.Lock()
_executor: TrackedExecutor | None = None


def _lower_priority() -> None:
    # PRIO_PROCESS with a thread id changes that thread alone on Linux. Elsewhere
    # (or where the call is refused) the pool still keeps flush work apart.
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None:
        return
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS)


def flush_executor() -> TrackedExecutor:
    """The flush threads, for work that serves a flush but is called elsewhere (the
    spool reads a flush's segments back and deletes them there)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = TrackedExecutor("icespool-flush", initializer=_lower_priority)
        return _executor


async def in_flush_thread(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``asyncio.to_thread`` for a flush's encode and commit: the same context
    propagation, in the lower-priority flush threads."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    result: _T = await loop.run_in_executor(flush_executor(), call)
    return result


def flush_calls() -> list[tuple[str, float]]:
    """(call, seconds since submitted) of every flush call still running."""
    with _lock:
        executor = _executor
    return [] if executor is None else executor.running()
