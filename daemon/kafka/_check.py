"""``icespool check-config --connect`` for one ``[[kafka]]`` source: the brokers answer
with the configured security, and the topics the source reads are there.

The client is built from the same `client_options` the daemon's consumer uses, so a
passing check means the source's bootstrap will get past TLS and SASL. It joins no
consumer group (a check must not make a running daemon's group rebalance); it only
fetches the cluster's topic list. A failed bootstrap is explained by `connect_problem`
(the reason ``/v1/status`` would show), and the whole check is bounded by ``seconds``.
"""

from __future__ import annotations

import asyncio
import re

from aiokafka import AIOKafkaConsumer

from icespool.config import KafkaConfig
from icespool.errors import IcespoolError
from icespool.kafka._client import client_options, stop_quietly
from icespool.kafka._diagnose import connect_problem

__all__ = ["KafkaCheckError", "check_source"]


class KafkaCheckError(IcespoolError):
    """A ``[[kafka]]`` source would not connect or would find nothing to read."""


async def check_source(config: KafkaConfig, index: int, seconds: float) -> str:
    """The line describing source ``kafka[index]``; `KafkaCheckError` naming the source,
    its brokers and the reason otherwise."""
    where = f"kafka[{index}] ({', '.join(config.bootstrap_servers)})"
    try:
        options = client_options(config)
    except (OSError, ValueError) as exc:  # TLS files that do not load
        raise KafkaCheckError(f"{where}: cannot set up TLS ({type(exc).__name__}: {exc})") from None
    failure: Exception | None = None
    try:
        async with asyncio.timeout(seconds):  # one bound: connecting and saying why not
            try:
                topics = await _topics(options)
            except Exception as exc:  # everything connecting can raise, as the reason
                failure = exc
                problem = await connect_problem(exc, options) or _plain(exc)
                raise KafkaCheckError(f"{where}: {problem}") from None
    except TimeoutError:
        if failure is not None:  # the diagnosis ran out of time: the error as it came
            raise KafkaCheckError(f"{where}: {_plain(failure)}") from None
        raise KafkaCheckError(
            f"{where}: the brokers did not answer within {seconds:g} s; check "
            "bootstrap_servers, the network path and the security settings"
        ) from None
    return f"{where}: connected ({config.security_protocol}); {_topic_line(config, topics, where)}"


async def _topics(options: dict[str, object]) -> set[str]:
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **options)
    try:
        await consumer.start()
        return set(await consumer.topics())
    finally:
        await stop_quietly(consumer)


def _plain(exc: Exception) -> str:
    return f"cannot connect to Kafka ({type(exc).__name__}: {exc})"


def _topic_line(config: KafkaConfig, topics: set[str], where: str) -> str:
    """What the source would read; `KafkaCheckError` when a topic is missing."""
    if config.topic_pattern is not None:
        # As aiokafka's pattern subscription matches: from the start of the name.
        matched = sorted(t for t in topics if re.match(config.topic_pattern, t))
        return f"topic_pattern {config.topic_pattern!r} matches {len(matched)} topics now"
    missing = [t for t in config.topics if t not in topics]
    if missing:
        names = ", ".join(repr(t) for t in missing)
        what = "topic" if len(missing) == 1 else "topics"
        raise KafkaCheckError(
            f"{where}: {what} {names} not found on the brokers (or this user may not "
            "describe them); create them, or fix topics"
        )
    return f"{len(config.topics)} topics exist ({', '.join(config.topics)})"
