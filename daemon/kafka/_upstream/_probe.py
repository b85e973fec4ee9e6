"""A bare broker connection, and the broker's answer to a refused SCRAM login.

Two things aiokafka's public clients do not give, for ``icespool.kafka._diagnose``:

- why a bootstrap failed: ``consumer.start()`` raises ``KafkaConnectionError("Unable
  to bootstrap from [...]")`` whatever happened and only logs the cause, so one
  connection is opened with aiokafka's own ``create_conn`` (the same TLS and SASL
  code) to see the cause raised;
- what the broker said when it refused a SCRAM login: aiokafka's
  ``ScramAuthenticator.process_server_final_message`` fails with ``KeyError: 'v'`` on
  an RFC 5802 error (``e=unknown-user``), and the broker's message is only in that
  frame's ``server_final`` local, read here from the traceback.

Relies on (checked by ``_contract``): ``AIOKafkaClient.bootstrap`` failing with
"Unable to bootstrap from ...", ``aiokafka.conn.create_conn(host, port, ...)`` taking the
client's security options, and ``process_server_final_message`` with its
``server_final`` parameter.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Final

from aiokafka.conn import create_conn

__all__ = ["BOOTSTRAP_FAILED", "SCRAM_FINAL", "connect_once", "scram_final_message"]

#: What aiokafka's ``KafkaConnectionError`` says when no bootstrap server could be used.
BOOTSTRAP_FAILED: Final = "Unable to bootstrap"

#: aiokafka's ScramAuthenticator method that reads the broker's final SCRAM message.
SCRAM_FINAL: Final = "process_server_final_message"


async def connect_once(host: str, port: int, seconds: float, options: dict[str, Any]) -> Any:
    """One connection to ``host:port`` with the client's security ``options`` (bounded
    by ``seconds``), for the caller to ``close()``; raises what connecting raised."""
    return await asyncio.wait_for(
        create_conn(host, port, request_timeout_ms=int(seconds * 1000), **options), seconds
    )


def _tracebacks(exc: BaseException) -> list[TracebackType]:
    found = []
    tb = exc.__traceback__
    while tb is not None:
        found.append(tb)
        tb = tb.tb_next
    return found


def scram_final_message(exc: BaseException) -> tuple[bool, object]:
    """Whether ``exc`` was raised reading the broker's final SCRAM message, and that
    message (the ``server_final`` local, e.g. ``e=unknown-user``; None if absent)."""
    frames = [tb.tb_frame for tb in _tracebacks(exc) if tb.tb_frame.f_code.co_name == SCRAM_FINAL]
    if not frames:
        return False, None
    return True, frames[-1].f_locals.get("server_final")
