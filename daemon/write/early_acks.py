"""Acks while the start waits for the catalog, for tables whose schema is known without it.

While `icespool.lifecycle.startup.load_catalog_waiting` retries, an HTTP record body for a
``[[tables]]`` entry with a known schema is decoded against that schema and spooled
(the ack, durable per ``spool.durability`` as always); once the catalog answers, the
gate shuts, the appends in flight finish, and start-up recovery commits what was
acked with the spool's leftovers (each segment exactly once, as any leftover).

A table's schema is known when:

- the spool recorded it (`spool.Spool.schemas`: the schema of its newest segment, kept
  after the segment was committed); that is the table as the last run wrote it,
  Iceberg field ids and evolved columns included;
- else its ``schema`` is declared; its field ids are left out, so the records map to
  the existing table's columns by name when they are committed.

A body that does not fit the known schema (a new field, a wrong type) is refused with
503 + Retry-After naming the column: only the catalog's table can say whether it
takes it (schema evolution, a change made elsewhere), so it is neither acked nor
answered 400. Malformed bodies are 400 as always. Every other table, and keyed change
bodies (POST .../changes), wait for the catalog (503). Kafka sources start only after
recovery, so they consume nothing meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from icespool.cdc import OP_COLUMN, spoolable
from icespool.config import Config, TableConfig
from icespool.decode import JsonOptions, RecordArrays, Target, decoder_for
from icespool.errors import BackpressureError, BadInputError, SchemaError
from icespool.metrics import Metrics
from icespool.schema import arrow_schema_for, parse_schema
from icespool.spool import AppendAck, SegmentInfo, Spool, SpoolError, SpoolIOError

__all__ = ["EarlyAcks", "known_schemas"]

_log = logging.getLogger("icespool.service")
# Messages name this many tables accepted while waiting, then only count them.
_NAMED = 5


class _StartWait(Protocol):
    """What the start is waiting for (the lifecycle's ``StartWait``), as the refusals
    quote it."""

    def reason(self) -> str: ...

    def retry_after(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Known:
    """The schema a table's records are spooled in while the catalog is awaited."""

    table: TableConfig
    schema: pa.Schema
    source: str  # where it comes from, for messages


class EarlyAcks:
    """The gate for records acked before the catalog answered (see the module doc)."""

    def __init__(self, config: Config, spool: Spool, metrics: Metrics) -> None:
        self._config = config
        self._spool = spool
        self._metrics = metrics
        self._known = known_schemas(config, spool.schemas)
        self._wait: _StartWait | None = None
        self._appends: set[asyncio.Future[AppendAck]] = set()
        self._reserved: dict[str, int] = {}
        self._acked: dict[str, int] = {}  # records acked while waiting, per table

    def waiting(self, wait: _StartWait | None) -> None:
        """The start's wait as it stands (None: the catalog answered: the gate shuts)."""
        if wait is not None and self._wait is None and self._known:
            _log.warning(
                "while waiting for the catalog, records are acked for the tables whose "
                "schema is known (%s); the others are answered 503",
                _listed(sorted(self._known)),
                extra={"tables": len(self._known)},
            )
        self._wait = wait

    def accepts(self, name: str) -> bool:
        return self._wait is not None and name in self._known

    def accepting(self) -> list[str]:
        """The tables whose records are acked now (empty unless waiting)."""
        return sorted(self._known) if self._wait is not None else []

    def note(self) -> str:
        """What /readyz adds to the wait's reason."""
        names = self.accepting()
        if not names:
            return ""
        return (
            f"; records for {_listed(names)} (schema known) are accepted meanwhile "
            "(/v1/status accepting_while_waiting)"
        )

    async def shut(self) -> None:
        """Shut the gate and let the appends in flight finish."""
        self._wait = None
        if self._appends:
            await asyncio.wait(set(self._appends))

    async def settled(self) -> list[SegmentInfo]:
        """`shut`, then seal what was appended; returns the segments acked while
        waiting (sealed; those the spool recovered at open are not among them)."""
        await self.shut()
        recovered = {s.id for s in self._spool.recovered.segments}
        segments: list[SegmentInfo] = []
        for name in sorted(self._acked):
            try:
                await self._spool.seal(name)
            except SpoolIOError as exc:
                # The spool kept the segment's acked prefix as sealed (a full disk needs
                # not one more byte for it): committed with the rest, as a flush does.
                _log.warning(
                    "%s: sealing the records acked while waiting failed (%s); committing "
                    "what the spool kept of them",
                    name,
                    exc,
                    extra={"table": name},
                )
            segments += [s for s in self._spool.segments(name) if s.id not in recovered]
        if self._acked:
            _log.info(
                "%d records were acked while waiting for the catalog (%s); committing them "
                "with the spool's leftovers",
                sum(self._acked.values()),
                ", ".join(f"{n}: {c}" for n, c in sorted(self._acked.items())),
                extra={"records": sum(self._acked.values())},
            )
        return segments

    async def ingest_body(self, name: str, body: bytes, content_type: str, *, changes: bool) -> int:
        """Decode an HTTP body for ``name`` against its known schema and spool all of
        it, or none of it; returns the records acked. Raises `BadInputError` (400),
        `BackpressureError` (503: does not fit, full, or the gate shut meanwhile)."""
        known = self._known[name]
        if changes:
            raise self._refused("keyed changes are taken once the catalog answers")
        settings = self._config.table_settings(name)
        options = JsonOptions.for_table(known.table, settings.max_nesting_depth)
        try:
            batch = await asyncio.to_thread(_decode, known, options, body, content_type)
        except SchemaError as exc:
            raise self._refused(
                f"the records do not fit the schema of table {name} known while waiting "
                f"({known.source}): {exc}; whether the table takes them (schema evolution, "
                "a change made elsewhere) is known once the catalog answers"
            ) from None
        if batch.num_rows == 0:
            return 0
        self._check_room(name, batch.nbytes, settings.max_queue_bytes)
        if self._wait is None:
            raise BackpressureError(
                "the catalog answered: the daemon is starting (recovery); nothing was "
                "accepted, retry shortly",
                retry_after=1.0,
            )
        # A task of its own: a client that hangs up must not cancel a half-done
        # append, and `settled` waits for it before recovery lists the segments.
        append = asyncio.ensure_future(self._spool.append(name, batch))
        self._appends.add(append)
        append.add_done_callback(self._appends.discard)
        self._reserved[name] = self._reserved.get(name, 0) + batch.nbytes
        try:
            await asyncio.shield(append)
        except SpoolError as exc:
            self._metrics.backpressure.labels(table=name, reason="spool").inc()
            raise self._refused(
                f"{exc}; room comes back once the catalog answers and the spooled records "
                "are committed"
            ) from exc
        finally:
            self._reserved[name] -= batch.nbytes
        rows: int = batch.num_rows
        self._acked[name] = self._acked.get(name, 0) + rows
        self._metrics.records_acked.labels(table=name).inc(rows)
        return rows

    def _check_room(self, name: str, incoming: int, limit: int) -> None:
        """max_queue_bytes holds while waiting: every byte spooled waits for commit."""
        queued = sum(s.bytes for s in self._spool.segments(name)) + self._reserved.get(name, 0)
        open_segment = self._spool.open_segment(name)
        if open_segment is not None:
            queued += open_segment[1]
        if queued and queued + incoming >= limit:
            self._metrics.backpressure.labels(table=name, reason="queue").inc()
            raise self._refused(
                f"table {name} has {queued} bytes waiting for commit (max_queue_bytes {limit})"
            )

    def _refused(self, why: str) -> BackpressureError:
        wait = self._wait
        reason = "the catalog answered: the daemon is starting" if wait is None else wait.reason()
        return BackpressureError(
            f"{why}; nothing was accepted, retry after the Retry-After seconds ({reason})",
            retry_after=1.0 if wait is None else wait.retry_after(),
        )


def known_schemas(config: Config, recorded: Mapping[str, pa.Schema]) -> dict[str, Known]:
    """The ``[[tables]]`` entries whose schema is known without the catalog."""
    known: dict[str, Known] = {}
    dead_letters = {k.dead_letter_table for k in config.kafka}
    for table in config.tables:
        if table.name in dead_letters:
            continue  # only its source writes it
        schema = recorded.get(table.name)
        if schema is not None:
            # A keyed table's newest segment may hold change batches: rows are its columns.
            if OP_COLUMN in schema.names:
                schema = schema.remove(schema.get_field_index(OP_COLUMN))
            known[table.name] = Known(table, schema, "as the spool recorded it")
        elif table.columns is not None:
            declared = arrow_schema_for(parse_schema([c.model_dump() for c in table.columns]))
            plain = pa.schema([_without_ids(field) for field in declared])
            known[table.name] = Known(table, plain, "as declared")
    return known


def _decode(known: Known, options: JsonOptions, body: bytes, content_type: str) -> pa.RecordBatch:
    """A body as one batch in the known schema (blocking)."""
    key = tuple(known.table.key)
    decoder = decoder_for(content_type)
    try:
        decoded = decoder.decode(
            RecordArrays([body]), Target(known.table.name, known.schema, key, options)
        )
        if decoded.error is not None:
            raise decoded.error
        assert decoded.batch is not None, "a body decoded whole has its rows"
        return spoolable(decoded.batch, known.schema, key)
    except BadInputError as exc:
        rephrased = decoder.rephrase(exc)
        if rephrased is exc:
            raise
        raise rephrased from None


def _listed(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= _NAMED else f"{len(names)} tables"


def _without_ids(field: pa.Field) -> pa.Field:
    """``field`` with no Iceberg field ids at any depth (the declaration's are not the
    table's: the catalog numbers the columns it creates)."""
    return pa.field(field.name, _type_without_ids(field.type), field.nullable)


def _type_without_ids(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(data_type):
        return pa.struct([_without_ids(data_type.field(i)) for i in range(data_type.num_fields)])
    if pa.types.is_list(data_type):
        return pa.list_(_without_ids(data_type.value_field))
    if pa.types.is_map(data_type):
        return pa.map_(_without_ids(data_type.key_field), _without_ids(data_type.item_field))
    return data_type
