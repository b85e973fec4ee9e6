"""icespool.runtime.retry: the loop every retry in the daemon runs (blocking and async).

Each case asserts the exact tries made, the pauses asked for, what ``on_retry`` saw
and the error that comes out; pauses are real sleeps, kept to milliseconds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from icespool.runtime.retry import Backoff, retry, retry_async


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"done"``; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"

    async def call_async(self) -> str:
        await asyncio.sleep(0)
        return self()


def test_retry_tries_again_with_the_pause_asked_for() -> None:
    flaky = Flaky(ValueError("one"), ValueError("two"))
    seen: list[tuple[int, str, float]] = []
    started = time.monotonic()
    result = retry(
        flaky,
        attempts=3,
        retryable=ValueError,
        pause=lambda number, _: 0.01 * number,
        on_retry=lambda number, exc, wait: seen.append((number, str(exc), wait)),
    )
    assert result == "done"
    assert flaky.calls == 3
    assert seen == [(1, "one", 0.01), (2, "two", 0.02)]
    assert time.monotonic() - started >= 0.03


def test_retry_raises_the_last_error_after_its_attempts() -> None:
    flaky = Flaky(ValueError("one"), ValueError("two"), ValueError("three"))
    with pytest.raises(ValueError, match=r"^two$"):
        retry(flaky, attempts=2, retryable=ValueError, pause=lambda *_: 0.0)
    assert flaky.calls == 2


def test_retry_raises_an_error_that_is_not_retryable_at_once() -> None:
    flaky = Flaky(KeyError("k"))
    with pytest.raises(KeyError):
        retry(flaky, attempts=5, retryable=ValueError, pause=lambda *_: 0.0)
    assert flaky.calls == 1


def test_retry_takes_a_test_of_the_error() -> None:
    flaky = Flaky(ValueError("again"), ValueError("stop"))
    with pytest.raises(ValueError, match=r"^stop$"):
        retry(
            flaky,
            attempts=5,
            retryable=lambda exc: str(exc) == "again",
            pause=lambda *_: 0.0,
        )
    assert flaky.calls == 2


def test_backoff_pause_is_its_delay() -> None:
    backoff = Backoff(attempts=4, base=0.1, cap=0.3)
    for attempt, ceiling in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.3)):
        assert ceiling / 2 <= backoff.pause(attempt, ValueError()) <= ceiling


async def test_retry_async_awaits_the_attempt_and_on_retry() -> None:
    flaky = Flaky(ValueError("one"))
    seen: list[int] = []

    async def on_retry(number: int, exc: BaseException, wait: float) -> None:
        await asyncio.sleep(0)
        seen.append(number)

    result = await retry_async(
        flaky.call_async,
        attempts=2,
        retryable=ValueError,
        pause=lambda *_: 0.0,
        on_retry=on_retry,
    )
    assert (result, flaky.calls, seen) == ("done", 2, [1])


async def test_retry_async_without_a_bound_stops_at_the_deadline() -> None:
    flaky = Flaky(*[ValueError(f"failure {n}") for n in range(1, 100)])
    started = time.monotonic()
    # The first pause ends before the deadline, the second would end past it.
    with pytest.raises(ValueError, match=r"^failure 2$"):
        await retry_async(
            flaky.call_async,
            attempts=None,
            retryable=ValueError,
            pause=lambda *_: 0.1,
            deadline=started + 0.15,
        )
    assert flaky.calls == 2
    assert 0.1 <= time.monotonic() - started < 0.15


async def test_retry_async_raises_a_cancellation_unretried() -> None:
    flaky = Flaky(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await retry_async(flaky.call_async, attempts=3, retryable=Exception, pause=lambda *_: 0.0)
    assert flaky.calls == 1
