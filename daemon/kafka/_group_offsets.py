"""A source's offsets after the tables have them: idle tables, group commits, lag.

The tables' properties are the truth (`icespool.kafka._offsets`). Two things follow
from them here, both on the source's tick, on revoke and on close:

- a table with nothing pending from a partition the source consumed (a rarely used
  route, the dead-letter table) records the consumed range in a property-only
  commit, so it does not hold the resume position back forever (`advance_idle`;
  at most `IDLE_TABLES_PER_ROUND` tables a round, the furthest behind first, so a
  source with thousands of quiet routes does not spend minutes per tick);
- the consumer group's offsets are committed to Kafka from the tables' ranges,
  never ahead of them, only for lag tooling (`commit_group`), and the lag gauge
  follows the same position.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from icespool.kafka._client import PROBE_TIMEOUT
from icespool.kafka._offsets import (
    OffsetBook,
    Ranges,
    offsets_key,
    ranges_from_properties,
    resume_position,
)
from icespool.kafka._partitions import Partition, PartitionState
from icespool.metrics import Metrics
from icespool.runtime.fanout import CATALOG_CONCURRENCY, fan_out
from icespool.write.writer import TableWriter

__all__ = ["IDLE_TABLES_PER_ROUND", "OffsetCommitter"]

_log = logging.getLogger("icespool.kafka")
#: Property-only commits of idle tables per `OffsetCommitter.advance_idle` round.
IDLE_TABLES_PER_ROUND = 64


class OffsetCommitter:
    """Records consumed ranges in idle tables and commits group offsets and lag.

    ``tables()`` are the source's tables at the moment of the call (routes created
    by ``auto_create`` join), ``writer_for`` and ``book_for`` look them up.
    ``round_seconds`` bounds one `advance_idle` round.
    """

    def __init__(
        self,
        *,
        source: str,
        group_id: str,
        tables: Callable[[], Sequence[str]],
        writer_for: Callable[[str], TableWriter],
        book_for: Callable[[str], OffsetBook],
        metrics: Metrics,
        round_seconds: float = 10.0,
    ) -> None:
        self._source = source
        self._round_seconds = round_seconds
        self._group = group_id
        self._tables = tables
        self._writer_for = writer_for
        self._book_for = book_for
        self._metrics = metrics

    async def advance_idle(self, parts: Sequence[Partition]) -> None:
        """Record consumed ranges in tables that hold nothing pending from them.

        Raises what the catalog raised (the caller logs it; the next tick retries).
        """
        consumed = [(part.tp, part.consumed()) for part in parts]
        consumed = [(tp, ranges) for tp, ranges in consumed if ranges]
        if not consumed:
            return
        # (how far the table covers, the table's writer, book and claims)
        behind: list[tuple[int, TableWriter, OffsetBook, dict[str, Ranges]]] = []
        for table in self._tables():
            writer = self._writer_for(table)
            if writer.pending_records:
                continue
            claims: dict[str, Ranges] = {}
            covered = None
            for tp, ranges in consumed:
                known = ranges_from_properties(
                    writer.table_properties, self._group, tp.topic, tp.partition
                )
                if known.union(ranges) != known:
                    claims[offsets_key(self._group, tp.topic, tp.partition)] = ranges
                    last = known.spans[-1][1] if known.spans else -1
                    covered = last if covered is None else min(covered, last)
            if claims and covered is not None:
                behind.append((covered, writer, self._book_for(table), claims))
        if len(behind) > IDLE_TABLES_PER_ROUND:
            # A round is one commit per table: with thousands of quiet routes it would
            # take minutes at every tick and on shutdown. The tables furthest behind
            # (holding the resume position back most) go first; the rest follow in
            # later rounds. Until then a restart re-reads a little more and drops what
            # the tables hold: their ranges stay exact either way.
            behind.sort(key=lambda item: item[0])
            behind = behind[:IDLE_TABLES_PER_ROUND]

        async def record(item: tuple[int, TableWriter, OffsetBook, dict[str, Ranges]]) -> bool:
            _, writer, book, claims = item
            return await writer.update_properties(book.consumed(claims))

        # Each commit runs in its table's lane; side by side (bounded), a source with
        # many quiet routes does not spend a tick per table one after the other. The
        # round is also bounded in time: the lanes may hold thousands of flushes ahead
        # of these commits, and the source holds its lock meanwhile (no fetch, no
        # rebalance callback: past max_poll_interval the group throws it out). What
        # has not started by then is dropped and retried in a later round; a commit
        # already running lands by itself, which is safe: it only claims offsets this
        # table had nothing pending from, and nothing below the partitions' positions
        # is handed to it again.
        try:
            async with asyncio.timeout(self._round_seconds):
                results = await fan_out(
                    "recording consumed offsets", behind, record, limit=CATALOG_CONCURRENCY
                )
        except TimeoutError:
            _log.info(
                "%s: recording consumed offsets of %d idle tables did not finish within "
                "%.0fs (encode lanes busy); the rest follow in later rounds",
                self._source,
                len(behind),
                self._round_seconds,
                extra={"source": self._source, "tables": len(behind)},
            )
            return
        for result in results:
            if isinstance(result, Exception):
                raise result

    async def commit_group(self, consumer: AIOKafkaConsumer, parts: Sequence[Partition]) -> None:
        """Commit to Kafka, per partition, the lowest position any table needs; set lag."""
        offsets: dict[TopicPartition, int] = {}
        for part in parts:
            tp = part.tp
            position = resume_position(
                ranges_from_properties(
                    self._writer_for(t).table_properties, self._group, tp.topic, tp.partition
                )
                for t in self._tables()
            )
            if position is not None and position != part.kafka_committed:
                offsets[tp] = position
            highwater = consumer.highwater(tp)
            base = position if position is not None else part.position
            if base is not None and base == part.position and part.state is PartitionState.FETCHING:
                # Everything processed is in the tables: what lies between it and the
                # consumer's position holds no records for them (transaction markers,
                # aborted transactions), so a partition ending in a commit marker has
                # no lag.
                base = max(base, await _fetch_position(consumer, tp, base))
            if highwater is not None and base is not None:
                part.lag = max(0, highwater - base)
                self._metrics.kafka_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    part.lag
                )
        if not offsets:
            return
        # Only for lag tooling, so a broker outage must not stall consumption:
        # bounded, and retried at the next tick.
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await consumer.commit(offsets)
        except (KafkaError, TimeoutError) as exc:
            _log.warning("%s: committing offsets to Kafka failed: %r", self._source, exc)
            return
        by_tp = {p.tp: p for p in parts}
        for tp, offset in offsets.items():
            by_tp[tp].kafka_committed = offset


async def _fetch_position(consumer: AIOKafkaConsumer, tp: TopicPartition, default: int) -> int:
    """The consumer's next fetch offset of ``tp``; ``default`` when it has none now (not
    assigned any more, or waiting for an offset reset): lag is only reported."""
    if tp not in consumer.assignment():
        return default
    try:
        async with asyncio.timeout(PROBE_TIMEOUT / 10):
            return int(await consumer.position(tp))
    except (IllegalStateError, KafkaError, TimeoutError):
        return default
