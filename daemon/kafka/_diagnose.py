"""Why a Kafka connection failed, in words an operator can act on.

aiokafka hides the cause of a failed bootstrap: ``consumer.start()`` raises
``KafkaConnectionError("Unable to bootstrap from [...]")`` whatever happened (TLS
certificate not trusted, client certificate refused, SASL login refused) and only
logs the real error. And a SCRAM login the broker refuses with an RFC 5802 error
(``e=unknown-user``, ``e=invalid-proof``) surfaces as ``KeyError: 'v'`` from its
SCRAM client. ``connect_problem`` turns both into a reason for ``/v1/status`` (the
connection and the SCRAM frame are read through ``icespool.kafka._upstream._probe``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka.errors import KafkaConnectionError, KafkaError

from icespool.kafka._upstream._probe import BOOTSTRAP_FAILED, connect_once, scram_final_message

__all__ = ["connect_problem"]

_PROBE_SECONDS = 5.0
_CLIENT_KEYS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)


def _scram_refusal(exc: BaseException, options: Mapping[str, Any]) -> str | None:
    """The broker's refusal of a SCRAM login that aiokafka reports as KeyError."""
    mechanism = str(options.get("sasl_mechanism") or "")
    if not isinstance(exc, KeyError) or not mechanism.startswith("SCRAM-"):
        return None
    refused, said = scram_final_message(exc)  # the broker's answer, e.g. e=unknown-user
    if not refused:
        return None
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
    if not (isinstance(exc, KafkaConnectionError) and BOOTSTRAP_FAILED in str(exc)):
        return None
    client = {key: options[key] for key in _CLIENT_KEYS if key in options}
    causes = []
    for server in options["bootstrap_servers"]:
        host, _, port = str(server).rpartition(":")
        try:
            conn = await connect_once(host.strip("[]"), int(port), _PROBE_SECONDS, client)
        except Exception as err:  # everything a connection attempt can raise, as text
            causes.append(f"{server}: {_describe(err, options)}")
        else:
            conn.close()
            return None  # reachable again: the next attempt will tell
    return f"cannot connect to Kafka ({'; '.join(causes)})"
