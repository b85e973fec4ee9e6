"""One ``[[kafka]]`` source: a consumer-group member feeding table writers exactly once.

Exactly-once rests on the offset ranges each table keeps in its own properties
(`daemon.offsets`), written in the same commit as the rows:

- on assignment the tables' ranges are read and the consumer seeks to the lowest
  position any of the source's tables needs (``next_position``);
- every record is dropped before the spool when its table already covers its
  offset, or when this assignment already handed it to the table (a re-read after
  backpressure);
- each spooled batch carries its rows' offsets and the range it covers; the commit
  drops rows another replica committed meanwhile and refuses to commit if the
  table changed under it (`OffsetClaims`);
- consumer-group offsets are committed to Kafka only from the tables' ranges, so
  they never run ahead of Iceberg.

A table that receives no records of a partition (a rarely used route, the
dead-letter table) would hold the resume position back forever; when it has
nothing pending, the source records the range it consumed in a property-only
commit (``commit_offsets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError
from aiokafka.helpers import create_ssl_context

from daemon.config import KafkaConfig
from daemon.decode import JsonOptions, infer_ndjson_schema
from daemon.errors import BackpressureError, BadInputError, IcespoolError
from daemon.evolution import SchemaChangeError
from daemon.kafka._avro import avro_schemas, decode_avro
from daemon.kafka._dead_letter import dead_letter_batch, dead_letter_headers
from daemon.kafka._decode import (
    DeadRecord,
    Decoded,
    Fetch,
    decode_json,
    decode_raw,
    route_values,
    too_deep_values,
)
from daemon.kafka._diagnose import connect_problem
from daemon.kafka._raw_fetch import fetch_raw
from daemon.metrics import Metrics
from daemon.nesting import DEFAULT_MAX_DEPTH
from daemon.offsets import Ranges, batch_meta, offsets_key
from daemon.writer import TableWriter

__all__ = ["KafkaSource"]

_log = logging.getLogger("icespool.kafka")
_POLL_MS = 200
_MAX_BACKOFF = 30.0
_PROBE_TIMEOUT = 5.0
# A record names one unknown column per decode; a few rounds cover several new ones.
_EVOLVE_ROUNDS = 4
# Where a partition remembers how far dead letters went when they go to a topic.
_DEAD_LETTER_TOPIC = "<dead-letter topic>"
_ROUTE_VALUE = re.compile(r"[A-Za-z0-9_-]{1,128}")
# What aiokafka raises for a record it cannot parse: CorruptRecordException from
# its Python reader or a bad CRC, UnicodeDecodeError (a ValueError) from its C reader.
_UNPARSEABLE = (CorruptRecordException, ValueError, IndexError)
_RAW_FETCH_BYTES = 4 << 20

#: Reads the current properties of a table straight from the catalog (blocking).
LoadProperties = Callable[[str], Mapping[str, str]]
#: Creates a table from the Arrow schema of its first records; returns its writer.
CreateTable = Callable[[str, pa.Schema], Awaitable[TableWriter]]


@dataclass(slots=True)
class _Partition:
    tp: TopicPartition
    start: int | None  # first offset this assignment processed
    handed: dict[str, int] = field(default_factory=dict)  # table -> last offset covered
    committed: dict[str, Ranges] = field(default_factory=dict)  # at assignment
    position: int | None = None  # next offset to process
    paused: bool = False
    kafka_committed: int | None = None
    lag: int | None = None
    ready: bool = False  # the tables' offsets are read and the consumer sought


class KafkaSource:
    """Consume ``config``'s topics into the writers ``writer_for`` returns."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        name: str,
        writer_for: Callable[[str], TableWriter],
        load_properties: LoadProperties,
        spool_has_room: Callable[[], bool],
        metrics: Metrics,
        table_names: Sequence[str],
        json_options: Mapping[str, JsonOptions] | None = None,
        create_table: CreateTable | None = None,
        max_nesting_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self.config = config
        self.name = name
        self._writer_for = writer_for
        self._load_properties = load_properties
        self._spool_has_room = spool_has_room
        self._metrics = metrics
        self._json_options = dict(json_options or {})
        self._create_table = create_table
        # [defaults]: for routes without a table yet (routing, auto_create inference).
        self._max_nesting_depth = max_nesting_depth
        self.targets = config.targets(table_names)
        self.dead_letter_table = config.dead_letter_table
        self.tables = [*self.targets, *([self.dead_letter_table] if self.dead_letter_table else [])]
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts: dict[TopicPartition, _Partition] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.connected = False
        self._last_tick = time.monotonic()
        self._init_retry_at = 0.0
        self._last_error = ""

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
            await asyncio.wait_for(asyncio.shield(self._task), grace)
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
                        parts = [p for p in self._parts.values() if p.ready]
                        await self._advance_idle(parts)
                        await self._commit_kafka(consumer, parts)
                except Exception as exc:
                    _log.warning("%s: final offset commit failed: %s", self.name, exc)
            await consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        self.connected = False

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        parts = sorted(self._parts.values(), key=lambda p: (p.tp.topic, p.tp.partition))
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
                    "paused": p.paused,
                }
                for p in parts
            ],
        }

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                await self._connect()
                backoff = 0.5
                await self._consume()
            except (KafkaError, OSError) as exc:
                self._disconnected(exc, await connect_problem(exc, self._client_options()))
                await self._sleep(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                problem = await connect_problem(exc, self._client_options())  # SCRAM refused
                if problem is None:
                    # A bug must not stop ingestion silently: log it, start over.
                    _log.exception("%s: consumer loop failed; restarting it", self.name)
                self._disconnected(exc if problem else None, problem)
                await self._sleep(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def _disconnected(self, exc: BaseException | None, problem: str | None = None) -> None:
        if exc is not None:
            self._last_error = problem or f"{type(exc).__name__}: {exc}"
            _log.warning("%s: Kafka unavailable, retrying: %s", self.name, self._last_error)
        self.connected = False
        self._metrics.kafka_connected.set(0)
        consumer, self._consumer = self._consumer, None
        self._parts.clear()
        if consumer is not None:
            task = asyncio.ensure_future(consumer.stop())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _client_options(self) -> dict[str, Any]:
        c = self.config
        options: dict[str, Any] = {
            "bootstrap_servers": c.bootstrap_servers,
            "security_protocol": c.security_protocol,
        }
        if c.sasl_mechanism is not None:
            options["sasl_mechanism"] = c.sasl_mechanism
            options["sasl_plain_username"] = c.sasl_plain_username
            options["sasl_plain_password"] = c.sasl_plain_password
        if c.security_protocol.endswith("SSL"):
            options["ssl_context"] = create_ssl_context(
                cafile=c.ssl_cafile and str(c.ssl_cafile),
                certfile=c.ssl_certfile and str(c.ssl_certfile),
                keyfile=c.ssl_keyfile and str(c.ssl_keyfile),
                password=c.ssl_password,
            )
        return options

    async def _connect(self) -> None:
        c = self.config
        consumer = AIOKafkaConsumer(
            group_id=c.group_id,
            enable_auto_commit=False,  # offsets go to Kafka only after Iceberg has them
            auto_offset_reset=c.auto_offset_reset,
            max_poll_records=c.max_poll_records,
            session_timeout_ms=int(c.session_timeout * 1000),
            heartbeat_interval_ms=max(100, int(c.session_timeout * 1000 / 3)),
            **self._client_options(),
        )
        self._consumer = consumer
        await consumer.start()
        listener = _Listener(self)
        if c.topic_pattern is not None:
            consumer.subscribe(pattern=c.topic_pattern, listener=listener)
        else:
            consumer.subscribe(topics=c.topics, listener=listener)
        if c.dead_letter != "table" and self._producer is None:
            producer = AIOKafkaProducer(acks="all", **self._client_options())
            await producer.start()
            self._producer = producer
        self.connected = True
        self._last_error = ""
        self._metrics.kafka_connected.set(1)
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
        watch = asyncio.create_task(self._watch(consumer), name=f"kafka-watch-{self.name}")
        try:
            await self._fetch_loop(consumer)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

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
            await asyncio.wait_for(consumer.topics(), _PROBE_TIMEOUT)
        except (KafkaError, OSError, TimeoutError) as exc:
            if self.connected:
                self._last_error = (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
                _log.warning("%s: Kafka unreachable: %s", self.name, self._last_error)
            self.connected = False
            self._metrics.kafka_connected.set(0)
            return
        if not self.connected:
            _log.info("%s: Kafka reachable again", self.name)
        self.connected = True
        self._last_error = ""
        self._metrics.kafka_connected.set(1)

    # ------------------------------------------------------------------ assignment

    async def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None or not partitions:
            return
        async with self._lock:
            for tp in partitions:
                # Nothing is fetched until the tables say where to resume.
                consumer.pause(tp)
                self._parts[tp] = _Partition(tp, None)
            await self._init_partitions(consumer)

    async def _init_partitions(self, consumer: AIOKafkaConsumer) -> None:
        """Read the tables' offsets for new partitions, seek, and start fetching.

        A catalog that cannot be read leaves them paused; the fetch loop retries.
        """
        waiting = [p for p in self._parts.values() if not p.ready]
        if not waiting or time.monotonic() < self._init_retry_at:
            return
        try:
            props = {
                table: await asyncio.to_thread(self._load_properties, table)
                for table in self.tables
            }
        except Exception as exc:  # catalog down or slow: retry, never guess
            self._init_retry_at = time.monotonic() + 2.0
            _log.warning(
                "%s: cannot read committed offsets from the tables (%s: %s); partitions "
                "stay paused until the catalog answers",
                self.name,
                type(exc).__name__,
                exc,
            )
            return
        for part in waiting:
            tp = part.tp
            for table in self.tables:
                key = offsets_key(self.config.group_id, tp.topic, tp.partition)
                part.committed[table] = Ranges.parse(props[table].get(key))
            resume = _resume(part.committed.values())
            if resume is not None:
                consumer.seek(tp, resume)
                part.start = resume
                part.position = resume
                for table in self.tables:
                    part.handed[table] = resume - 1
            part.ready = True
            if not part.paused:
                consumer.resume(tp)
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
            gone = [self._parts[tp] for tp in partitions if tp in self._parts]
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
            try:
                await self._advance_idle([p for p in gone if p.ready])
                if consumer is not None:
                    await self._commit_kafka(consumer, [p for p in gone if p.ready])
            except Exception as exc:
                _log.warning("%s: offset commit on revoke failed: %s", self.name, exc)
            for part in gone:
                self._parts.pop(part.tp, None)
                if part.lag is not None:
                    self._metrics.kafka_lag.remove(part.tp.topic, str(part.tp.partition))
            self._metrics.kafka_paused.set(sum(p.paused for p in self._parts.values()))

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
        for part in [p for p in self._parts.values() if p.ready and not p.paused]:
            tp = part.tp
            try:
                offset = part.position
                if offset is None:
                    offset = await self._first_offset(consumer, tp)
                records, after = await fetch_raw(
                    consumer._client, tp, offset, _RAW_FETCH_BYTES, _PROBE_TIMEOUT
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
            if not part.paused and tp in self._parts:
                consumer.seek(tp, after)

    async def _first_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """Where consuming ``tp`` starts when the tables know nothing of it."""
        committed = await asyncio.wait_for(consumer.committed(tp), _PROBE_TIMEOUT)
        if committed is not None:
            return int(committed)
        if self.config.auto_offset_reset == "earliest":
            edges = await asyncio.wait_for(consumer.beginning_offsets([tp]), _PROBE_TIMEOUT)
        else:
            edges = await asyncio.wait_for(consumer.end_offsets([tp]), _PROBE_TIMEOUT)
        return int(edges[tp])

    # ------------------------------------------------------------------ records

    async def _process(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[Any],
        unparseable: Mapping[int, str] | None = None,
    ) -> None:
        part = self._parts.get(tp)
        if part is None or part.paused or not part.ready:
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
        if part.start is None:
            part.start = int(fetch.offsets[0])
            for table in self.tables:
                part.handed.setdefault(table, part.start - 1)
        last = int(fetch.offsets[-1])
        per_table, dead = await asyncio.to_thread(self._decode, fetch)
        for _ in range(_EVOLVE_ROUNDS):
            created = await self._create_routes(fetch, dead)
            if not (await self._evolve(fetch, dead) or created):
                break
            per_table, dead = await asyncio.to_thread(self._decode, fetch)
        if unparseable:
            dead = _set_aside(fetch, per_table, dead, unparseable)
        if not self._has_room(per_table, dead):
            self._pause(consumer, part, int(fetch.offsets[0]))
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
            self._pause(consumer, part, int(fetch.offsets[0]))
            return
        part.position = last + 1

    def _decode(
        self, fetch: Fetch
    ) -> tuple[dict[str, Decoded], list[tuple[DeadRecord, str | None]]]:
        c = self.config
        dead: list[tuple[DeadRecord, str | None]] = []
        subsets: dict[str, npt.NDArray[np.int64]]
        if c.dynamic:
            depth = self._max_nesting_depth
            routes = route_values(
                fetch, field=c.route_field, header=c.route_header, max_depth=depth
            )
            deep = too_deep_values(fetch.values, range(len(routes)), depth) if c.route_field else {}
            by_table: dict[str, list[int]] = {}
            for i, route in enumerate(routes):
                table = c.route(route) if route and _ROUTE_VALUE.fullmatch(route) else None
                if table is not None and table in self.targets:
                    by_table.setdefault(table, []).append(i)
                elif i in deep:
                    dead.append((DeadRecord(i, "too_deep", deep[i]), None))
                elif table is None:
                    # A value that is not a plain name part (dots, slashes, spaces) must
                    # never become part of a table name.
                    what = c.route_field or c.route_header
                    dead.append(
                        (
                            DeadRecord(
                                i,
                                "invalid",
                                f"no usable route value in {what!r} (got {route!r}; "
                                "1-128 letters, digits, '_' or '-')",
                            ),
                            None,
                        )
                    )
                else:
                    dead.append(
                        (
                            DeadRecord(
                                i,
                                "unknown_route",
                                f"route {route!r} -> {table!r} is not a configured table",
                            ),
                            table,
                        )
                    )
            subsets = {t: np.asarray(ix, dtype=np.int64) for t, ix in by_table.items()}
        else:
            subsets = {self.targets[0]: np.arange(len(fetch.offsets), dtype=np.int64)}
        out: dict[str, Decoded] = {}
        for table, rows in subsets.items():
            schema = self._writer_for(table).arrow_schema
            subset = None if len(rows) == len(fetch.offsets) else rows
            common: dict[str, Any] = {
                "metadata_columns": c.metadata_columns,
                "max_record_bytes": c.max_record_bytes,
                "subset": subset,
            }
            if c.format == "raw":
                decoded = decode_raw(fetch, schema, **common)
            elif c.format == "avro":
                decoded = decode_avro(
                    fetch,
                    schema,
                    schemas=avro_schemas(c),
                    max_depth=self._options(table).max_depth,
                    **common,
                )
            else:
                decoded = decode_json(fetch, schema, options=self._options(table), **common)
            out[table] = decoded
            dead.extend((d, table) for d in decoded.dead)
        dead.sort(key=lambda item: item[0].index)
        return out, dead

    def _options(self, table: str) -> JsonOptions:
        # The depth from the writer's settings: a reload of max_nesting_depth applies.
        depth = self._writer_for(table).settings.max_nesting_depth
        return replace(self._json_options.get(table, JsonOptions()), max_depth=depth)

    async def _create_routes(self, fetch: Fetch, dead: list[tuple[DeadRecord, str | None]]) -> bool:
        """With ``auto_create``: create the tables unknown routes name, from the
        inferred schema of their records. Returns whether one was created."""
        if not self.config.auto_create or self._create_table is None:
            return False
        wanted: dict[str, list[bytes]] = {}
        for record, table in dead:
            if record.reason == "unknown_route" and table is not None:
                wanted.setdefault(table, []).append(fetch.values[record.index] or b"")
        created = False
        for table, values in wanted.items():
            try:
                inferred = await asyncio.to_thread(
                    _infer_columns, values, None, self._max_nesting_depth
                )
                await self._create_table(table, inferred)
            except (IcespoolError, ValueError) as exc:
                _log.warning("%s: cannot create %s for its route: %s", self.name, table, exc)
                continue
            self.targets.append(table)
            self.tables.append(table)
            for part in self._parts.values():
                # Its coverage starts with this assignment: records before were not
                # its (they went to the dead-letter destination as unknown routes).
                if part.start is not None:
                    part.handed.setdefault(table, part.start - 1)
                part.committed.setdefault(table, Ranges())
            created = True
        return created

    async def _evolve(self, fetch: Fetch, dead: list[tuple[DeadRecord, str | None]]) -> bool:
        """Evolve tables whose policy allows it for the columns their records lacked.

        Returns whether a schema changed (the fetch is decoded again). Records whose
        change the policy refuses get reason ``schema_change`` and its explanation.
        """
        if self.config.format != "json":
            return False
        changed = False
        by_table: dict[str, list[int]] = {}
        for i, (record, table) in enumerate(dead):
            if (
                record.column is not None
                and table is not None
                and table in self.targets
                and self._writer_for(table).evolve_policy != "none"
            ):
                by_table.setdefault(table, []).append(i)
        for table, positions in by_table.items():
            values = [fetch.values[dead[i][0].index] or b"" for i in positions]
            columns = {dead[i][0].column for i in positions} - {None}
            writer = self._writer_for(table)
            try:
                inferred = await asyncio.to_thread(
                    _infer_columns, values, columns, self._options(table).max_depth
                )
                plan = await writer.evolve(
                    inferred, only={c for c in columns if c is not None}, exact=False
                )
                changed = changed or bool(plan)
            except SchemaChangeError as exc:
                for i in positions:
                    record = dead[i][0]
                    if record.column == exc.column:
                        dead[i] = (replace(record, reason="schema_change", error=str(exc)), table)
            except BadInputError:
                continue  # the values are not even JSON objects: they stay invalid
        return changed

    def _has_room(self, per_table: Mapping[str, Decoded], dead: Sequence[object]) -> bool:
        if not self._spool_has_room():
            return False
        tables = [t for t, d in per_table.items() if d.batch is not None]
        if dead and self.dead_letter_table:
            tables.append(self.dead_letter_table)
        return all(self._writer_for(t).has_capacity() for t in tables)

    def _fresh(
        self, part: _Partition, key: str, offsets: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Which offsets ``key`` (a table, or the dead-letter topic) has not got yet:
        neither handed over in this assignment nor held by the table."""
        held = part.committed.get(key, Ranges()).mask(offsets)
        fresh: npt.NDArray[np.bool_] = (offsets > part.handed.get(key, -1)) & ~held
        return fresh

    async def _hand(
        self,
        part: _Partition,
        table: str,
        batch: pa.RecordBatch,
        offsets: npt.NDArray[np.int64],
        last: int,
    ) -> npt.NDArray[np.bool_]:
        """Spool the rows ``table`` has not got yet, claiming the fetch's range up to
        ``last``; returns which rows were new."""
        handed = part.handed.get(table, -1)
        fresh = self._fresh(part, table, offsets)
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
        part.handed[table] = max(handed, last)
        return fresh

    async def _dead_letters(
        self,
        part: _Partition,
        fetch: Fetch,
        dead: list[tuple[DeadRecord, str | None]],
        last: int,
    ) -> None:
        offsets = fetch.offsets[np.asarray([d.index for d, _ in dead], dtype=np.int64)]
        dlt = self.dead_letter_table
        if dlt is not None:
            batch = dead_letter_batch(fetch, dead, self._writer_for(dlt).arrow_schema)
            fresh = await self._hand(part, dlt, batch, offsets, last)
        else:
            # At least once: a crash between send and the next offset commit re-sends.
            assert self._producer is not None
            fresh = self._fresh(part, _DEAD_LETTER_TOPIC, offsets)
            for (record, target), new in zip(dead, fresh, strict=True):
                if new:
                    await self._producer.send_and_wait(
                        self.config.dead_letter,
                        value=fetch.values[record.index],
                        key=fetch.keys[record.index],
                        headers=dead_letter_headers(fetch, record, target),
                    )
            # A re-read after backpressure skips what was already sent.
            part.handed[_DEAD_LETTER_TOPIC] = max(part.handed.get(_DEAD_LETTER_TOPIC, -1), last)
        for (record, target), new in zip(dead, fresh, strict=True):
            if new:
                self._count_dead(record, target)

    def _count_dead(self, record: DeadRecord, target: str | None) -> None:
        self._metrics.dead_letters.labels(table=target or "", reason=record.reason).inc()

    # ------------------------------------------------------------------ backpressure

    def _pause(self, consumer: AIOKafkaConsumer, part: _Partition, offset: int) -> None:
        consumer.seek(part.tp, offset)
        consumer.pause(part.tp)
        if not part.paused:
            part.paused = True
            self._metrics.kafka_paused.set(sum(p.paused for p in self._parts.values()))
            _log.info(
                "%s: paused %s[%d] at offset %d (backpressure)",
                self.name,
                part.tp.topic,
                part.tp.partition,
                offset,
            )

    def _resume_ready(self, consumer: AIOKafkaConsumer) -> None:
        paused = [p for p in self._parts.values() if p.paused and p.ready]
        if not paused or not self._spool_has_room():
            return
        if not all(self._writer_for(t).has_capacity() for t in self.tables):
            return
        for part in paused:
            part.paused = False
            consumer.resume(part.tp)
        self._metrics.kafka_paused.set(0)
        _log.info("%s: resumed %d partitions", self.name, len(paused))

    # ------------------------------------------------------------------ offsets

    async def _tick(self, consumer: AIOKafkaConsumer) -> None:
        self._last_tick = time.monotonic()
        parts = [p for p in self._parts.values() if p.ready]
        try:
            await self._advance_idle(parts)
        except Exception as exc:  # the catalog is down: retried at the next tick
            _log.warning("%s: recording consumed offsets failed: %s", self.name, exc)
        await self._commit_kafka(consumer, parts)

    async def _advance_idle(self, parts: Sequence[_Partition]) -> None:
        """Record consumed ranges in tables that hold nothing pending from them."""
        for table in self.tables:
            writer = self._writer_for(table)
            if writer.pending_records:
                continue
            claims: dict[str, Ranges] = {}
            for part in parts:
                if part.start is None or part.position is None or part.position <= part.start:
                    continue
                key = offsets_key(self.config.group_id, part.tp.topic, part.tp.partition)
                known = Ranges.parse(writer.table_properties.get(key))
                claim = Ranges.of([(part.start, part.position - 1)])
                if known.union(claim) != known:
                    claims[key] = claim
            if claims:
                await writer.commit_offsets(claims)

    async def _commit_kafka(self, consumer: AIOKafkaConsumer, parts: Sequence[_Partition]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for part in parts:
            ranges = [
                Ranges.parse(
                    self._writer_for(t).table_properties.get(
                        offsets_key(self.config.group_id, part.tp.topic, part.tp.partition)
                    )
                )
                for t in self.tables
            ]
            position = _resume(ranges)
            if position is not None and position != part.kafka_committed:
                offsets[part.tp] = position
            highwater = consumer.highwater(part.tp)
            if highwater is not None:
                base = position if position is not None else part.position
                if base is not None:
                    part.lag = max(0, highwater - base)
                    self._metrics.kafka_lag.labels(
                        topic=part.tp.topic, partition=str(part.tp.partition)
                    ).set(part.lag)
        if offsets:
            # Only for lag tooling, so a broker outage must not stall consumption:
            # bounded, and retried at the next tick.
            try:
                await asyncio.wait_for(consumer.commit(offsets), _PROBE_TIMEOUT)
            except (KafkaError, TimeoutError) as exc:
                _log.warning("%s: committing offsets to Kafka failed: %r", self.name, exc)
                return
            for tp, offset in offsets.items():
                self._parts[tp].kafka_committed = offset


def _infer_columns(
    values: Sequence[bytes], columns: set[str | None] | None, max_depth: int
) -> pa.Schema:
    """The inferred types of ``columns`` (None: all) in these records (blocking).

    One inference over all of them first; when that fails (some record is bad in
    another way) record by record, keeping a column's type only when the records
    that carry it agree (long and double agree on double).
    """
    try:
        return infer_ndjson_schema(b"\n".join(values), max_depth)
    except BadInputError:
        pass
    found: dict[str, pa.DataType | None] = {}
    for value in values:
        try:
            schema = infer_ndjson_schema(value, max_depth)
        except BadInputError:
            continue
        for inferred in schema:
            if columns is not None and inferred.name not in columns:
                continue
            seen = found.setdefault(inferred.name, inferred.type)
            if seen is None or seen == inferred.type:
                continue
            numbers = {seen, inferred.type} <= {pa.int64(), pa.float64()}
            found[inferred.name] = pa.float64() if numbers else None
    return pa.schema([(name, t) for name, t in found.items() if t is not None])


def _set_aside(
    fetch: Fetch,
    per_table: dict[str, Decoded],
    dead: list[tuple[DeadRecord, str | None]],
    unparseable: Mapping[int, str],
) -> list[tuple[DeadRecord, str | None]]:
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
    kept: list[tuple[DeadRecord, str | None]] = []
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


def _resume(ranges: Iterable[Ranges]) -> int | None:
    """The lowest position any table needs (None: no table knows this partition)."""
    positions = [p for r in ranges if (p := r.next_position()) is not None]
    return min(positions) if positions else None


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self._source.revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        await self._source.assigned(list(assigned))
