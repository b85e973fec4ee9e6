"""The one retry helper: bounded attempts, full-jitter exponential backoff.

Every conflict retry (the commit engine's, ``iceberg/_commit``, for every kind of
commit) and every reconnect backoff in the daemon takes its delays from a `Backoff`,
so they all behave alike: jittered (replicas that collided do not collide again in
step), capped, and bounded in attempts where a caller must eventually give up.

`retry` (blocking) and `retry_async` run the loop itself for every retry: which
errors are worth another try (`Retryable`), the pause before it (a `Backoff`'s, or one
the error names, as a full queue's ``retry_after``), what to do between tries (log,
re-read what the next try builds on), and for `retry_async` a deadline past which no
try starts. The last error is raised as it was.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "Pause", "Retryable", "retry", "retry_async"]

_T = TypeVar("_T")

#: Which errors get another try: exception types, or a test of the error.
Retryable = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
#: The pause after failed try number ``n`` (1-based) that raised ``error``.
Pause = Callable[[int, BaseException], float]


@dataclass(frozen=True)
class Backoff:
    """``attempts`` tries in all (the first included); before try ``n + 1`` wait
    ``delay(n)``: uniform in [ceiling / 2, ceiling], ``ceiling = min(cap, base * 2**(n-1))``.
    """

    attempts: int = 12
    base: float = 0.05
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """The pause after failed try number ``attempt`` (1-based)."""
        ceiling = min(self.cap, self.base * (2 ** max(0, attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)

    def pause(self, attempt: int, error: BaseException) -> float:
        """`delay` as a `Pause` (the error does not change it)."""
        return self.delay(attempt)


#: Commits of Iceberg metadata that another writer may race (a catalog's swap).
CONFLICTS = Backoff()


def _retryable(retryable: Retryable, error: BaseException) -> bool:
    if isinstance(retryable, type | tuple):
        return isinstance(error, retryable)
    return retryable(error)


def retry(
    attempt: Callable[[], _T],
    *,
    attempts: int,
    retryable: Retryable,
    pause: Pause,
    on_retry: Callable[[int, BaseException, float], object] | None = None,
) -> _T:
    """Call ``attempt`` (blocking) until it returns, at most ``attempts`` times.

    An error that is not ``retryable``, or that of the last try, is raised. Otherwise
    ``on_retry(number, error, pause)`` runs (a log line, say) and ``pause(number,
    error)`` seconds pass before the next try.
    """
    for number in itertools.count(1):
        try:
            return attempt()
        except BaseException as exc:
            if number >= attempts or not _retryable(retryable, exc):
                raise
            wait = pause(number, exc)
            if on_retry is not None:
                on_retry(number, exc, wait)
        if wait > 0:
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


async def retry_async(
    attempt: Callable[[], Awaitable[_T]],
    *,
    attempts: int | None,
    retryable: Retryable,
    pause: Pause,
    on_retry: Callable[[int, BaseException, float], Awaitable[None] | None] | None = None,
    deadline: float | None = None,
) -> _T:
    """`retry` on the event loop: ``attempt`` and ``on_retry`` may be awaited.

    ``attempts`` None: no bound but ``deadline`` (a ``time.monotonic()`` value): a try
    whose pause would end at or past it is not made, and the last error is raised.
    """
    for number in itertools.count(1):
        try:
            return await attempt()
        except BaseException as exc:
            last = attempts is not None and number >= attempts
            if last or not _retryable(retryable, exc):
                raise
            wait = pause(number, exc)
            if deadline is not None and time.monotonic() + wait >= deadline:
                raise
            if on_retry is not None:
                done = on_retry(number, exc, wait)
                if inspect.isawaitable(done):
                    await done
        if wait > 0:
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
