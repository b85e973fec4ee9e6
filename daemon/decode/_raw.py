"""Raw values (Kafka's ``format = "raw"``): key, value and headers kept as they are."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._decoded import Decoded, EvolveRequest, with_source_columns
from icespool.decode._json_values import infer_values_schema
from icespool.decode._records import Records, Target
from icespool.decode._screen import oversized
from icespool.errors import BadInputError

__all__ = ["RawValues", "header_name", "headers_json"]


class RawValues:
    """The decoder of raw records: columns ``key``/``value`` (binary) and ``headers``
    (string: a JSON list of ``[name, base64 value]`` pairs), those the table has. Only
    a value over ``max_record_bytes`` fails (``oversized``)."""

    def __init__(self, *, source_columns: Sequence[str] = (), max_record_bytes: int = 2**20):
        self._source_columns = tuple(source_columns)
        self._max_bytes = max_record_bytes

    def decode(self, records: Records, target: Target) -> Decoded:
        lengths = pc.fill_null(pc.binary_length(records.values), 0).to_numpy()
        over = lengths > self._max_bytes
        dead = [
            oversized(i, int(lengths[i]), self._max_bytes) for i in np.flatnonzero(over).tolist()
        ]
        ok = np.flatnonzero(~over).astype(np.int64)
        rows = records if len(ok) == len(records) else records.take(ok)
        columns: dict[str, pa.Array] = {}
        names = set(target.schema.names)
        if "key" in names:
            columns["key"] = rows.keys
        if "value" in names:
            columns["value"] = rows.values
        if "headers" in names:
            columns["headers"] = pa.array([headers_json(h) for h in rows.headers], pa.string())
        table = pa.table(columns) if columns else pa.table({"_": pa.nulls(len(ok))}).drop(["_"])
        if not len(ok):
            return Decoded(None, ok, dead)
        batch = with_source_columns(table, rows, target.schema, self._source_columns)
        return Decoded(batch, ok, dead)

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        return None  # the columns are fixed

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        # A table auto_create makes for a route: from the values read as JSON, as
        # for every Kafka format.
        return infer_values_schema(records, target)

    def rephrase(self, error: BadInputError) -> BadInputError:
        return error


def headers_json(headers: Sequence[tuple[str, bytes]]) -> str:
    """Headers as one JSON text: a list of ``[name, base64 value]`` pairs."""
    return json.dumps([[header_name(k), base64.b64encode(v or b"").decode()] for k, v in headers])


def header_name(key: str) -> str:
    """A header key as valid text: one read from bytes that are not UTF-8 (kept with
    surrogate escapes by the raw reader) shows those bytes as ``\\xff``."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return key
