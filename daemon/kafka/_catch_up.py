"""A source that drains a backlog commits its tables once it has caught up.

``batch_timeout`` bounds how long a record waits for company before its snapshot is
committed. Records read from a backlog (a start after downtime, a new consumer group
on an old topic) are late already, and once the source is at the end of its
partitions nothing more is coming at that pace: waiting out the timer for the last,
partial batch only delays rows that could be visible now (up to a whole
``batch_timeout`` after the backlog was read). So a source that was behind by at
least one batch (the smallest ``max_batch_records`` of its tables; what a poll
returned counts) asks every table of its that holds records to commit as soon as it
has processed every partition it fetches up to its end, or a poll finds nothing more
(commit reason ``caught_up``). Live traffic that the source keeps up with never gets
that far behind, so it keeps committing at its triggers; a source that never catches
up commits at them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer

from icespool.kafka._partitions import Partition, PartitionState
from icespool.writer import TableWriter

__all__ = ["CatchUp", "fetch_lag"]


def fetch_lag(consumer: AIOKafkaConsumer, parts: Iterable[Partition]) -> int | None:
    """Records between what the source processed and the end of its partitions, as the
    consumer's last fetch saw the end; None while that cannot be told (a partition
    waiting for its position or paused by backpressure, no fetch answered yet)."""
    total = 0
    for part in parts:
        if part.state is not PartitionState.FETCHING:
            return None
        highwater = consumer.highwater(part.tp)
        if highwater is None:
            return None
        if part.position is not None:
            total += max(0, highwater - part.position)
    return total


class CatchUp:
    """Commits a source's tables when a backlog was drained: behind by a batch, then
    (once) at the end."""

    def __init__(
        self, *, tables: Callable[[], Iterable[str]], writer_for: Callable[[str], TableWriter]
    ) -> None:
        self._tables = tables
        self._writer_for = writer_for
        self._behind = False

    def check(self, consumer: AIOKafkaConsumer, parts: Iterable[Partition], fetched: int) -> None:
        """After a poll of ``fetched`` records (0: it found nothing) was processed:
        commit every table now if that drained a backlog."""
        writers = []
        for table in self._tables():
            with contextlib.suppress(Exception):  # degraded, awaiting a schema, draining
                writers.append(self._writer_for(table))
        batch = min((w.settings.max_batch_records for w in writers), default=0)
        if batch and self.drained(fetched, fetch_lag(consumer, parts), batch):
            for writer in writers:
                writer.commit_soon("caught_up")

    def drained(self, fetched: int, lag: int | None, batch: int) -> bool:
        """Whether the source, ``lag`` records from the end after processing a fetch of
        ``fetched`` (so it was ``fetched + lag`` behind before), just drained a backlog."""
        if lag is None:
            return False
        if fetched + lag >= batch:
            self._behind = True
        # An empty poll is the end too: records the consumer skips (an aborted
        # transaction's, markers) stay in ``lag`` for good.
        if self._behind and (lag == 0 or (fetched == 0 and lag < batch)):
            return self._caught_up()
        return False

    def _caught_up(self) -> bool:
        self._behind = False
        return True
