"""The walk of one fetch batch of one partition: from Kafka records to spooled rows.

    route -> create the tables unknown routes name (auto_create)
          -> decode each table's records with the source's decoder
             (`icespool.decode.decoder_for`), evolving the table through
             `icespool.write.ingest`
          -> dead letters (a table or a topic) -> spool each table its new rows

Caller: `KafkaSource`, under its lock, for a partition in state FETCHING.
Affects: the partition's ``handed`` marks (never its position or state: the source
advances or pauses it by what `Handover.spool_fetch` returns).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from icespool.config import KafkaConfig
from icespool.decode import DeadRecord, Decoded, JsonOptions, Target, decoder_for
from icespool.errors import BackpressureError, IcespoolError
from icespool.kafka._dead_letter import dead_letter_batch, dead_letter_headers
from icespool.kafka._fetch import Fetch, with_metadata_fields
from icespool.kafka._offsets import Ranges, RecordMark, batch_meta
from icespool.kafka._partitions import Partition
from icespool.kafka._routing import Router
from icespool.metrics import Metrics
from icespool.runtime.fanout import CATALOG_CONCURRENCY, fan_out
from icespool.schema import SchemaChangeError
from icespool.write.ingest import AUTO_CREATED, Ingest
from icespool.write.writer import TableWriter

__all__ = ["CREATE_PER_FETCH", "Dead", "Handover"]

_log = logging.getLogger("icespool.kafka")
# Where a partition remembers how far dead letters went when they go to a topic.
_DEAD_LETTER_TOPIC = "<dead-letter topic>"
# Seconds between log lines about routes refused by max_tables (the dead-letter
# metric counts every record).
_REFUSED_LOG_EVERY = 60.0
#: Tables ``auto_create`` creates for one fetch before reading it again (each is a
#: catalog transaction, ~20-40 ms: 256 hold the source for seconds, not minutes).
CREATE_PER_FETCH = 256
Dead = list[tuple[DeadRecord, str | None]]


class Handover:
    """Spools fetched records to their tables (and dead letters to theirs) exactly once."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        source: str,
        router: Router,
        ingest: Ingest,
        writer_for: Callable[[str], TableWriter],
        producer: Callable[[], AIOKafkaProducer | None],
        spool_has_room: Callable[[], bool],
        metrics: Metrics,
        max_nesting_depth: int,
    ) -> None:
        self.config = config
        self.name = source
        self._router = router
        self._ingest = ingest
        self._writer_for = writer_for
        self._producer = producer
        self._spool_has_room = spool_has_room
        self._metrics = metrics
        self._max_depth = max_nesting_depth
        self.dead_letter_table = config.dead_letter_table
        # The one decoder of the source's format, asked for once.
        self._decoder = decoder_for(config.format, changes=config.changes, source=config)
        self.on_new_table: Callable[[str], None] = lambda table: None
        self._refused_logged_at = -_REFUSED_LOG_EVERY
        self._deferred = 0  # new routes the last decode left to create

    async def spool_fetch(
        self, part: Partition, fetch: Fetch, unparseable: Mapping[int, str] | None = None
    ) -> bool:
        """Spool what ``fetch`` holds for each table; False when there is no room
        (nothing, or only a prefix of tables, was handed: the source pauses the
        partition at the fetch's first offset and the re-read skips what was handed)."""
        tp = f"{fetch.topic}[{fetch.partition}]"
        last = int(fetch.offsets[-1])
        per_table, dead = await self.route_and_decode(fetch, create_limit=CREATE_PER_FETCH)
        if self._deferred:
            # New routes left to create: nothing is handed, the fetch is read again
            # (creating the next ones), so one fetch naming thousands of new routes
            # does not hold the source, its lock and its rebalances for minutes.
            _log.info(
                "%s: %d new routes of %s still to create; reading the fetch again",
                self.name,
                self._deferred,
                tp,
                extra={"source": self.name, "routes": self._deferred},
            )
            return False
        if unparseable:
            dead = _set_aside(fetch, per_table, dead, unparseable)
        if not self._has_room(per_table, dead):
            return False
        try:
            # Dead letters first: the tables' offset claims cover the dead records too,
            # so with a dead-letter topic a crash must find them sent already.
            mark = fetch.last_mark()
            if dead:
                await self._dead_letters(part, fetch, dead, last, mark)
            for table, decoded in per_table.items():
                if decoded.batch is not None:
                    rows = fetch.offsets[decoded.rows]
                    await self._spool_rows(part, table, decoded.batch, rows, last, mark)
        except (BackpressureError, KafkaError) as exc:
            # What was handed stays handed (and is skipped on the re-read).
            _log.info("%s: pausing %s: %s", self.name, tp, exc)
            return False
        return True

    async def route_and_decode(
        self, fetch: Fetch, *, create_limit: int | None = None
    ) -> tuple[dict[str, Decoded], Dead]:
        """Route, create the tables unknown routes name (``auto_create``; at most
        ``create_limit``, leaving the number of the others in ``_deferred``), then
        decode each table's records through the way in (which evolves the table where
        its policy allows). Dead records come back in fetch order."""
        self._deferred = 0
        subsets, dead = await asyncio.to_thread(self._router.route, fetch)
        unknown = any(d.reason == "unknown_route" for d, _ in dead)
        too_wide: dict[str, SchemaChangeError] = {}
        if (
            unknown
            and self.config.auto_create
            and await self._create_routes(fetch, dead, create_limit, too_wide)
        ):
            subsets, dead = await asyncio.to_thread(self._router.route, fetch)
        if self.config.auto_create:
            self._refused_routes(dead)
        if too_wide:  # the route's table would be wider than max_columns: not created
            dead = [
                (_refused_by(record, too_wide.get(table or "")), table)
                if record.reason == "unknown_route"
                else (record, table)
                for record, table in dead
            ]
        out: dict[str, Decoded] = {}
        for table, rows in subsets.items():
            writer = self._writer_for(table)
            whole = len(rows) == len(fetch.offsets)
            records = fetch if whole else fetch.take(rows)
            decoded, refused = await self._ingest.decode_and_evolve(writer, self._decoder, records)
            out[table] = decoded if whole else decoded.placed(rows)
            for record in out[table].dead:
                # The policy or max_columns refuses the change the record needs.
                dead.append((_refused_by(record, refused.get(record.column or "")), table))
        dead.sort(key=lambda item: item[0].index)
        return out, dead

    async def _create_routes(
        self,
        fetch: Fetch,
        dead: Dead,
        limit: int | None,
        too_wide: dict[str, SchemaChangeError],
    ) -> bool:
        """With ``auto_create``: create the tables unknown routes name, from the
        inferred schema of their records, up to the router's room (``max_tables``;
        the records of routes beyond it become ``table_limit`` dead letters when the
        fetch is routed again) and at most ``limit`` now (the rest: ``_deferred``).
        Routes whose table would pass ``max_columns`` go in ``too_wide``. Returns
        whether one was created."""
        wanted: dict[str, list[int]] = {}
        for record, table in dead:
            if record.reason == "unknown_route" and table is not None:
                wanted.setdefault(table, []).append(record.index)
        allowed = min(len(wanted), self._router.room)
        now = allowed if limit is None else min(allowed, limit)
        self._deferred = allowed - now
        chosen = list(wanted.items())[:now]
        options = JsonOptions(max_depth=self._max_depth)

        async def create(item: tuple[str, list[int]]) -> bool:
            table, positions = item
            records = fetch.take(np.asarray(positions, dtype=np.int64))

            def incoming() -> pa.Schema:
                shape = self._decoder.incoming(records, Target(table, options=options))
                # The rows will carry the source's metadata columns too.
                return with_metadata_fields(shape, self.config.metadata_columns)

            try:
                await self._ingest.create(table, incoming, evolve=AUTO_CREATED)
            except SchemaChangeError as exc:
                too_wide[table] = exc
                return False
            except (IcespoolError, ValueError) as exc:
                _log.warning("%s: cannot create %s for its route: %s", self.name, table, exc)
                return False
            self._router.add(table)
            self.on_new_table(table)
            return True

        # A fetch may name thousands of new routes: created side by side, bounded.
        results = await fan_out(
            "creating tables for new routes", chosen, create, limit=CATALOG_CONCURRENCY
        )
        return any(result is True for result in results)

    def _refused_routes(self, dead: Dead) -> None:
        """Say (at most once a minute) that ``max_tables`` refused routes."""
        now = time.monotonic()
        if now < self._refused_logged_at + _REFUSED_LOG_EVERY:
            return
        refused = {table for record, table in dead if record.reason == "table_limit"}
        if not refused:
            return
        self._refused_logged_at = now
        _log.warning(
            "%s: records for %d more tables (e.g. %s) are dead letters (reason "
            "table_limit): the source already writes max_tables = %d tables; raise "
            "[[kafka]] max_tables or fix the route values",
            self.name,
            len(refused),
            min(str(t) for t in refused),
            self.config.max_tables,
            extra={"source": self.name, "refused": len(refused)},
        )

    def _has_room(self, per_table: Mapping[str, Decoded], dead: Sequence[object]) -> bool:
        if not self._spool_has_room():
            return False
        tables = [t for t, d in per_table.items() if d.batch is not None]
        if dead and self.dead_letter_table:
            tables.append(self.dead_letter_table)
        return all(self._writer_for(t).has_capacity() for t in tables)

    async def _spool_rows(
        self,
        part: Partition,
        table: str,
        batch: pa.RecordBatch | pa.Table,
        offsets: npt.NDArray[np.int64],
        last: int,
        mark: RecordMark,
    ) -> npt.NDArray[np.bool_]:
        """Spool the rows ``table`` has not got yet, claiming the fetch's range up to
        ``last`` (whose record is ``mark``); returns which rows were new."""
        handed = part.handed.get(table, -1)
        fresh = part.fresh(table, offsets)
        dropped = int(offsets.size - fresh.sum())
        if dropped:
            self._metrics.kafka_duplicates.labels(table=table).inc(dropped)
            batch = batch.filter(pa.array(fresh))
            offsets = offsets[fresh]
        if batch.num_rows:
            meta = batch_meta(
                self.config.group_id,
                part.tp.topic,
                part.tp.partition,
                Ranges.of([(handed + 1, last)]),
                Ranges.runs(offsets),
                mark,
            )
            await self._writer_for(table).append(batch, meta)
        part.hand(table, last)
        return fresh

    async def _dead_letters(
        self, part: Partition, fetch: Fetch, dead: Dead, last: int, mark: RecordMark
    ) -> None:
        offsets = fetch.offsets[np.asarray([d.index for d, _ in dead], dtype=np.int64)]
        dlt = self.dead_letter_table
        if dlt is not None:
            batch = dead_letter_batch(fetch, dead, self._writer_for(dlt).arrow_schema)
            fresh = await self._spool_rows(part, dlt, batch, offsets, last, mark)
        else:
            # At least once: a crash between send and the next offset commit re-sends.
            producer = self._producer()
            assert producer is not None, "the source starts its producer when it connects"
            fresh = part.fresh(_DEAD_LETTER_TOPIC, offsets)
            for (record, target), new in zip(dead, fresh, strict=True):
                if new:
                    key, value = fetch.key(record.index), fetch.value(record.index)
                    await producer.send_and_wait(
                        self.config.dead_letter,
                        # A tombstone without a key (missing_key): Kafka clients send
                        # no record without both, so its value goes as empty bytes.
                        value=b"" if key is None and value is None else value,
                        key=key,
                        headers=dead_letter_headers(fetch, record, target),
                    )
            # A re-read after backpressure skips what was already sent.
            part.hand(_DEAD_LETTER_TOPIC, last)
        for (record, target), new in zip(dead, fresh, strict=True):
            if new:
                self._metrics.dead_letters.labels(table=target or "", reason=record.reason).inc()


def _set_aside(
    fetch: Fetch,
    per_table: dict[str, Decoded],
    dead: Dead,
    unparseable: Mapping[int, str],
) -> Dead:
    """Make the records at ``unparseable`` offsets dead letters (reason
    ``unparseable``) whatever their decode said; returns the new dead list."""
    positions = {
        i: unparseable[o] for i, o in enumerate(fetch.offsets.tolist()) if o in unparseable
    }
    target: dict[int, str | None] = {}  # the table each was meant for, where known
    for name, decoded in per_table.items():
        keep = np.asarray([int(i) not in positions for i in decoded.rows], dtype=bool)
        target.update((int(i), name) for i in decoded.rows[~keep])
        if decoded.batch is not None and not keep.all():
            batch = decoded.batch.filter(pa.array(keep))
            per_table[name] = Decoded(batch if batch.num_rows else None, decoded.rows[keep])
    kept: Dead = []
    for record, table in dead:
        if record.index in positions:
            target[record.index] = table
        else:
            kept.append((record, table))
    kept.extend(
        (DeadRecord(i, "unparseable", problem), target.get(i)) for i, problem in positions.items()
    )
    kept.sort(key=lambda item: item[0].index)
    return kept


def _refused_by(record: DeadRecord, change: IcespoolError | None) -> DeadRecord:
    """``record`` as a ``schema_change`` dead letter when ``change`` (a refused schema
    change it needs) is a `SchemaChangeError`, else as it is."""
    if isinstance(change, SchemaChangeError):
        return replace(record, reason="schema_change", error=str(change))
    return record
