"""What the log says about readiness: the same answer as ``GET /readyz``, on change.

"icespool ready" is logged once, when /readyz first answers 200 (not when the start
finishes: a Kafka source may still be connecting then). Afterwards every change is one
line: a warning "icespool not ready: <reason>" when it turns unready, "icespool ready
again" when it is back. Readiness is polled (it is a function of several dependencies'
states, none of which notifies); a poll is a few attribute reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["log_readiness"]

_log = logging.getLogger("icespool.app")
#: How often readiness is looked at; the log line lags /readyz by at most this.
POLL_SECONDS = 0.2


async def log_readiness(
    not_ready_reason: Callable[[], str | None],
    url: str,
    port: int,
    *,
    every: float = POLL_SECONDS,
) -> None:
    """Log each change of ``not_ready_reason()`` between None (ready) and a reason, until
    cancelled. ``url``: the daemon's base URL, named by the first ready line."""
    ready = False
    was_ever_ready = False
    while True:
        reason = not_ready_reason()
        if reason is None and not ready:
            if was_ever_ready:
                _log.info("icespool ready again: %s", url, extra={"port": port})
            else:
                _log.info("icespool ready: %s", url, extra={"port": port})
            ready = was_ever_ready = True
        elif reason is not None and ready:
            _log.warning("icespool not ready: %s", reason, extra={"reason": reason})
            ready = False
        await asyncio.sleep(every)
