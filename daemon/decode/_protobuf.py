"""Protobuf values (Kafka's ``format = "protobuf"``) -> an Arrow batch in the table's schema.

The Confluent wire format (`icespool.decode._wire`): magic byte 0, the 4-byte schema
id, the message-index path (which message of the schema's file: a single 0 byte for
the first), then the message. Schemas come from the registry and are compiled at
run time (`icespool.decode._proto_schema`). The headers of a fetch are read at once;
the messages of one (schema, message type) are parsed and converted to Arrow by ONE
call of ptars (Rust), then brought to the table's types column by column
(`icespool.decode._proto_convert`).

Dead letters, as for Avro: a value without the wire header, with a path that is cut
short or names no message, or whose message does not parse is ``invalid``; a batch
that does not parse or convert is retried on halves until the bad records stand alone
(``invalid`` naming the column, ``out_of_range``); a schema id the registry does not
know (or a registry that does not answer) is ``schema_unavailable``.

Evolution: a message field the table lacks makes its records dead letters with that
column named, and the table's ``evolve`` policy may add the columns the message
declares (exact types, `message_schema`) before they are decoded again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from google.protobuf.message import DecodeError

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest, with_source_columns
from icespool.decode._json_values import value_schema
from icespool.decode._locate import split_failures
from icespool.decode._proto_convert import (
    CONVERSION_ERRORS,
    NotProtobuf,
    batch_builder,
    message_schema,
)
from icespool.decode._proto_schema import ProtoSchema
from icespool.decode._records import Binary, Records, Target
from icespool.decode._registry import CachedSchemas, SchemaUnavailable
from icespool.decode._wire import (
    after,
    in_order,
    layout,
    message_path,
    new_columns_request,
    split_framed,
)
from icespool.errors import BadInputError, SchemaError

__all__ = ["ProtobufValues"]

ProtoSchemas = CachedSchemas[ProtoSchema]
Positions = npt.NDArray[np.int64]


class ProtobufValues:
    """The decoder of Protobuf values, lenient: each record that fails is a dead record
    with its reason (see the module doc). ``schemas``: the registry's schemas (asked at
    the first decode, and again while that fails)."""

    def __init__(
        self,
        schemas: Callable[[], ProtoSchemas],
        *,
        source_columns: Sequence[str] = (),
        max_record_bytes: int = 2**20,
    ) -> None:
        self._schemas = schemas
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        schemas = self._schemas()
        columns = value_schema(target.schema, self._source_columns)
        depth = target.options.max_depth
        dead: list[DeadRecord] = []
        groups, bodies = split_framed(records.values, dead, self._max_bytes)
        parts: list[tuple[pa.RecordBatch, Positions]] = []
        declared: dict[str, pa.Field] = {}
        for schema_id, positions in groups.items():
            try:
                schema = schemas.get(schema_id)
            except SchemaUnavailable as exc:
                dead.extend(DeadRecord(int(i), exc.reason, str(exc)) for i in positions)
                continue
            for (path, start), at in _by_message(schema, bodies, positions, dead):
                descriptor = schema.message(path)[0]
                _declare(descriptor, depth, columns, declared)
                payloads = after(bodies.take(pa.array(at)), start)
                _decode_group(schema, path, payloads, at, columns, depth, parts, dead)
        dead.sort(key=lambda d: d.index)
        wanted = pa.schema(list(declared.values())) if declared else None
        if not parts:
            return Decoded(None, np.empty(0, np.int64), dead, wanted)
        table, ok = in_order(parts, columns)
        rows = records if len(ok) == len(records) else records.take(ok)
        batch = with_source_columns(table, rows, target.schema, self._source_columns)
        return Decoded(batch, ok, dead, wanted)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return new_columns_request(decoded)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        """The message schema of the first value whose schema and message are known (a
        table auto_create makes for a route)."""
        schemas = self._schemas()
        groups, bodies = split_framed(records.values, [])
        for schema_id, positions in groups.items():
            try:
                schema = schemas.get(schema_id)
            except SchemaUnavailable:
                continue
            for (path, _), _ in _by_message(schema, bodies, positions, []):
                return message_schema(schema.message(path)[0], target.options.max_depth)
        raise BadInputError("no value names a Protobuf schema and message the registry knows")

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def _declare(
    descriptor: Any, depth: int, columns: pa.Schema, declared: dict[str, pa.Field]
) -> None:
    """Note the message's fields the table lacks (the first message's type wins)."""
    if all(columns.get_field_index(name) >= 0 for name in descriptor.fields_by_name):
        return
    try:
        schema = message_schema(descriptor, depth)
    except SchemaError:
        return  # too deep: the decode says so for its records
    for f in schema:
        if columns.get_field_index(f.name) < 0:
            declared.setdefault(f.name, f)


def _by_message(
    schema: ProtoSchema, bodies: Binary, positions: Positions, dead: list[DeadRecord]
) -> list[tuple[tuple[tuple[int, ...], int], Positions]]:
    """A schema's values (``bodies`` at ``positions``: after their header) by the
    message type their index path names and where the message starts; values whose
    path is cut short or names no message are dead. The paths serializers write for a
    top-level message ([0]: one 0 byte; [k] for k < 64: the count 1 and k, a byte
    each) are read for all values at once; only other paths one by one."""
    offsets, data = layout(bodies.take(pa.array(positions)))
    starts, lengths = offsets[:-1], np.diff(offsets)
    lead = np.full((2, len(positions)), -1, np.int64)
    for k in (0, 1):
        has = lengths > k
        lead[k, has] = data[starts[has] + k]
    by_path: dict[tuple[tuple[int, ...], int], list[Positions]] = {}
    first = lead[0] == 0
    if first.any():
        by_path[(0,), 1] = [positions[first]]
    top = (lead[0] == 2) & (lead[1] >= 0) & (lead[1] < 0x80)
    for byte in np.unique(lead[1, top]).tolist():
        index = (byte >> 1) ^ -(byte & 1)
        by_path[(index,), 2] = [positions[top & (lead[1] == byte)]]
    for i in positions[~(first | top)].tolist():
        try:
            found = message_path(bodies[i].as_py())
        except ValueError as exc:
            dead.append(DeadRecord(i, "invalid", f"not Protobuf of {schema.label}: {exc}"))
            continue
        by_path.setdefault(found, []).append(np.asarray([i], np.int64))
    groups: list[tuple[tuple[tuple[int, ...], int], Positions]] = []
    for (path, start), parts in by_path.items():
        at = np.concatenate(parts)
        try:
            schema.message(path)
        except LookupError as exc:
            text = f"not Protobuf of {schema.label}: {exc}"
            dead.extend(DeadRecord(int(i), "invalid", text) for i in at)
            continue
        groups.append(((path, start), at))
    return groups


def _decode_group(
    schema: ProtoSchema,
    path: tuple[int, ...],
    payloads: Binary,
    at: Positions,
    columns: pa.Schema,
    depth: int,
    out: list[tuple[pa.RecordBatch, Positions]],
    dead: list[DeadRecord],
) -> None:
    """The messages ``payloads`` (of the records at ``at``; the message type at
    ``path``) as batches of rows: one conversion of them all; when it fails, halves
    until each bad record stands alone."""
    descriptor, cls = schema.message(path)
    label = f"{schema.label} ({descriptor.full_name})"
    try:
        build = batch_builder(descriptor, schema.handler(descriptor), columns, depth)
    except BadInputError as exc:
        # No message of this type fits the table; one whose bytes do not even parse
        # says so first (the runtime's parser, one message at a time: a rare path).
        column = exc.column if isinstance(exc, SchemaError) else None
        for i, payload in zip(at.tolist(), payloads.to_pylist(), strict=True):
            try:
                cls.FromString(payload or b"")
            except DecodeError as bad:
                dead.append(DeadRecord(i, "invalid", f"not Protobuf of {label}: {bad}"))
            else:
                dead.append(DeadRecord(i, exc.reason, f"{label}: {exc}", column))
        return
    if pa.types.is_large_binary(payloads.type):
        # ptars reads binary arrays only: a part too large for one fails its cast and
        # is halved below.
        whole = payloads

        def part_of(part: Sequence[int]) -> pa.BinaryArray:
            return whole.slice(part[0], len(part)).cast(pa.binary())
    else:

        def part_of(part: Sequence[int]) -> pa.BinaryArray:
            return payloads.slice(part[0], len(part))

    built, failed = split_failures(
        range(len(payloads)), lambda part: build(part_of(part)), CONVERSION_ERRORS
    )
    out.extend((batch, at[part[0] : part[-1] + 1]) for batch, part in built)
    for index, error in failed:
        if isinstance(error, NotProtobuf):
            text = f"not Protobuf of {label}: {error}"
            dead.append(DeadRecord(int(at[index]), "invalid", text))
            continue
        reason = error.reason if isinstance(error, BadInputError) else "invalid"
        column = error.column if isinstance(error, SchemaError) else None
        dead.append(DeadRecord(int(at[index]), reason, str(error), column))
