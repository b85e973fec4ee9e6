"""Kafka change records -> ONE change batch per table (`icespool.cdc`), in offset order.

    values (BinaryArray) --prescreen--> tombstones (null value: delete by Kafka key)
                                        oversized / too deep -> dead letters
                         --envelopes--> one decode of every value with an explicit
                                        envelope schema (JSON: pyarrow.json; Avro:
                                        the registry's writer schema)
                         --select-----> op, before/after as whole columns
    keys (BinaryArray)   --------------> decoded the same way, only for the records
                                        whose key is not in the value
    -> change batch (`change_schema`) + dead letters

Debezium (``changes = "debezium"``): ``op`` c/r/u upserts ``after``, d deletes by
``before``'s key columns (else by the Kafka key); the ``{"schema":.., "payload":..}``
envelope of Kafka Connect's JsonConverter is found per record. Keyed (``changes =
"keyed"``): the value is the row (an upsert); key columns it lacks come from the
Kafka key. In both, a null (or empty) value deletes by the Kafka key, so
Debezium's tombstone after a delete is a second, idempotent delete.

Dead-letter reasons besides the decoders' own: ``missing_key`` (no key in the value
nor in the Kafka key), ``bad_key`` (the key does not convert to the key column
types), ``not_upsert`` (a delete for a table without a key), ``bad_change`` (an
envelope without a usable ``op`` or ``after``, an unknown op such as t or m).

Nothing here parses a record in Python on the good path: whole-fetch pyarrow calls,
bisected (`icespool.decode._locate.split_failures`) only to isolate bad records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.cdc import DELETE, OP_COLUMN, UPSERT, change_schema, with_ops
from icespool.decode._connect import ConnectTypes
from icespool.decode._decoded import (
    DeadRecord,
    Decoded,
    EvolveRequest,
    RowReader,
    with_source_columns,
)
from icespool.decode._json_values import infer_values_schema, json_evolve_request, value_schema
from icespool.decode._keyed_rows import json_envelopes, json_keys, key_schema, string_keys
from icespool.decode._plan import JsonOptions
from icespool.decode._records import Binary, Records, Target
from icespool.decode._screen import oversized
from icespool.errors import BadInputError

if TYPE_CHECKING:
    from icespool.decode._avro_registry import AvroSchemas

__all__ = ["ChangeMode", "KeyFormat", "KeyedChanges", "decode_changes", "envelope_schema"]

ChangeMode = Literal["debezium", "keyed"]
KeyFormat = Literal["json", "string", "avro"]

_UPSERT_OPS: Final = pa.array(["c", "r", "u"])
_ENVELOPE: Final = frozenset({"op", "before", "after", "payload"})
# pyarrow names the path that failed inside a nested column: "Column(/after/id) ...".
_PATH: Final = re.compile(r"Column\((/[^)]*)\)")
_SCALAR_OPEN: Final = pa.scalar(b'{"v":', pa.binary())
_SCALAR_CLOSE: Final = pa.scalar(b"}", pa.binary())
_NOTHING: Final = pa.scalar(b"", pa.binary())


def _nullable_row(schema: pa.Schema) -> pa.StructType:
    # Top-level columns nullable: before/after may be partial, a delete has only
    # its key. Required columns are checked on the upserts after selection.
    return pa.struct([f.with_nullable(True) for f in schema])


def envelope_schema(
    schema: pa.Schema,
    mode: ChangeMode,
    key: Sequence[str] = (),
    *,
    payload: bool = True,
    before_row: bool = False,
) -> pa.Schema:
    """What each value is decoded into: Debezium's ``op``/``before``/``after`` (and,
    with ``payload``, the same inside Kafka Connect's schema envelope); keyed: the
    row itself with every top-level column nullable. ``before`` is read for its key
    columns only (a delete needs nothing else; the rest is skipped unparsed), and not
    at all for a table without a key; ``before_row``: as the whole row (Avro, whose
    writer schema's record must fit the struct it is read into)."""
    if mode == "keyed":
        return pa.schema([f.with_nullable(True) for f in schema])
    shape = _nullable_row(schema) if before_row else pa.struct(list(key_schema(schema, key)))
    before = [pa.field("before", shape)] if key else []
    change = [pa.field("op", pa.string()), *before, pa.field("after", _nullable_row(schema))]
    return pa.schema([*change, pa.field("payload", pa.struct(change))] if payload else change)


# ------------------------------------------------------------------ the change batch


@dataclass(slots=True)
class _Rows:
    """Candidate changes, aligned: fetch positions, ops, row columns (value schema)."""

    at: npt.NDArray[np.int64]
    ops: npt.NDArray[np.int8]
    columns: dict[str, pa.Array]


def decode_changes(
    values: Binary,
    keys: Binary,
    schema: pa.Schema,
    key: Sequence[str],
    *,
    mode: ChangeMode,
    envelopes: RowReader,
    key_rows: RowReader,
    max_record_bytes: int = 2**20,
    payload: bool = True,
    before_row: bool = False,
) -> Decoded:
    """Decode one table's records (``values``/``keys``: nulls are null) into one
    change batch in `change_schema` (``schema``: the table's value columns; ``key``
    empty: an append table, which gets its upserts as plain rows) plus dead letters.
    ``Decoded.rows`` are positions into ``values``, ascending. ``payload``: look for
    the schema envelope (JSON); ``before_row``: see `envelope_schema`."""
    n = len(values)
    if n == 0:
        return Decoded(None, np.empty(0, np.int64), [])
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    tomb = lengths == 0
    big = lengths > max_record_bytes
    dead = [oversized(int(i), int(lengths[i]), max_record_bytes) for i in np.flatnonzero(big)]
    live = np.flatnonzero(~tomb & ~big).astype(np.int64)
    envelope = envelope_schema(schema, mode, key, payload=payload, before_row=before_row)
    table, at, bad = envelopes(values, live, envelope) if len(live) else (None, live, [])
    dead += [_envelope_dead(d, mode) for d in bad]
    rows = _select(table, at, schema, key, mode, dead)
    tombs = np.flatnonzero(tomb).astype(np.int64)
    rows = _with_tombstones(rows, tombs, schema)
    if not key:
        return _append_only(rows, schema, dead)
    rows = _complete_keys(rows, keys, schema, key, key_rows, dead)
    rows = _check_required(rows, schema, key, dead)
    dead.sort(key=lambda d: d.index)
    if not len(rows.at):
        return Decoded(None, np.empty(0, np.int64), dead)
    is_delete = pa.array(rows.ops == DELETE)
    columns = [
        rows.columns[f.name]
        if f.name in key
        else pc.if_else(is_delete, pa.nulls(len(rows.at), f.type), rows.columns[f.name])
        for f in schema
    ]
    batch = pa.RecordBatch.from_arrays(
        columns, schema=change_schema(schema, key).remove(len(schema))
    )
    return Decoded(with_ops(batch, pa.array(rows.ops, pa.int8()), key), rows.at, dead)


def _envelope_dead(record: DeadRecord, mode: ChangeMode) -> DeadRecord:
    """A decode error inside ``after``/``before`` names the table column; one of the
    envelope itself (``after`` not an object, ``op`` not a string) is ``bad_change``."""
    if mode == "keyed" or record.column is None:
        return record
    found = _PATH.search(record.error)
    path = found.group(1).strip("/").split("/") if found else record.column.split(".")
    if path[:1] == ["payload"]:
        path = path[1:]
    envelope = not path or (len(path) == 1 and path[0] in _ENVELOPE)
    if envelope and (found is not None or path == ["op"]):
        what = path[0] if path else "payload"
        return replace(
            record,
            reason="bad_change",
            error=f"the change envelope's {what!r} has the wrong type: {record.error}",
            column=None,
        )
    if envelope:  # inside before/after, where pyarrow did not say
        return replace(record, column=None)
    column = ".".join(path[1:])
    error = record.error.removeprefix(f"column {record.column!r}: ")
    return replace(record, column=column, error=f"column {column!r}: {error}")


def _select(
    table: pa.Table | None,
    at: npt.NDArray[np.int64],
    schema: pa.Schema,
    key: Sequence[str],
    mode: ChangeMode,
    dead: list[DeadRecord],
) -> _Rows:
    if table is None or not table.num_rows:
        return _Rows(np.empty(0, np.int64), np.empty(0, np.int8), _empty_columns(schema))
    if mode == "keyed":
        columns = {name: table.column(name).combine_chunks() for name in schema.names}
        return _Rows(at, np.full(len(at), UPSERT, np.int8), columns)
    fields = [f.name for f in table.schema if f.name != "payload"]  # op, [before,] after
    parts = {name: table.column(name).combine_chunks() for name in fields}
    if "payload" in table.column_names:
        payload = table.column("payload").combine_chunks()
        has = pc.is_valid(payload)
        inner = payload.flatten()
        parts = {name: pc.if_else(has, inner[i], parts[name]) for i, name in enumerate(fields)}
    op, after = parts["op"], parts["after"]
    upsert = pc.fill_null(pc.is_in(op, _UPSERT_OPS), False).to_numpy(zero_copy_only=False)
    delete = pc.fill_null(pc.equal(op, "d"), False).to_numpy(zero_copy_only=False)
    no_after = pc.is_null(after).to_numpy(zero_copy_only=False) & upsert
    moved = _key_moved(op, parts.get("before"), after, key)
    ops_py = None
    bad = ~(upsert | delete) | no_after | moved
    for j in np.flatnonzero(bad):
        ops_py = ops_py or op.to_pylist()
        if no_after[j]:
            error = f"op {ops_py[j]!r} without an 'after' row"
        elif moved[j]:
            error = (
                "an update that changes the key ('before' and 'after' keys differ): send a "
                "delete of the old key and a create of the new one, as Debezium does"
            )
        elif ops_py[j] is None:
            error = "the change has no 'op' (expected c, r, u or d, or a Debezium envelope)"
        else:
            error = f"unknown op {ops_py[j]!r}: expected c, r, u or d"
        dead.append(DeadRecord(int(at[j]), "bad_change", error))
    keep = pa.array(~bad)
    values = after.filter(keep).flatten()  # flatten: a null `after` gives null columns
    columns = {name: values[i] for i, name in enumerate(schema.names)}
    if key:  # a delete's key comes from `before` (else, later, from the Kafka key)
        is_delete = pa.array(delete[~bad])
        before = parts["before"].filter(keep)
        flat = before.flatten()
        for k in key:
            found = flat[before.type.get_field_index(k)]
            columns[k] = pc.if_else(is_delete, found, columns[k])
    ops = np.where(upsert, UPSERT, DELETE).astype(np.int8)[~bad]
    return _Rows(at[~bad], ops, columns)


def _key_moved(
    op: pa.Array, before: pa.Array | None, after: pa.Array, key: Sequence[str]
) -> npt.NDArray[np.bool_]:
    """Updates whose complete ``before`` key differs from the ``after`` key. Applied
    as an upsert, the old key's row would stay live; one Kafka record is one change,
    so such an update is refused instead of split into a delete and an upsert."""
    n = len(op)
    if not key or before is None or n == 0:
        return np.zeros(n, np.bool_)
    update = pc.fill_null(pc.equal(op, "u"), False)
    differs = pa.array(np.zeros(n, np.bool_))
    complete = pa.array(np.ones(n, np.bool_))
    for k in key:
        old = pc.struct_field(before, k)
        new = pc.struct_field(after, k)
        complete = pc.and_(complete, pc.is_valid(old))
        differs = pc.or_(differs, pc.fill_null(pc.not_equal(old, new), False))
    moved = pc.and_(pc.and_(update, complete), differs)
    return np.asarray(pc.fill_null(moved, False).to_numpy(zero_copy_only=False), np.bool_)


def _empty_columns(schema: pa.Schema) -> dict[str, pa.Array]:
    return {f.name: pa.array([], f.type) for f in schema}


def _with_tombstones(rows: _Rows, tombs: npt.NDArray[np.int64], schema: pa.Schema) -> _Rows:
    if not len(tombs):
        return rows
    at = np.concatenate([rows.at, tombs])
    order = np.argsort(at, kind="stable")
    take = pa.array(order)
    columns = {
        f.name: pa.concat_arrays([rows.columns[f.name], pa.nulls(len(tombs), f.type)]).take(take)
        for f in schema
    }
    ops = np.concatenate([rows.ops, np.full(len(tombs), DELETE, np.int8)])[order]
    return _Rows(at[order], ops, columns)


def _keep(rows: _Rows, mask: npt.NDArray[np.bool_]) -> _Rows:
    if mask.all():
        return rows
    keep = pa.array(mask)
    return _Rows(
        rows.at[mask], rows.ops[mask], {k: v.filter(keep) for k, v in rows.columns.items()}
    )


def _append_only(rows: _Rows, schema: pa.Schema, dead: list[DeadRecord]) -> Decoded:
    """A table without a key: upserts are appended as rows, deletes cannot apply."""
    deletes = rows.ops == DELETE
    dead += [
        DeadRecord(
            int(i),
            "not_upsert",
            "a delete for a table without a key: declare the table's key ([[tables]] key) "
            "to apply deletes",
        )
        for i in rows.at[deletes]
    ]
    rows = _keep(rows, ~deletes)
    rows = _check_required(rows, schema, (), dead)
    dead.sort(key=lambda d: d.index)
    if not len(rows.at):
        return Decoded(None, np.empty(0, np.int64), dead)
    batch = pa.RecordBatch.from_arrays([rows.columns[f.name] for f in schema], schema=schema)
    return Decoded(batch, rows.at, dead)


def _complete_keys(
    rows: _Rows,
    keys: Binary,
    schema: pa.Schema,
    key: Sequence[str],
    key_rows: RowReader,
    dead: list[DeadRecord],
) -> _Rows:
    """Key columns the row lacks (tombstones, deletes without ``before``, keyed rows
    without them) from the Kafka key; a record with neither is ``missing_key``."""
    if not len(rows.at):
        return rows
    lacking = np.zeros(len(rows.at), dtype=bool)
    for k in key:
        lacking |= pc.is_null(rows.columns[k]).to_numpy(zero_copy_only=False)
    if not lacking.any():
        return rows
    need = rows.at[lacking]
    no_key = pc.is_null(keys.take(pa.array(need))).to_numpy(zero_copy_only=False)
    failed = np.zeros(len(rows.at), dtype=bool)
    where = np.flatnonzero(lacking)
    for j in where[no_key]:
        failed[j] = True
        dead.append(
            DeadRecord(
                int(rows.at[j]),
                "missing_key",
                "no key: the record has no Kafka key and its value lacks "
                + _missing(rows, key, int(j)),
            )
        )
    ask = need[~no_key]
    if len(ask):
        table, got, bad = key_rows(keys, ask, key_schema(schema, key))
        for record in bad:
            failed[int(np.searchsorted(rows.at, record.index))] = True  # rows.at ascends
            reason = record.reason if record.reason in ("missing_key", "bad_key") else "bad_key"
            dead.append(replace(record, reason=reason, error=f"Kafka key: {record.error}"))
        if table is not None and len(got):
            # Positions of the decoded keys among the rows (both ascending).
            slots = np.searchsorted(rows.at, got)
            for k in key:
                filled = _scatter(table.column(k).combine_chunks(), slots, len(rows.at))
                rows.columns[k] = pc.coalesce(rows.columns[k], filled)
    still = np.zeros(len(rows.at), dtype=bool)
    for k in key:
        still |= pc.is_null(rows.columns[k]).to_numpy(zero_copy_only=False)
    for j in np.flatnonzero(still & ~failed):
        failed[j] = True
        dead.append(
            DeadRecord(
                int(rows.at[j]),
                "missing_key",
                f"no key: neither the value nor the Kafka key has {_missing(rows, key, int(j))}",
                next(k for k in key if not rows.columns[k][j].is_valid),
            )
        )
    return _keep(rows, ~failed)


def _missing(rows: _Rows, key: Sequence[str], j: int) -> str:
    names = [k for k in key if not rows.columns[k][j].is_valid]
    return "key column " + ", ".join(repr(k) for k in names)


def _scatter(values: pa.Array, slots: npt.NDArray[np.int64], size: int) -> pa.Array:
    """``values`` placed at ``slots`` of an array of ``size`` nulls."""
    index = np.full(size, -1, dtype=np.int64)
    index[slots] = np.arange(len(slots))
    mask = index < 0
    return (
        values.take(pa.array(np.where(mask, 0, index), mask=mask))
        if len(values)
        else (pa.nulls(size, values.type))
    )


def _check_required(
    rows: _Rows, schema: pa.Schema, key: Sequence[str], dead: list[DeadRecord]
) -> _Rows:
    """Upserts with a required (non-key) column null are dead letters naming it."""
    upsert = rows.ops == UPSERT
    failed = np.zeros(len(rows.at), dtype=bool)
    for f in schema:
        if f.nullable or f.name in key:
            continue
        nulls = pc.is_null(rows.columns[f.name]).to_numpy(zero_copy_only=False) & upsert & ~failed
        for j in np.flatnonzero(nulls):
            failed[j] = True
            dead.append(
                DeadRecord(
                    int(rows.at[j]),
                    "invalid",
                    f"column {f.name!r}: required column is missing or null",
                    f.name,
                )
            )
    return _keep(rows, ~failed)


# ------------------------------------------------------------------ the decoder


class KeyedChanges:
    """The decoder of Kafka change records (``changes = "debezium"`` or ``"keyed"``),
    lenient: each table's records become ONE change batch in its `change_schema`
    (`decode_changes`), with the source's columns filled as for plain rows. Values are
    JSON (Debezium's read through their Kafka Connect schemas, `ConnectTypes`) or Avro
    (``schemas``: the writer schemas); keys as ``key_format`` says."""

    def __init__(
        self,
        mode: ChangeMode,
        *,
        avro: Callable[[], AvroSchemas] | None = None,
        key_format: KeyFormat = "json",
        source_columns: Sequence[str] = (),
        max_record_bytes: int = 2**20,
    ) -> None:
        self._mode = mode
        self._avro = avro
        self._key_format = key_format
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        key, options = target.key, target.options
        columns = self._source_columns
        values = value_schema(target.schema, columns)
        clash = [k for k in key if k in columns]
        if clash:  # refused by the config for declared tables; a table created otherwise
            error = f"the key column {clash[0]!r} is a Kafka metadata column, not in the record"
            return Decoded(
                None,
                np.empty(0, np.int64),
                [DeadRecord(p, "bad_key", error, clash[0]) for p in range(len(records))],
            )
        envelopes: RowReader
        connect: ConnectTypes | None = None
        debezium = self._mode == "debezium"
        if self._avro is not None:
            from icespool.decode._avro import avro_rows  # fastavro: only for format avro

            envelopes = avro_rows(self._avro(), options.max_depth, ignore_unknown=debezium)
        else:
            envelopes = json_envelopes(options, ignore_unknown=debezium)
            if debezium:  # Kafka Connect schemas say how fields are spelled
                connect = envelopes = ConnectTypes(envelopes, options)
        decoded = decode_changes(
            records.values,
            records.keys,
            values,
            key,
            mode=self._mode,
            envelopes=envelopes,
            key_rows=self._key_rows(key, values, options),
            max_record_bytes=self._max_bytes,
            payload=self._avro is None,
            before_row=self._avro is not None,
        )
        declared = connect.wanted if connect is not None else None
        if decoded.batch is None:
            return Decoded(None, np.empty(0, np.int64), decoded.dead, declared)
        batch = decoded.batch
        if columns:
            rows = pa.Table.from_batches([batch.select(values.names)])
            # A delete has only its key: the other columns are nullable, as in change_schema.
            schema = (
                change_schema(target.schema, key).remove(len(target.schema))
                if key
                else target.schema
            )
            plain = with_source_columns(rows, records.take(decoded.rows), schema, columns)
            batch = with_ops(plain, batch.column(OP_COLUMN), key) if key else plain
        return Decoded(batch, decoded.rows, decoded.dead, declared)

    def _key_rows(self, key: Sequence[str], values: pa.Schema, options: JsonOptions) -> RowReader:
        if self._key_format == "avro":
            from icespool.decode._avro import avro_rows  # fastavro: only for key_format avro

            assert self._avro is not None, "key_format avro needs format avro (config check)"
            return avro_rows(self._avro(), options.max_depth, ignore_unknown=True)
        if self._key_format == "string":
            return string_keys(key, values)
        return json_keys(key, values, options, connect=self._mode == "debezium")

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        """Debezium: the columns its Kafka Connect schemas declare (exact types); keyed
        JSON rows: the columns their dead records lacked, as for plain JSON values."""
        if self._mode == "debezium":
            # The values are envelopes, not rows to infer columns from: their schemas say.
            return self._declared_request(decoded, target)
        if self._avro is not None:
            return None
        return json_evolve_request(records, decoded, target)

    def _declared_request(self, decoded: Decoded, target: Target) -> EvolveRequest | None:
        """New columns, and wider types where the table's policy widens or a value did not
        fit (elsewhere a source type wider than its column, all of whose values fit, is
        no reason to try a change the policy refuses on every fetch)."""
        if decoded.declared is None:
            return None
        failed = {d.column for d in decoded.dead}
        have = set(target.schema.names)
        widen = target.policy == "add-and-widen"
        fields = [
            f
            for f in decoded.declared
            if f.name not in self._source_columns
            and (f.name not in have or widen or f.name in failed)
        ]
        new = [f for f in fields if f.name not in have]
        if new and not widen:
            # One plan is applied or refused whole: the columns the policy adds go first,
            # then (next round) the widenings it refuses, whose values become dead letters.
            fields = new
        if not fields:
            return None
        incoming = pa.schema(fields)
        return EvolveRequest(frozenset(incoming.names), lambda: incoming, exact=True)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        # A table auto_create makes for a route (keyed changes only: the config refuses
        # it with Debezium): from the values read as JSON rows.
        return infer_values_schema(records, target)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error
