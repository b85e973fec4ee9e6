"""Protobuf values (Kafka's ``format = "protobuf"``) -> an Arrow batch in the table's schema.

The Confluent wire format (`icespool.decode._wire`): magic byte 0, the 4-byte schema
id, the message-index path (which message of the schema's file: a single 0 byte for
the first), then the message. Schemas come from the registry and are compiled at
run time (`icespool.decode._proto_schema`); each message is parsed by the protobuf
runtime's C parser (upb), and the messages of one (schema, message type) become
Arrow a field at a time (`icespool.decode._proto_convert`).

Dead letters, as for Avro: a value without the wire header, with a path that is cut
short or names no message, or whose message does not parse is ``invalid``; a batch
that does not convert is retried on halves until the bad records stand alone
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
import pyarrow as pa
from google.protobuf.message import DecodeError

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest, with_source_columns
from icespool.decode._json_values import value_schema
from icespool.decode._locate import split_failures
from icespool.decode._proto_convert import CONVERSION_ERRORS, batch_builder, message_schema
from icespool.decode._proto_schema import ProtoSchema
from icespool.decode._records import Records, Target
from icespool.decode._registry import CachedSchemas, SchemaUnavailable
from icespool.decode._screen import EMPTY, oversized
from icespool.decode._wire import group_by_id, in_order, message_path, new_columns_request
from icespool.errors import BadInputError, SchemaError

__all__ = ["ProtobufValues"]

ProtoSchemas = CachedSchemas[ProtoSchema]


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
        values: list[bytes | None] = records.values.to_pylist()
        framed: list[int] = []
        for i, value in enumerate(values):
            if not value:
                dead.append(DeadRecord(i, "empty", EMPTY))
            elif len(value) > self._max_bytes:
                dead.append(oversized(i, len(value), self._max_bytes))
            else:
                framed.append(i)
        parts: list[tuple[pa.RecordBatch, list[int]]] = []
        declared: dict[str, pa.Field] = {}
        for schema_id, indices in group_by_id(values, framed, dead).items():
            try:
                schema = schemas.get(schema_id)
            except SchemaUnavailable as exc:
                dead.extend(DeadRecord(i, exc.reason, str(exc)) for i in indices)
                continue
            for (descriptor, cls), group in _by_message(schema, values, indices, dead).items():
                _declare(descriptor, depth, columns, declared)
                _decode_group(schema, descriptor, cls, values, group, columns, depth, parts, dead)
        dead.sort(key=lambda d: d.index)
        wanted = pa.schema(list(declared.values())) if declared else None
        if not parts:
            return Decoded(None, np.empty(0, np.int64), dead, wanted)
        table, ok = in_order(parts, columns)
        batch = with_source_columns(table, records.take(ok), target.schema, self._source_columns)
        return Decoded(batch, ok, dead, wanted)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return new_columns_request(decoded)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        """The message schema of the first value whose schema and message are known (a
        table auto_create makes for a route)."""
        schemas = self._schemas()
        values: list[bytes | None] = records.values.to_pylist()
        dead: list[DeadRecord] = []
        for schema_id, indices in group_by_id(values, _nonempty(values), dead).items():
            try:
                schema = schemas.get(schema_id)
            except SchemaUnavailable:
                continue
            for descriptor, _ in _by_message(schema, values, indices, dead):
                return message_schema(descriptor, target.options.max_depth)
        raise BadInputError("no value names a Protobuf schema and message the registry knows")

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def _nonempty(values: list[bytes | None]) -> list[int]:
    return [i for i, v in enumerate(values) if v]


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
    schema: ProtoSchema, values: list[bytes | None], indices: list[int], dead: list[DeadRecord]
) -> dict[tuple[Any, Any], list[tuple[int, int]]]:
    """A schema's values by the message type their index path names, with where each
    message starts; values whose path is cut short or names no message are dead."""
    groups: dict[tuple[Any, Any], list[tuple[int, int]]] = {}
    for i in indices:
        value = values[i]
        assert value is not None
        try:
            path, start = message_path(value)
            found = schema.message(path)
        except (ValueError, LookupError) as exc:
            dead.append(DeadRecord(i, "invalid", f"not Protobuf of {schema.label}: {exc}"))
            continue
        groups.setdefault(found, []).append((i, start))
    return groups


def _decode_group(
    schema: ProtoSchema,
    descriptor: Any,
    cls: Any,
    values: list[bytes | None],
    group: list[tuple[int, int]],
    columns: pa.Schema,
    depth: int,
    out: list[tuple[pa.RecordBatch, list[int]]],
    dead: list[DeadRecord],
) -> None:
    label = f"{schema.label} ({descriptor.full_name})"
    try:
        build = batch_builder(descriptor, columns, depth)
    except BadInputError as exc:
        column = exc.column if isinstance(exc, SchemaError) else None
        dead.extend(DeadRecord(i, exc.reason, f"{label}: {exc}", column) for i, _ in group)
        return
    messages: dict[int, Any] = {}
    parse = cls.FromString
    for i, start in group:
        value = values[i]
        assert value is not None
        try:
            messages[i] = parse(memoryview(value)[start:])
        except DecodeError as exc:
            dead.append(DeadRecord(i, "invalid", f"not Protobuf of {label}: {exc}"))
    built, failed = split_failures(
        list(messages), lambda part: build([messages[i] for i in part]), CONVERSION_ERRORS
    )
    out.extend((batch, list(part)) for batch, part in built)
    for index, error in failed:
        reason = error.reason if isinstance(error, BadInputError) else "invalid"
        column = error.column if isinstance(error, SchemaError) else None
        dead.append(DeadRecord(index, reason, str(error), column))
