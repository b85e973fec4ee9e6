"""aiokafka's per-server bootstrap failures, logged at debug level.

aiokafka logs each bootstrap server it cannot reach, at error level, on every attempt:
next to the source's own "Kafka unavailable, retrying: <every server's cause>" that made
two lines per retry. `quiet_bootstrap_log` keeps those at debug level; when every server
fails, the source's one warning names each server's cause
(``icespool.kafka._diagnose.connect_problem``), and when one of several fails and another
answers, debug level still shows which.

Relies on (checked by ``_contract``): ``AIOKafkaClient.bootstrap`` logging exactly these
messages (the format strings, matched as they are, not their rendered text).
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["BOOTSTRAP_MESSAGES", "quiet_bootstrap_log"]

#: aiokafka.client's messages for a bootstrap server it cannot use (logger "aiokafka").
BOOTSTRAP_MESSAGES: Final = frozenset(
    {'Unable connect to "%s:%s": %s', 'Unable to request metadata from "%s:%s": %s'}
)


class _BootstrapAtDebug(logging.Filter):
    """aiokafka's per-server bootstrap failures, as debug records (dropped above it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in BOOTSTRAP_MESSAGES:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # The logger checked its level against the original one; check it again.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_BOOTSTRAP_FILTER = _BootstrapAtDebug()


def quiet_bootstrap_log() -> None:
    """Log aiokafka's per-server bootstrap failures at debug level (idempotent)."""
    logger = logging.getLogger("aiokafka")
    if _BOOTSTRAP_FILTER not in logger.filters:
        logger.addFilter(_BOOTSTRAP_FILTER)
