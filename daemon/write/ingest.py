"""The one way in, for HTTP, Kafka and the Python API: decode -> evolve or create -> append.

    HTTP body    ``Ingest.ingest_body``        the Content-Type's decoder, all or nothing
                                               (records or changes)
    Kafka fetch  ``Ingest.decode_and_evolve``  the source's lenient decoder, per table
    Python API   ``TableInput``                Arrow batches, tables, columns or dicts

Every path meets the same three steps:

1. **create**: a table declared with ``infer = true`` (or a Kafka route with
   ``auto_create``) that does not exist yet is created from the schema of its first
   records (`Ingest.create`; a replica that created it first wins, its table is used).
2. **decode and evolve**: the input is decoded into the table's Arrow schema. Where
   that fails for columns the table lacks (or has too narrow) and the table's
   ``evolve`` policy allows it, the table's schema is changed first and the input
   decoded again (`Ingest.decode_and_evolve`). A change the policy refuses is a
   `SchemaChangeError` naming the column and the policy.
3. **append**: the decoded batch goes to the table's writer, which spools it (the ack).

Decoding is `icespool.decode`'s (one `Decoder` per wire format); what happens here is
the same for every format. Errors are domain errors (`icespool.errors`); each source
maps them: HTTP to a status, Kafka to a dead letter, the Python API raises them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icespool.cdc import DELETE, UPSERT, conform_changes, with_ops
from icespool.config import Config
from icespool.decode import (
    FORMATS,
    Decoded,
    Decoder,
    EvolveRequest,
    JsonOptions,
    RecordArrays,
    Records,
    Target,
    decoder_for,
    key_error,
    no_key,
    refuse_changes,
    without_op_column,
)
from icespool.errors import BadInputError, ReadOnlyTableError, SchemaError
from icespool.schema import Policy, SchemaChangeError, conform
from icespool.write.writer import TableWriter

__all__ = ["AUTO_CREATED", "Column", "Ingest", "TableInput", "Tables"]

#: The evolve policy of tables a Kafka source creates for new routes: they take new
#: fields as they come.
AUTO_CREATED: Final[Policy] = "add-columns"


class Tables(Protocol):
    """What the way in needs of the daemon's tables (`icespool.lifecycle.service.Icespool`)."""

    @property
    def config(self) -> Config: ...

    def table_writer(self, name: str) -> TableWriter:
        """The writer of ``name``; raises UnknownTableError / BackpressureError."""

    def awaiting_schema(self, name: str) -> bool:
        """Whether ``name`` is created from its first records and does not exist yet."""

    def written_by_daemon(self, name: str) -> bool:
        """Whether only the daemon writes ``name`` (a Kafka source's dead-letter table)."""

    def create_from(
        self, name: str, incoming: pa.Schema, *, evolve: Policy | None = None
    ) -> Awaitable[TableWriter]:
        """Create ``name`` for records shaped like ``incoming`` (or load a replica's)."""


@dataclass(frozen=True, slots=True)
class Column:
    """Column data for `TableInput.append` (the column-write API: values, validity, selection).

    ``validity`` is source-aligned (``validity[i]`` says whether ``values[i]`` is
    valid); ``selection`` picks and orders source rows, and validity is gathered
    through it too.
    """

    values: Any
    validity: Sequence[bool] | pa.Array | None = None
    selection: Sequence[int] | pa.Array | None = None


class Ingest:
    """Decode, evolve or create, and append, for every source of one daemon."""

    def __init__(self, tables: Tables) -> None:
        self._tables = tables
        # Built once per table and depth: they are hashable keys of the decode plan cache.
        self._options: dict[tuple[str, int], JsonOptions] = {}

    # ------------------------------------------------------------------ HTTP

    def check(self, name: str) -> TableWriter | None:
        """The writer of ``name`` if it can take records now (raises the error that
        says why not: unknown, degraded, shutting down, full); None when the table
        is created from its first records. Cheap: runs before a body is read."""
        self._refuse_daemon_tables(name)
        if self._tables.awaiting_schema(name):
            return None
        writer = self._tables.table_writer(name)
        writer.check_capacity()
        return writer

    def admit(self, writer: TableWriter) -> None:
        """`check` for a writer the caller has just looked up (`Tables.table_writer`,
        nothing awaited since): what it adds, a daemon-written table and a full queue,
        raised as `check` raises it."""
        self._refuse_daemon_tables(writer.name)
        writer.check_capacity()

    async def ingest_body(
        self, name: str, body: bytes, content_type: str, *, changes: bool = False
    ) -> int:
        """Decode a request body (one of `FORMATS`) for ``name`` and spool all of it,
        or none of it; returns the number of records acked.

        ``changes``: the body holds keyed changes (each row the table's columns plus
        ``"_op": "upsert" | "delete"``; a delete needs only the key) for an upsert
        table (`icespool.cdc`); otherwise records (upserts, on an upsert table).

        Raises `BadInputError` / `SchemaError` (the body), `UnknownTableError`,
        `BackpressureError` (degraded, full, shutting down) or what the catalog
        raised while creating or evolving the table."""
        if content_type not in FORMATS:
            raise BadInputError(f"unsupported Content-Type {content_type!r}")
        # Checked again now the body is here (the HTTP layer checked before reading it):
        # meanwhile the daemon may have begun to drain or the table's queue filled (or an
        # infer = true table was created); a body that cannot be spooled is neither
        # decoded nor allowed to evolve the table.
        writer = self.check(name)
        if changes:
            if writer is None:
                # Created from its first records: such a table has no key (config refuses
                # `infer` with `key`), so it is refused before anything is created.
                raise no_key(name)
            if not writer.key:  # an append table: refused before its body is decoded
                raise no_key(writer.name)
        decoder = decoder_for(content_type, changes="keyed" if changes else "none")
        records = RecordArrays([body])
        try:
            if writer is None:
                depth = self._tables.config.table_settings(name).max_nesting_depth
                target = Target(name, options=JsonOptions(max_depth=depth))
                writer = await self.create(name, lambda: decoder.incoming(records, target))
            decode, request = self._decoding(writer, decoder, records)
            # A change body's failure on a key column is said as one (missing_key,
            # bad_key: the reasons of the same faults from Kafka).
            said = functools.partial(key_error, key=writer.key) if changes else None
            batch = await self._all_or_nothing(writer, decode, request, said)
            # Shielded: a client that hangs up must not cancel a half-done spool append.
            return await asyncio.shield(writer.append(batch))
        except BadInputError as exc:
            rephrased = decoder.rephrase(exc)
            if rephrased is exc:
                raise
            raise rephrased from None

    # ------------------------------------------------------------------ Python API

    async def append(
        self,
        writer: TableWriter,
        data: pa.RecordBatch | pa.Table | Mapping[str, Column | Any],
        meta: Mapping[str, object] | None = None,
    ) -> int:
        """Spool Arrow data (or columns) for ``writer``'s table; evolves it for new
        columns where its policy allows. Returns the record count once acked."""
        self._refuse_daemon_tables(writer.name)
        if isinstance(data, Mapping):
            batch = await asyncio.to_thread(_columns_to_batch, data, writer.arrow_schema)
        elif writer.key:
            batch = await self._conform_changes(writer, data)
        else:
            refuse_changes(writer.name, data.schema, writer.key)
            batch = await self._conform_rows(writer, data)
        return await writer.append(batch, meta)

    async def _conform_changes(
        self, writer: TableWriter, data: pa.RecordBatch | pa.Table
    ) -> pa.RecordBatch | pa.Table:
        """Rows (upserts) or a change batch (`icespool.cdc`) cast for ``writer``'s upsert
        table (`conform_changes`), evolving the table first for columns it lacks where
        the policy allows (as `_conform_rows` does for rows)."""
        key = writer.key
        return await self._conform(
            writer,
            lambda schema: conform_changes(data, schema, key),
            lambda: without_op_column(data.schema),
        )

    async def _conform_rows(
        self, writer: TableWriter, data: pa.RecordBatch | pa.Table
    ) -> pa.RecordBatch | pa.Table:
        """``data`` cast to the table's schema, evolving the table first for the
        columns it lacks where the policy allows (SchemaError otherwise)."""
        return await self._conform(
            writer, lambda schema: conform(data, schema), lambda: data.schema
        )

    async def _conform(
        self,
        writer: TableWriter,
        conform: Callable[[pa.Schema], pa.RecordBatch],
        incoming: Callable[[], pa.Schema],
    ) -> pa.RecordBatch | pa.Table:
        """Arrow data ``conform``ed to the table's schema, all or nothing, evolving the
        table for the columns it lacks as the exact types of ``incoming`` say."""

        def attempt(schema: pa.Schema) -> Decoded:
            try:
                return Decoded.whole(conform(schema))
            except SchemaError as exc:
                return Decoded.refused(exc)

        def request(decoded: Decoded) -> EvolveRequest | None:
            if decoded.error is None:
                return None
            return EvolveRequest(frozenset({decoded.error.column}), incoming, exact=True)

        return await self._all_or_nothing(writer, attempt, request)

    # ------------------------------------------------------------------ every source

    async def decode_and_evolve(
        self, writer: TableWriter, decoder: Decoder, records: Records
    ) -> tuple[Decoded, dict[str, SchemaError]]:
        """``decoder``'s decode of ``records`` for ``writer``'s table (blocking, run in
        a thread), after evolving the table for what the decode lacked (its
        `Decoder.evolve_request`), as the table's policy allows. Returns the last
        decode and, by column, why the table could not be changed for it (see
        `_evolve_and_decode`)."""
        return await self._evolve_and_decode(writer, *self._decoding(writer, decoder, records))

    def _decoding(
        self, writer: TableWriter, decoder: Decoder, records: Records
    ) -> tuple[Callable[[pa.Schema], Decoded], Callable[[Decoded], EvolveRequest | None]]:
        """``decoder`` over ``records`` as `_evolve_and_decode` calls it."""
        options = self.json_options(writer)

        def target(schema: pa.Schema) -> Target:
            return Target(writer.name, schema, writer.key, options, writer.evolve_policy)

        return (
            lambda schema: decoder.decode(records, target(schema)),
            lambda decoded: decoder.evolve_request(records, decoded, target(writer.arrow_schema)),
        )

    async def _all_or_nothing(
        self,
        writer: TableWriter,
        decode: Callable[[pa.Schema], Decoded],
        request: Callable[[Decoded], EvolveRequest | None],
        said: Callable[[SchemaError], SchemaError] | None = None,
    ) -> pa.RecordBatch | pa.Table:
        """`_evolve_and_decode` of an input decoded whole: its rows, or the column
        failure that remains raised (the policy's refusal when the policy refused that
        column), as ``said`` says it."""
        said = said or _as_is
        try:
            decoded, refused = await self._evolve_and_decode(writer, decode, request)
        except SchemaChangeError as exc:  # the input's records disagree on a field's type
            raise said(exc) from None
        if decoded.error is not None:
            raise said(refused.get(decoded.error.column, decoded.error)) from None
        assert decoded.batch is not None, "an input decoded whole has its rows or its error"
        return decoded.batch

    async def _evolve_and_decode(
        self,
        writer: TableWriter,
        decode: Callable[[pa.Schema], Decoded],
        request: Callable[[Decoded], EvolveRequest | None],
    ) -> tuple[Decoded, dict[str, SchemaError]]:
        """``decode(table's Arrow schema)`` (blocking, run in a thread), after evolving
        the table for what ``request`` says the result lacks, as the table's policy
        allows. Returns the last result and, by column, why the table could not be
        changed for it: `SchemaChangeError` when the policy refuses the change, another
        `SchemaError` when the records' shape cannot be a column at all (an empty field
        name, a type Iceberg has no equivalent for). Raises the `SchemaChangeError` of
        ``request``'s inference when the records of an all-or-nothing input disagree on
        a field's type.

        It ends: every round tries the table for at least one column and input type it
        has not tried for this input before, and an input has finitely many of both.
        """
        refused: dict[str, SchemaError] = {}
        # (column, the input's type for it): records the first round's type did not fit
        # are inferred again on their own, and their other type is one more try.
        tried: set[tuple[str, str]] = set()
        result = await asyncio.to_thread(decode, writer.arrow_schema)
        while writer.evolve_policy != "none":
            want = request(result)
            if want is None or not want.columns - refused.keys():
                break
            try:
                incoming = await asyncio.to_thread(want.incoming)
            except SchemaChangeError:
                raise  # records of one all-or-nothing input disagree on a field's type
            except BadInputError:
                break  # the records' types cannot even be inferred: the decode error stands
            columns = want.columns if want.exact else _evolvable(want.columns, incoming, writer)
            new = {
                c for c in columns - refused.keys() if _column_and_type(c, incoming) not in tried
            }
            if not new:
                break
            only = None if want.exact else new
            tried |= {_column_and_type(c, incoming) for c in new}
            before = writer.arrow_schema
            try:
                await writer.evolve(incoming, only=only, exact=want.exact)
            except SchemaError as exc:
                top = exc.column.split(".", 1)[0]
                blamed: set[str] = {*want.columns, *(only or ()), exc.column}
                if only is not None and any(_top(c) == top for c in only) and len(only) > 1:
                    # A plan is refused whole, for one column: the others go again without it.
                    tried -= {_column_and_type(c, incoming) for c in only if _top(c) != top}
                    blamed = {c for c in blamed if _top(c) == top}
                for column in blamed:
                    refused.setdefault(column, exc)
                continue
            # Evolved here, or by a replica first (the plan was empty, the schema new).
            if writer.arrow_schema is not before:
                result = await asyncio.to_thread(decode, writer.arrow_schema)
        return result, refused

    async def create(
        self, name: str, incoming: Callable[[], pa.Schema], *, evolve: Policy | None = None
    ) -> TableWriter:
        """The writer of ``name``, creating the table from ``incoming()`` (the Arrow
        schema of its first records; blocking) when it does not exist yet."""
        schema = await asyncio.to_thread(incoming)
        return await self._tables.create_from(name, schema, evolve=evolve)

    def _refuse_daemon_tables(self, name: str) -> None:
        if self._tables.written_by_daemon(name):
            raise ReadOnlyTableError(
                f"table {name!r} is a Kafka dead-letter table: only its source writes it "
                "(re-ingest its records with POST /v1/tables/{table}/replay)"
            )

    def json_options(self, writer: TableWriter) -> JsonOptions:
        """How JSON maps to ``writer``'s table (timestamp units, nesting depth)."""
        depth = writer.settings.max_nesting_depth  # a SIGHUP may change it
        key = (writer.name, depth)
        options = self._options.get(key)
        if options is None:
            declared = {t.name: t for t in self._tables.config.tables}.get(writer.name)
            options = self._options[key] = JsonOptions.for_table(declared, depth)
        return options


class TableInput:
    """One table of the in-process API: ``Icespool.writer(name)``.

    Appends go through the way in (evolution included); everything else (``flush``,
    ``close``, ``arrow_schema``, ``pending_records``, ``settings``, ...) is the table
    writer's (``writer``), as it always was.
    """

    def __init__(self, ingest: Ingest, writer: TableWriter) -> None:
        self._ingest = ingest
        self.writer = writer

    def __getattr__(self, name: str) -> Any:
        # Figures, settings and flush/close: the table writer's, as they always were.
        return getattr(self.writer, name)

    async def append(
        self,
        data: pa.RecordBatch | pa.Table | Mapping[str, Column | Any],
        meta: Mapping[str, object] | None = None,
    ) -> int:
        """Spool a batch (or columns); returns the record count once acked.

        Raises `SchemaError` naming the column when the data cannot be cast to the
        table's schema (nothing of it is spooled), `BackpressureError` when the
        table's queue or the spool is full.
        """
        return await self._ingest.append(self.writer, data, meta)

    async def upsert(self, rows: pa.RecordBatch | pa.Table | Iterable[Mapping[str, object]]) -> int:
        """Upsert rows of an upsert table (``[[tables]] key``): each row replaces the
        table's row of the same key, or adds it. All or nothing; returns the count
        once acked. Raises `BadInputError` on an append table or for a row without
        its key, `SchemaError` as `append` does."""
        return await self.append(self._changes(rows, UPSERT, "upsert"))

    async def delete(self, keys: pa.RecordBatch | pa.Table | Iterable[Mapping[str, object]]) -> int:
        """Delete rows of an upsert table by key: each item holds the key columns
        (other columns are ignored). Deleting a key the table does not hold is a
        no-op. All or nothing; returns the count once acked."""
        return await self.append(self._changes(keys, DELETE, "delete"))

    def _changes(
        self, rows: pa.RecordBatch | pa.Table | Iterable[Mapping[str, object]], op: int, what: str
    ) -> pa.RecordBatch:
        """``rows`` as one change batch of ``op`` (a delete keeps only the key columns)."""
        key = self.writer.key
        if not key:
            raise BadInputError(
                f"table {self.writer.name!r} has no key, so it cannot {what} rows; declare "
                "key = [...] in its [[tables]] entry to make it an upsert table"
            )
        data = _as_table(rows)
        missing = [column for column in key if column not in data.schema.names]
        if missing:
            raise BadInputError(f"a {what} needs the key columns {list(key)}; missing {missing}")
        if op == DELETE:
            data = data.select(list(key))
        return with_ops(data, _ops(data.num_rows, op), key)

    async def queue(self, record: Mapping[str, object]) -> None:
        """Spool one record (a mapping of column to value)."""
        await self.queue_all([record])

    async def queue_all(self, records: Iterable[Mapping[str, object]]) -> int:
        """Spool records given as mappings; all or nothing."""
        rows = list(records)
        if not rows:
            return 0
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise BadInputError(f"records cannot be converted: {exc}") from exc
        return await self.append(table)


def _top(column: str) -> str:
    return column.split(".", 1)[0]


def _as_is(error: SchemaError) -> SchemaError:
    return error


def _column_and_type(column: str, incoming: pa.Schema) -> tuple[str, str]:
    """``column`` with the type the input has for its top-level column (what one
    round of evolution tries)."""
    index = incoming.get_field_index(_top(column))
    return column, str(incoming.field(index).type) if index >= 0 else ""


def _evolvable(failed: frozenset[str], incoming: pa.Schema, writer: TableWriter) -> set[str]:
    """The columns an inferred input evolves the table for in one round: those the decode
    failed on that the input has a type for, and every top-level column the table lacks
    (found all at once rather than one failed decode each)."""
    present = set(incoming.names)
    new = present - set(writer.arrow_schema.names)
    return {c for c in failed | new if c in present or c.split(".", 1)[0] in present}


def _columns_to_batch(columns: Mapping[str, Column | Any], schema: pa.Schema) -> pa.RecordBatch:
    arrays: dict[str, pa.Array] = {}
    for name, spec in columns.items():
        column = spec if isinstance(spec, Column) else Column(spec)
        try:
            target = schema.field(name).type
        except KeyError:
            raise BadInputError(f"column {name!r} is not in the table's schema") from None
        try:
            values = pa.array(column.values, type=target)
            if column.validity is not None:
                valid = pa.array(column.validity, pa.bool_())
                if len(valid) < len(values):
                    raise BadInputError(
                        f"column {name!r}: validity has {len(valid)} entries for "
                        f"{len(values)} values"
                    )
                values = pc.if_else(valid[: len(values)], values, pa.nulls(len(values), target))
            if column.selection is not None:
                values = values.take(pa.array(column.selection, pa.int64()))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise BadInputError(f"column {name!r}: {exc}") from exc
        arrays[name] = values
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) > 1:
        raise BadInputError(f"columns have different lengths: {sorted(lengths)}")
    return conform(pa.table(arrays), schema)


def _as_table(rows: pa.RecordBatch | pa.Table | Iterable[Mapping[str, object]]) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    try:
        return pa.Table.from_pylist(list(rows))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise BadInputError(f"records cannot be converted: {exc}") from exc


def _ops(count: int, op: int) -> pa.Array:
    return pa.array(np.full(count, op, dtype=np.int8))
