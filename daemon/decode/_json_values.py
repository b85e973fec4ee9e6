"""JSON values (each one JSON object: Kafka's ``format = "json"``) -> one batch per
table, record by record.

The values are screened (`icespool.decode._screen`), joined with newlines and decoded
by ONE ``decode_ndjson_lenient`` call (pyarrow.json with the table's schema): no
per-record dicts. Only when that call fails is the body split in halves, recursively,
until every bad record stands alone; the good halves go on. A few bad records cost a
few logarithmic rounds, not a per-record pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest, with_source_columns
from icespool.decode._locate import RecordError
from icespool.decode._ndjson import LenientResult, decode_ndjson_lenient, infer_records_schema
from icespool.decode._records import Records, Target
from icespool.decode._screen import drop, screened_values
from icespool.errors import BadInputError

__all__ = [
    "JsonValues",
    "dead_record",
    "infer_values_schema",
    "json_evolve_request",
    "value_schema",
]


def value_schema(schema: pa.Schema, source_columns: Sequence[str]) -> pa.Schema:
    """``schema`` without the columns the source adds (what the values hold)."""
    return pa.schema([f for f in schema if f.name not in source_columns])


def infer_values_schema(records: Records, target: Target) -> pa.Schema:
    """The Arrow schema inferred for the values as JSON records (a new table's)."""
    values = [v or b"" for v in records.values.to_pylist()]
    return infer_records_schema(values, None, target.options.max_depth)


def json_evolve_request(records: Records, decoded: Decoded, target: Target) -> EvolveRequest | None:
    """The columns the dead records of a JSON decode failed on, with the schema their
    values infer (the records that fit no column type are refused on their own)."""
    failed = [d for d in decoded.dead if d.column is not None]
    if not failed:
        return None
    rows = np.asarray([d.index for d in failed], dtype=np.int64)
    values = [v or b"" for v in records.values.take(pa.array(rows)).to_pylist()]
    columns = frozenset(d.column for d in failed if d.column is not None)
    depth = target.options.max_depth
    return EvolveRequest(columns, lambda: infer_records_schema(values, columns, depth), exact=False)


class JsonValues:
    """The decoder of JSON values, lenient: every record that fails is a dead record
    (``empty``, ``oversized``, ``too_deep`` before the parse; the parse's own reasons
    after it, naming the column where one is at fault)."""

    def __init__(self, *, source_columns: Sequence[str] = (), max_record_bytes: int = 2**20):
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        options = target.options
        body, good, dead = screened_values(records.values, self._max_bytes, options.max_depth)
        columns = value_schema(target.schema, self._source_columns)
        # One record per line and no blank line: line k of the body is value good[k].
        result = (
            decode_ndjson_lenient(body, columns, options) if len(good) else LenientResult(None, [])
        )
        ok = good
        if result.errors:
            bad = np.asarray([e.index for e in result.errors], dtype=np.int64)
            ok = drop(good, bad)
            dead.extend(dead_record(int(good[e.index]), e) for e in result.errors)
        dead.sort(key=lambda d: d.index)
        if result.table is None:
            return Decoded(None, np.empty(0, np.int64), dead)
        rows = records if len(ok) == len(records) else records.take(ok)
        batch = with_source_columns(result.table, rows, target.schema, self._source_columns)
        return Decoded(batch, ok, dead)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return json_evolve_request(records, decoded, target)

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        return infer_values_schema(records, target)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def dead_record(index: int, error: RecordError) -> DeadRecord:
    """The dead record at ``index`` of a value the lenient NDJSON decode refused."""
    # As the error the record alone raises (a SchemaError names its column first).
    text = error.message if error.column is None else f"column {error.column!r}: {error.message}"
    return DeadRecord(index, error.reason, text, error.column)
