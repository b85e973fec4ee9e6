"""The event loop's default executor, knowing which blocking calls are still running.

Every pyiceberg and pyarrow call runs in this executor (``asyncio.to_thread``). Python
cannot stop a thread, and closing the loop joins the executor's threads, so one call
stuck in a dependency beyond every timeout would keep the process alive forever after
SIGTERM. The daemon asks this executor what is still running when its grace is over,
names it in the log, and exits without joining it (``icespool.app``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["TrackedExecutor"]


class TrackedExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose submitted calls can be listed while they run."""

    def __init__(
        self,
        thread_name_prefix: str = "icespool-blocking",
        initializer: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(thread_name_prefix=thread_name_prefix, initializer=initializer)
        self._calls: dict[int, tuple[str, float]] = {}
        self._calls_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        call = (_describe(fn), time.monotonic())
        future = super().submit(fn, *args, **kwargs)
        key = id(future)
        with self._calls_lock:
            self._calls[key] = call
        # Runs at once if the call already finished: the entry never outlives it.
        future.add_done_callback(lambda _: self._forget(key))
        return future

    def running(self) -> list[tuple[str, float]]:
        """(call, seconds since it was submitted) of every call not finished yet."""
        now = time.monotonic()
        with self._calls_lock:
            return [(name, now - started) for name, started in self._calls.values()]

    def _forget(self, key: int) -> None:
        with self._calls_lock:
            self._calls.pop(key, None)


def _describe(fn: Callable[..., Any]) -> str:
    """``FlushJob._committed_marks (t.events)``: the function, and the table it serves."""
    if isinstance(fn, functools.partial) and fn.args and callable(fn.args[0]):
        fn = fn.args[0]  # asyncio.to_thread submits partial(context.run, func, *args)
    if isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or repr(fn)
    table = getattr(getattr(fn, "__self__", None), "name", None)
    return f"{name} ({table})" if isinstance(table, str) else name
