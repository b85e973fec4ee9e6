"""One ``[[kafka]]`` source: a consumer-group member feeding table writers exactly once.

Exactly-once rests on the offset ranges each table keeps in its own properties
(`daemon.kafka._offsets`), written in the same commit as the rows:

- on assignment the tables' ranges are read and the consumer seeks to the lowest
  position any of the source's tables needs (`daemon.kafka._partitions`);
- every record is dropped before the spool when its table already covers its
  offset, or when this assignment already handed it to the table (a re-read after
  backpressure);
- each spooled batch carries its rows' offsets and the range it covers; the commit
  drops rows another replica committed meanwhile and refuses to commit if the
  table changed under it (`OffsetClaims`, given to the writers as their claims);
- consumer-group offsets are committed to Kafka only from the tables' ranges, so
  they never run ahead of Iceberg (`daemon.kafka._commit`).

This module is the source's life: connect (with backoff), the fetch loop, the
rebalance callbacks, and the walk of one fetch: route -> (create) -> decode and
evolve through `daemon.ingest` -> dead letters -> hand each table its rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError

from daemon.config import KafkaConfig
from daemon.decode import infer_records_schema
from daemon.errors import BackpressureError, IcespoolError
from daemon.ingest import AUTO_CREATED, Ingest, Wants
from daemon.kafka._avro import AvroSchemas, avro_schemas, decode_avro
from daemon.kafka._client import (
    PROBE_TIMEOUT,
    client_options,
    new_consumer,
    new_producer,
    stop_quietly,
)
from daemon.kafka._commit import OffsetCommitter
from daemon.kafka._dead_letter import dead_letter_batch, dead_letter_headers
from daemon.kafka._decode import DeadRecord, Decoded, Fetch, decode_json, decode_raw
from daemon.kafka._diagnose import connect_problem
from daemon.kafka._offsets import OffsetBook, Ranges, batch_meta, ranges_from_properties
from daemon.kafka._partitions import Assignment, Partition, PartitionState
from daemon.kafka._raw_fetch import fetch_raw
from daemon.kafka._routing import Router, router_for
from daemon.metrics import Metrics
from daemon.retry import Backoff
from daemon.writer import TableWriter

__all__ = ["KafkaSource"]

_log = logging.getLogger("icespool.kafka")
_POLL_MS = 200
#: Reconnecting to brokers that are gone: from half a second up to 30 s.
_RECONNECT = Backoff(attempts=1, base=0.5, cap=30.0)
_INIT_RETRY = 2.0
# Where a partition remembers how far dead letters went when they go to a topic.
_DEAD_LETTER_TOPIC = "<dead-letter topic>"
# What aiokafka raises for a record it cannot parse: CorruptRecordException from
# its Python reader or a bad CRC, UnicodeDecodeError (a ValueError) from its C reader.
_UNPARSEABLE = (CorruptRecordException, ValueError, IndexError)
_RAW_FETCH_BYTES = 4 << 20

#: Reads the current properties of a table straight from the catalog (blocking).
LoadProperties = Callable[[str], Mapping[str, str]]
Dead = list[tuple[DeadRecord, str | None]]


class KafkaSource:
    """Consume ``config``'s topics into the writers ``writer_for`` returns."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        name: str,
        ingest: Ingest,
        writer_for: Callable[[str], TableWriter],
        book_for: Callable[[str], OffsetBook],
        load_properties: LoadProperties,
        spool_has_room: Callable[[], bool],
        metrics: Metrics,
        table_names: Sequence[str],
        max_nesting_depth: int,
    ) -> None:
        self.config = config
        self.name = name
        self._ingest = ingest
        self._writer_for = writer_for
        self._load_properties = load_properties
        self._spool_has_room = spool_has_room
        self._metrics = metrics
        # [defaults]: for routes without a table yet (routing, auto_create inference).
        self._max_depth = max_nesting_depth
        self._router: Router = router_for(config, table_names, max_nesting_depth)
        self.dead_letter_table = config.dead_letter_table
        self._avro: AvroSchemas | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts = Assignment(name, metrics)
        self._offsets = OffsetCommitter(
            source=name,
            group_id=config.group_id,
            tables=lambda: self.tables,
            writer_for=writer_for,
            book_for=book_for,
            metrics=metrics,
        )
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.connected = False
        self._last_tick = time.monotonic()
        self._init_retry_at = 0.0
        self._last_error = ""

    @property
    def tables(self) -> list[str]:
        """Every table this source writes, its dead-letter table included."""
        dead = [self.dead_letter_table] if self.dead_letter_table else []
        return [*self._router.targets, *dead]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-{self.name}")

    async def stop_fetching(self, grace: float = 10.0) -> None:
        """Stop consuming (the current fetch finishes being spooled)."""
        self._stop.set()
        if self._task is None:
            return
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        """After the writers' final commits: record offsets, commit them to Kafka, leave."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            if self.connected:
                try:
                    async with self._lock:
                        parts = self._parts.ready()
                        await self._offsets.advance_idle(parts)
                        await self._offsets.commit_group(consumer, parts)
                except Exception as exc:
                    _log.warning("%s: final offset commit failed: %s", self.name, exc)
            await stop_quietly(consumer)
        if self._producer is not None:
            await stop_quietly(self._producer)
            self._producer = None
        self.connected = False

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        parts = sorted(self._parts, key=lambda p: (p.tp.topic, p.tp.partition))
        return {
            "name": self.name,
            "group_id": self.config.group_id,
            "connected": self.connected,
            "last_error": self._last_error or None,
            "assignments": [
                {
                    "topic": p.tp.topic,
                    "partition": p.tp.partition,
                    "position": p.position,
                    "committed": p.kafka_committed,
                    "lag": p.lag,
                    "paused": p.state.value == "paused",
                    "state": p.state.value,
                }
                for p in parts
            ],
        }

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                await self._connect()
                failures = 0
                await self._consume()
            except (KafkaError, OSError) as exc:
                problem = await connect_problem(exc, client_options(self.config))
                await self._disconnected(exc, problem)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # aiokafka raises KeyError for a refused SCRAM login: a connect problem.
                problem = await connect_problem(exc, client_options(self.config))
                if problem is None:
                    # A bug must not stop ingestion silently: log it, start over.
                    _log.exception("%s: consumer loop failed; restarting it", self.name)
                await self._disconnected(exc if problem else None, problem)
            else:
                continue
            failures += 1
            await self._sleep(_RECONNECT.delay(failures))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _disconnected(self, exc: BaseException | None, problem: str | None = None) -> None:
        if exc is not None:
            self._last_error = problem or f"{type(exc).__name__}: {exc}"
            _log.warning("%s: Kafka unavailable, retrying: %s", self.name, self._last_error)
        self._set_connected(False)
        consumer, self._consumer = self._consumer, None
        self._parts.clear()
        if consumer is not None:
            await stop_quietly(consumer)

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self._metrics.kafka_connected.set(1 if connected else 0)

    async def _connect(self) -> None:
        c = self.config
        self._consumer = await new_consumer(c, _Listener(self))
        if c.dead_letter != "table" and self._producer is None:
            self._producer = await new_producer(c)
        self._last_error = ""
        self._set_connected(True)
        _log.info(
            "%s: connected to %s as group %s",
            self.name,
            ",".join(c.bootstrap_servers),
            c.group_id,
            extra={"source": self.name},
        )

    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        # getmany() blocks while no partitions are assigned (a rejoin that cannot
        # finish without brokers), so reachability is watched by a task of its own.
        async with asyncio.TaskGroup() as group:
            watch = group.create_task(self._watch(consumer), name=f"kafka-watch-{self.name}")
            try:
                await self._fetch_loop(consumer)
            finally:
                watch.cancel()

    async def _watch(self, consumer: AIOKafkaConsumer) -> None:
        while not self._stop.is_set():
            await self._sleep(self.config.offset_commit_interval)
            await self._probe(consumer)

    async def _fetch_loop(self, consumer: AIOKafkaConsumer) -> None:
        while not self._stop.is_set():
            self._resume_ready(consumer)
            try:
                fetched = await consumer.getmany(timeout_ms=_POLL_MS)
            except _UNPARSEABLE as exc:
                async with self._lock:
                    await self._read_past_unparseable(consumer, exc)
                continue
            async with self._lock:
                await self._init_partitions(consumer)
                for tp, records in fetched.items():
                    if records:
                        await self._process(consumer, tp, records)
                if time.monotonic() - self._last_tick >= self.config.offset_commit_interval:
                    await self._tick(consumer)

    async def _probe(self, consumer: AIOKafkaConsumer) -> None:
        """Ask the brokers for metadata: getmany() only returns nothing when they are
        gone (aiokafka reconnects by itself), so this is how /readyz learns of it."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await consumer.topics()
        except (KafkaError, OSError, TimeoutError) as exc:
            if self.connected:
                self._last_error = (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
                _log.warning("%s: Kafka unreachable: %s", self.name, self._last_error)
            self._set_connected(False)
            return
        if not self.connected:
            _log.info("%s: Kafka reachable again", self.name)
        self._last_error = ""
        self._set_connected(True)

    # ------------------------------------------------------------------ assignment

    async def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None or not partitions:
            return
        async with self._lock:
            # Nothing is fetched until the tables say where to resume.
            self._parts.assign(consumer, partitions)
            await self._init_partitions(consumer)

    async def _init_partitions(self, consumer: AIOKafkaConsumer) -> None:
        """Read the tables' offsets for waiting partitions, seek, and start fetching.

        A catalog that cannot be read leaves them waiting; the fetch loop retries.
        """
        waiting = self._parts.waiting()
        if not waiting or time.monotonic() < self._init_retry_at:
            return
        tables = self.tables
        try:
            props = {
                table: await asyncio.to_thread(self._load_properties, table) for table in tables
            }
        except Exception as exc:  # catalog down or slow: retry, never guess
            self._init_retry_at = time.monotonic() + _INIT_RETRY
            _log.warning(
                "%s: cannot read committed offsets from the tables (%s: %s); partitions "
                "stay paused until the catalog answers",
                self.name,
                type(exc).__name__,
                exc,
            )
            return
        group = self.config.group_id
        for part in waiting:
            tp = part.tp
            committed = {
                t: ranges_from_properties(props[t], group, tp.topic, tp.partition) for t in tables
            }
            resume = self._parts.start_fetching(consumer, part, committed)
            _log.info(
                "%s: assigned %s[%d], resuming at %s",
                self.name,
                tp.topic,
                tp.partition,
                "the group's offset" if resume is None else resume,
                extra={"topic": tp.topic, "partition": tp.partition},
            )

    async def revoked(self, partitions: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        async with self._lock:
            gone = self._parts.revoke(partitions)
            if not gone:
                return
            # Commit what we hold before another member takes these partitions over.
            flushes = [
                self._writer_for(t).flush("revoke")
                for t in self.tables
                if self._writer_for(t).pending_records
            ]
            for result in await asyncio.gather(*flushes, return_exceptions=True):
                if isinstance(result, BaseException):
                    _log.warning(
                        "%s: flush on revoke failed (the spool keeps the records; the next "
                        "owner's commits make ours drop what it commits first): %s",
                        self.name,
                        result,
                    )
            ready = [p for p in gone if p.ready]
            try:
                await self._offsets.advance_idle(ready)
                if consumer is not None:
                    await self._offsets.commit_group(consumer, ready)
            except Exception as exc:
                _log.warning("%s: offset commit on revoke failed: %s", self.name, exc)

    # ------------------------------------------------------------------ unparseable records

    async def _read_past_unparseable(self, consumer: AIOKafkaConsumer, exc: Exception) -> None:
        """aiokafka could not parse a record (a header key that is not UTF-8, a bad
        CRC): its getmany raises at that position on every call. Each fetching
        partition is read once by `fetch_raw` instead, from the next offset this
        source has not processed (which also re-reads whatever the failed getmany
        had taken from other partitions): parseable records go on as usual, the
        others become dead letters (reason ``unparseable``) with what bytes could be
        recovered and their offsets, and the consumer continues after them."""
        _log.warning(
            "%s: Kafka returned a record the client cannot parse (%s: %s); reading the "
            "partitions' raw batches to dead-letter it",
            self.name,
            type(exc).__name__,
            exc,
        )
        for part in self._parts.fetching():
            tp = part.tp
            try:
                offset = part.position
                if offset is None:
                    offset = await self._first_offset(consumer, tp)
                records, after = await fetch_raw(
                    consumer._client, tp, offset, _RAW_FETCH_BYTES, PROBE_TIMEOUT
                )
            except (KafkaError, OSError, TimeoutError) as error:
                # Back to what was processed: the failed getmany may have taken
                # records of this partition; the next round reads them again.
                _log.warning("%s: raw fetch of %s[%d] failed: %r", self.name, *tp, error)
                if part.position is not None:
                    consumer.seek(tp, part.position)
                continue
            if records:
                problems = {r.offset: r.problem for r in records if r.problem is not None}
                await self._process(consumer, tp, records, problems)
            if self._parts.get(tp) is part and part.state is PartitionState.FETCHING:
                consumer.seek(tp, after)

    async def _first_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """Where consuming ``tp`` starts when the tables know nothing of it."""
        async with asyncio.timeout(PROBE_TIMEOUT):
            committed = await consumer.committed(tp)
            if committed is not None:
                return int(committed)
            if self.config.auto_offset_reset == "earliest":
                edges = await consumer.beginning_offsets([tp])
            else:
                edges = await consumer.end_offsets([tp])
        return int(edges[tp])

    # ------------------------------------------------------------------ one fetch

    async def _process(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[Any],
        unparseable: Mapping[int, str] | None = None,
    ) -> None:
        part = self._parts.get(tp)
        if part is None or part.state is not PartitionState.FETCHING:
            return  # revoked meanwhile, or fetched just before the pause
        fetch = Fetch(
            tp.topic,
            tp.partition,
            np.fromiter((r.offset for r in records), np.int64, len(records)),
            [r.value for r in records],
            [r.key for r in records],
            [r.timestamp for r in records],
            [r.headers for r in records],
        )
        self._metrics.kafka_records.labels(topic=tp.topic).inc(len(records))
        part.begin(int(fetch.offsets[0]), self.tables)
        last = int(fetch.offsets[-1])
        per_table, dead = await self._decode(fetch)
        if unparseable:
            dead = _set_aside(fetch, per_table, dead, unparseable)
        if not self._has_room(per_table, dead):
            self._parts.pause(consumer, part, int(fetch.offsets[0]))
            return
        try:
            # Dead letters first: the tables' offset claims cover the dead records too,
            # so with a dead-letter topic a crash must find them sent already.
            if dead:
                await self._dead_letters(part, fetch, dead, last)
            for table, decoded in per_table.items():
                if decoded.batch is not None:
                    await self._hand(part, table, decoded.batch, fetch.offsets[decoded.rows], last)
        except (BackpressureError, KafkaError) as exc:
            # What was handed stays handed (and is skipped on the re-read).
            _log.info("%s: pausing %s[%d]: %s", self.name, tp.topic, tp.partition, exc)
            self._parts.pause(consumer, part, int(fetch.offsets[0]))
            return
        part.position = last + 1

    async def _decode(self, fetch: Fetch) -> tuple[dict[str, Decoded], Dead]:
        """Route, create the tables unknown routes name (``auto_create``), then decode
        each table's records through the way in (which evolves the table where its
        policy allows). Dead records come back in fetch order."""
        subsets, dead = await asyncio.to_thread(self._router.route, fetch)
        unknown = any(d.reason == "unknown_route" for d, _ in dead)
        if unknown and self.config.auto_create and await self._create_routes(fetch, dead):
            subsets, dead = await asyncio.to_thread(self._router.route, fetch)
        out: dict[str, Decoded] = {}
        for table, rows in subsets.items():
            writer = self._writer_for(table)
            subset = None if len(rows) == len(fetch.offsets) else rows

            decoded, refused = await self._ingest.decoded(
                writer,
                functools.partial(self._decode_table, fetch, subset=subset, writer=writer),
                functools.partial(self._wants, fetch, writer=writer),
            )
            out[table] = decoded
            for record in decoded.dead:
                change = refused.get(record.column or "")
                if change is not None:  # the table's policy refuses what it needs
                    record = replace(record, reason="schema_change", error=str(change))
                dead.append((record, table))
        dead.sort(key=lambda item: item[0].index)
        return out, dead

    def _decode_table(
        self,
        fetch: Fetch,
        schema: pa.Schema,
        *,
        subset: npt.NDArray[np.int64] | None,
        writer: TableWriter,
    ) -> Decoded:
        c = self.config
        common: dict[str, Any] = {
            "metadata_columns": c.metadata_columns,
            "max_record_bytes": c.max_record_bytes,
            "subset": subset,
        }
        if c.format == "raw":
            return decode_raw(fetch, schema, **common)
        options = self._ingest.json_options(writer)
        if c.format == "avro":
            if self._avro is None:
                self._avro = avro_schemas(c)
            return decode_avro(
                fetch, schema, schemas=self._avro, max_depth=options.max_depth, **common
            )
        return decode_json(fetch, schema, options=options, **common)

    def _wants(self, fetch: Fetch, decoded: Decoded, *, writer: TableWriter) -> Wants | None:
        """The columns the dead records of a JSON decode lacked, with their values."""
        if self.config.format != "json":
            return None
        failed = [d for d in decoded.dead if d.column is not None]
        if not failed:
            return None
        values = [fetch.values[d.index] or b"" for d in failed]
        columns = frozenset(d.column for d in failed if d.column is not None)
        depth = self._ingest.json_options(writer).max_depth
        return Wants(columns, lambda: infer_records_schema(values, columns, depth), exact=False)

    async def _create_routes(self, fetch: Fetch, dead: Dead) -> bool:
        """With ``auto_create``: create the tables unknown routes name, from the
        inferred schema of their records. Returns whether one was created."""
        wanted: dict[str, list[bytes]] = {}
        for record, table in dead:
            if record.reason == "unknown_route" and table is not None:
                wanted.setdefault(table, []).append(fetch.values[record.index] or b"")
        created = False
        for table, values in wanted.items():
            try:
                await self._ingest.create(
                    table,
                    functools.partial(infer_records_schema, values, None, self._max_depth),
                    evolve=AUTO_CREATED,
                )
            except (IcespoolError, ValueError) as exc:
                _log.warning("%s: cannot create %s for its route: %s", self.name, table, exc)
                continue
            self._router.add(table)
            for part in self._parts:
                # Its coverage starts with this assignment: records before were not
                # its (they went to the dead-letter destination as unknown routes).
                if part.start is not None:
                    part.handed.setdefault(table, part.start - 1)
                part.committed.setdefault(table, Ranges())
            created = True
        return created

    def _has_room(self, per_table: Mapping[str, Decoded], dead: Sequence[object]) -> bool:
        if not self._spool_has_room():
            return False
        tables = [t for t, d in per_table.items() if d.batch is not None]
        if dead and self.dead_letter_table:
            tables.append(self.dead_letter_table)
        return all(self._writer_for(t).has_capacity() for t in tables)

    async def _hand(
        self,
        part: Partition,
        table: str,
        batch: pa.RecordBatch,
        offsets: npt.NDArray[np.int64],
        last: int,
    ) -> npt.NDArray[np.bool_]:
        """Spool the rows ``table`` has not got yet, claiming the fetch's range up to
        ``last``; returns which rows were new."""
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
            )
            await self._writer_for(table).append(batch, meta)
        part.hand(table, last)
        return fresh

    async def _dead_letters(self, part: Partition, fetch: Fetch, dead: Dead, last: int) -> None:
        offsets = fetch.offsets[np.asarray([d.index for d, _ in dead], dtype=np.int64)]
        dlt = self.dead_letter_table
        if dlt is not None:
            batch = dead_letter_batch(fetch, dead, self._writer_for(dlt).arrow_schema)
            fresh = await self._hand(part, dlt, batch, offsets, last)
        else:
            # At least once: a crash between send and the next offset commit re-sends.
            assert self._producer is not None
            fresh = part.fresh(_DEAD_LETTER_TOPIC, offsets)
            for (record, target), new in zip(dead, fresh, strict=True):
                if new:
                    await self._producer.send_and_wait(
                        self.config.dead_letter,
                        value=fetch.values[record.index],
                        key=fetch.keys[record.index],
                        headers=dead_letter_headers(fetch, record, target),
                    )
            # A re-read after backpressure skips what was already sent.
            part.hand(_DEAD_LETTER_TOPIC, last)
        for (record, target), new in zip(dead, fresh, strict=True):
            if new:
                self._metrics.dead_letters.labels(table=target or "", reason=record.reason).inc()

    # ------------------------------------------------------------------ backpressure

    def _resume_ready(self, consumer: AIOKafkaConsumer) -> None:
        if not self._parts.any_paused() or not self._spool_has_room():
            return
        if not all(self._writer_for(t).has_capacity() for t in self.tables):
            return
        self._parts.resume_all(consumer)

    # ------------------------------------------------------------------ offsets

    async def _tick(self, consumer: AIOKafkaConsumer) -> None:
        self._last_tick = time.monotonic()
        parts = self._parts.ready()
        try:
            await self._offsets.advance_idle(parts)
        except Exception as exc:  # the catalog is down: retried at the next tick
            _log.warning("%s: recording consumed offsets failed: %s", self.name, exc)
        await self._offsets.commit_group(consumer, parts)


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


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self._source.revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        await self._source.assigned(list(assigned))
