"""A source that drains a backlog commits its tables once it has caught up.

``batch_timeout`` bounds how long a record waits for company before its snapshot is
committed. Records read from a backlog (a start after downtime, a new consumer group
on an old topic) are late already, and once the source is at the end of its
partitions nothing more is coming at that pace: waiting out the timer for the last,
partial batch only delays rows that could be visible now (up to a whole
``batch_timeout`` after the backlog was read). So a source that was behind by at
least one batch (the smallest ``max_batch_records`` of its tables; what a poll
returned counts) asks the tables of its that hold records to commit as soon as it has
processed every partition it fetches up to its end, or a poll finds nothing more
(commit reason ``caught_up``): each table whose own ``max_batch_records`` the source
was behind by. A table with a larger batch than the backlog would have waited for its
timer had those records come live, so it still does: a burst of live traffic a poll
reads at once must not commit a table configured for few, large snapshots at every
burst because another table of the source takes small batches. Live traffic that the
source keeps up with never gets that far behind, so it keeps committing at its
triggers; a source that never catches up commits at them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer

from icespool.kafka._partitions import Partition, PartitionState
from icespool.write.writer import TableWriter

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
        self._backlog = 0  # the most records the source was behind since it caught up

    def check(self, consumer: AIOKafkaConsumer, parts: Iterable[Partition], fetched: int) -> None:
        """After a poll of ``fetched`` records (0: it found nothing) was processed:
        commit the tables now if that drained a backlog of one of their batches."""
        writers = []
        for table in self._tables():
            with contextlib.suppress(Exception):  # degraded, awaiting a schema, draining
                writers.append(self._writer_for(table))
        batch = min((w.settings.max_batch_records for w in writers), default=0)
        backlog = self.drained(fetched, fetch_lag(consumer, parts), batch) if batch else 0
        for writer in writers:
            if backlog >= writer.settings.max_batch_records:
                writer.commit_soon("caught_up")

    def drained(self, fetched: int, lag: int | None, batch: int) -> int:
        """The backlog the source just drained (the most records it was behind), if it
        was at least ``batch``, now that it is ``lag`` records from the end after
        processing a fetch of ``fetched`` (so it was ``fetched + lag`` behind before);
        0 when it did not just drain one."""
        if lag is None:
            return 0
        if fetched + lag >= batch:
            self._backlog = max(self._backlog, fetched + lag)
        # An empty poll is the end too: records the consumer skips (an aborted
        # transaction's, markers) stay in ``lag`` for good.
        if self._backlog and (lag == 0 or (fetched == 0 and lag < batch)):
            backlog, self._backlog = self._backlog, 0
            return backlog
        return 0
