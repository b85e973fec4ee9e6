"""Kafka sources: consumer-group members that feed table writers exactly once.

_source       a source's life: connect, fetch loop, rebalances
_client       aiokafka consumer/producer options (security), creation, stop
_partitions   the assigned partitions, each in an explicit state
_routing      which table each record goes to (static, by field, by header)
_offsets      offset ranges kept in table properties; a commit's claims
_catch_up     a drained backlog commits once the source is at the end
_group_offsets  idle tables' ranges, consumer-group commits and lag
_topic_life   what happened to a partition while the tables were not looking
_fetch        one partition's records of one poll, as the arrays its decoder reads
_handover     one fetch's walk: route, decode (`icespool.decode`), dead letters, spool
_dead_letter  the dead-letter table's rows, their summary, and the topic alternative
_replay       dead letters back into their tables, exactly once
_check        check-config --connect for one source
_diagnose     why a connection failed, in an operator's words
_upstream     the fence around aiokafka's internals (batch-drained getmany, raw
              fetches, topic ids, committed offsets, connection probes, its
              bootstrap log), checked on import
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.kafka._dead_letter import (
        DEAD_LETTER_COLUMNS,
        DeadLetterGroup,
        dead_letter_schema,
        summarize_dead_letters,
    )
    from icespool.kafka._offsets import OffsetBook
    from icespool.kafka._replay import (
        FILTER_KEYS as REPLAY_FILTER_KEYS,
    )
    from icespool.kafka._replay import (
        DeadLetterReplay,
        ReplayFilter,
        ReplayResult,
        replay_group,
    )
    from icespool.kafka._source import KafkaSource

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "REPLAY_FILTER_KEYS",
    "DeadLetterGroup",
    "DeadLetterReplay",
    "KafkaSource",
    "OffsetBook",
    "ReplayFilter",
    "ReplayResult",
    "dead_letter_schema",
    "replay_group",
    "summarize_dead_letters",
]

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.kafka._dead_letter": (
            "DEAD_LETTER_COLUMNS",
            "DeadLetterGroup",
            "dead_letter_schema",
            "summarize_dead_letters",
        ),
        "icespool.kafka._offsets": ("OffsetBook",),
        "icespool.kafka._replay": (
            ("REPLAY_FILTER_KEYS", "FILTER_KEYS"),
            "DeadLetterReplay",
            "ReplayFilter",
            "ReplayResult",
            "replay_group",
        ),
        "icespool.kafka._source": ("KafkaSource",),
    },
)
