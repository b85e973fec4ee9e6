"""Why a Kafka connection failed, in words an operator can act on.

aiokafka hides the cause of a failed bootstrap: ``consumer.start()`` raises
``KafkaConnectionError("Unable to bootstrap from [...]")`` whatever happened (TLS
certificate not trusted, client certificate refused, SASL login refused) and only
logs the real error. And a SCRAM login the broker refuses with an RFC 5802 error
(``e=unknown-user``, ``e=invalid-proof``) surfaces as ``KeyError: 'v'`` from its
SCRAM client. ``connect_problem`` turns both into a reason for ``/v1/status``.

aiokafka also logs each bootstrap server it cannot reach, at error level, on every
attempt: next to the source's own "Kafka unavailable, retrying: <every server's cause>"
that made two lines per retry. `quiet_bootstrap_log` keeps those at debug level.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, KafkaError

__all__ = ["connect_problem", "quiet_bootstrap_log"]

_PROBE_SECONDS = 5.0
# aiokafka.client's messages for a bootstrap server it cannot use (logger "aiokafka").
_BOOTSTRAP_MESSAGES = frozenset(
    {'Unable connect to "%s:%s": %s', 'Unable to request metadata from "%s:%s": %s'}
)
# aiokafka's ScramAuthenticator method that reads the broker's final SCRAM message.
_SCRAM_FINAL = "process_server_final_message"
_CLIENT_KEYS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)


def _tracebacks(exc: BaseException) -> list[TracebackType]:
    found = []
    tb = exc.__traceback__
    while tb is not None:
        found.append(tb)
        tb = tb.tb_next
    return found


def _scram_refusal(exc: BaseException, options: Mapping[str, Any]) -> str | None:
    """The broker's refusal of a SCRAM login that aiokafka reports as KeyError."""
    mechanism = str(options.get("sasl_mechanism") or "")
    if not isinstance(exc, KeyError) or not mechanism.startswith("SCRAM-"):
        return None
    frames = [tb.tb_frame for tb in _tracebacks(exc) if tb.tb_frame.f_code.co_name == _SCRAM_FINAL]
    if not frames:
        return None
    said = frames[-1].f_locals.get("server_final")  # the broker's answer, e.g. e=unknown-user
    user = options.get("sasl_plain_username")
    answer = f" ({said})" if isinstance(said, str) else ""
    return f"SASL {mechanism} login refused by the broker for user {user!r}{answer}"


def _describe(exc: BaseException, options: Mapping[str, Any]) -> str:
    return _scram_refusal(exc, options) or f"{type(exc).__name__}: {exc}"


async def connect_problem(exc: BaseException, options: Mapping[str, Any]) -> str | None:
    """A reason naming the cause of ``exc`` (from connecting with the aiokafka client
    ``options``), or None when ``exc`` says enough.

    For a failed bootstrap, one bootstrap server after the other is connected to
    once more, bounded in time, with the same security settings, to learn why.
    """
    if not isinstance(exc, KafkaError | OSError):
        return _scram_refusal(exc, options)
    if not (isinstance(exc, KafkaConnectionError) and "Unable to bootstrap" in str(exc)):
        return None
    client = {key: options[key] for key in _CLIENT_KEYS if key in options}
    causes = []
    for server in options["bootstrap_servers"]:
        host, _, port = str(server).rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host.strip("[]"),
                    int(port),
                    request_timeout_ms=int(_PROBE_SECONDS * 1000),
                    **client,
                ),
                _PROBE_SECONDS,
            )
        except Exception as err:  # everything a connection attempt can raise, as text
            causes.append(f"{server}: {_describe(err, options)}")
        else:
            conn.close()
            return None  # reachable again: the next attempt will tell
    return f"cannot connect to Kafka ({'; '.join(causes)})"


class _BootstrapAtDebug(logging.Filter):
    """aiokafka's per-server bootstrap failures, as debug records (dropped above it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in _BOOTSTRAP_MESSAGES:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # The logger checked its level against the original one; check it again.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_BOOTSTRAP_FILTER = _BootstrapAtDebug()


def quiet_bootstrap_log() -> None:
    """Log aiokafka's per-server bootstrap failures at debug level (idempotent).

    When every server fails, the source's one warning names each server's cause
    (`connect_problem`); when one of several fails and another answers, debug level
    still shows which.
    """
    logger = logging.getLogger("aiokafka")
    if _BOOTSTRAP_FILTER not in logger.filters:
        logger.addFilter(_BOOTSTRAP_FILTER)
