"""HTTP request bodies -> a table's rows or changes, all or nothing.

A body is one record (`Records` of one value); its decoder reads all of it into the
table's schema or refuses it whole. A failure on one column (`SchemaError`) comes
back in `Decoded.error`, so the caller can evolve the table for it and decode again;
every other failure is raised, naming the line (NDJSON), the array index (a JSON
array) or the row (Arrow). With ``changes`` the body holds keyed changes: the table's
columns plus ``"_op": "upsert" | "delete"`` (`icespool.decode._change_body`).

    application/x-ndjson                 `NdjsonBody`     one JSON object per line
    application/json                     `JsonArrayBody`  an array of objects, read as
                                                          the NDJSON of its elements
    application/vnd.apache.arrow.stream  `ArrowBody`      an Arrow IPC stream
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from icespool.cdc import change_schema, conform_changes
from icespool.decode._arrow import decode_arrow_stream
from icespool.decode._change_body import (
    HTTP_OP,
    NO_OP,
    body_schema,
    line_of,
    refuse_changes,
    row_of,
    to_changes,
    without_op,
    without_op_column,
)
from icespool.decode._decoded import Decoded, EvolveRequest
from icespool.decode._json_array import JSON, array_error, ndjson_from_array
from icespool.decode._ndjson import decode_ndjson, infer_ndjson_schema
from icespool.decode._records import RecordArrays, Records, Target
from icespool.errors import BadInputError, SchemaError
from icespool.schema import conform

__all__ = ["ARROW_STREAM", "FORMATS", "JSON", "NDJSON", "ArrowBody", "JsonArrayBody", "NdjsonBody"]

NDJSON: Final = "application/x-ndjson"
ARROW_STREAM: Final = "application/vnd.apache.arrow.stream"
#: Body formats (HTTP Content-Type values). ``application/json`` is a JSON array of
#: objects, taken as the NDJSON of its elements (`ndjson_from_array`).
FORMATS: Final = frozenset({NDJSON, ARROW_STREAM, JSON})


def _body(records: Records) -> bytes:
    body = records.value(0)
    assert body is not None and len(records) == 1, "an HTTP body is one record"
    return body


class NdjsonBody:
    """``application/x-ndjson``: one JSON object per line, blank lines skipped."""

    def __init__(self, *, changes: bool = False) -> None:
        self._changes = changes

    def decode(self, records: Records, target: Target) -> Decoded:
        body = _body(records)
        schema = target.schema
        if self._changes:
            schema = body_schema(change_schema(schema, target.key))
        try:
            table = decode_ndjson(body, schema, target.options)
        except SchemaError as exc:
            return Decoded.refused(exc)
        if self._changes:
            return Decoded.whole(to_changes(table, target.schema, target.key, line_of(body)))
        return Decoded.whole(table)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return _inferred_request(_body(records), decoded, target, self._changes)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        return infer_ndjson_schema(_body(records), target.options.max_depth)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


class JsonArrayBody:
    """``application/json``: a JSON array of objects, turned into NDJSON (element ``i``
    is line ``i + 1``) and read as `NdjsonBody` reads it; its errors name the array
    index instead of the line."""

    def __init__(self, *, changes: bool = False) -> None:
        self._changes = changes
        self._lines = NdjsonBody(changes=changes)

    def decode(self, records: Records, target: Target) -> Decoded:
        return self._lines.decode(_as_lines(records), target)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        # Converted again only when asked (in a thread), not here on the event loop.
        return _inferred_request(_body(records), decoded, target, self._changes, array=True)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        return self._lines.incoming(_as_lines(records), target)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return array_error(error)


def _as_lines(records: Records) -> RecordArrays:
    return RecordArrays([ndjson_from_array(_body(records))])


def _inferred_request(
    body: bytes, decoded: Decoded, target: Target, changes: bool, *, array: bool = False
) -> EvolveRequest | None:
    """The column a JSON body failed on, with the schema the body infers (blocking,
    asked in a thread: the body is read again then, a JSON array turned into NDJSON)."""
    if decoded.error is None:
        return None
    depth = target.options.max_depth

    def inferred() -> pa.Schema:
        schema = infer_ndjson_schema(ndjson_from_array(body) if array else body, depth)
        # A change body's _op is no column to evolve the table for.
        return without_op(schema) if changes else schema

    # One column per round: the decode names the first one it failed on.
    return EvolveRequest(frozenset({decoded.error.column}), inferred, exact=False)


class ArrowBody:
    """``application/vnd.apache.arrow.stream``: an Arrow IPC stream, conformed to the
    table (an upsert table takes rows, each an upsert, or change batches as they are)."""

    def __init__(self, *, changes: bool = False) -> None:
        self._changes = changes

    def decode(self, records: Records, target: Target) -> Decoded:
        raw = decode_arrow_stream(_body(records))
        schema, key = target.schema, target.key
        if self._changes:
            if HTTP_OP not in raw.schema.names:
                raise SchemaError(HTTP_OP, NO_OP)  # no schema change gives it one
            try:
                rows = conform(raw, body_schema(change_schema(schema, key)))
            except SchemaError as exc:
                return Decoded.refused(exc)
            return Decoded.whole(to_changes(rows, schema, key, row_of))
        refuse_changes(target.name, raw.schema, key)
        try:
            batch = conform_changes(raw, schema, key) if key else conform(raw, schema)
        except SchemaError as exc:
            return Decoded.refused(exc)
        return Decoded.whole(batch)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        if decoded.error is None:
            return None
        body = _body(records)

        def incoming() -> pa.Schema:
            schema = decode_arrow_stream(body).schema
            if self._changes:
                return without_op(schema)
            # The op column is the change batch's, never a column to evolve for.
            return without_op_column(schema) if target.key else schema

        return EvolveRequest(frozenset({decoded.error.column}), incoming, exact=True)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        schema = decode_arrow_stream(_body(records)).schema
        # Refused before the table is created for it (it would get the op as a column).
        refuse_changes(target.name, schema, target.key)
        return schema

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error
