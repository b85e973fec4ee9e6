"""Every wire format -> Arrow rows in a table's schema, through one interface.

Each source (HTTP bodies, Kafka fetches, dead-letter replays) hands its records to
the `Decoder` that `decoder_for` picks for its format: binary values in (plus keys
and headers where the format needs them), rows in the table's schema and the
records that failed (with their reasons) out; all or nothing for an HTTP body,
record by record for Kafka (see `icespool.decode._decoder`).

NDJSON is parsed by ONE ``pyarrow.json.read_json`` call with the table's types as the
explicit schema. Python reads single lines only when that call failed (to say which
line and column were wrong) or when a C-speed byte scan saw a shape pyarrow gets
wrong (a top-level ``null``, two objects on one line, an object over several lines).
Every decoder blocks: callers run it in a worker thread.

Value rules for NDJSON (what a client may send per column type):

- ``boolean``: ``true``/``false``. ``int``/``long``: JSON integers in range (no
  ``1.0``, no strings). ``float``/``double``: any JSON number. ``decimal(p,s)``: a
  JSON number or string with at most ``s`` fractional digits. ``string``: a JSON
  string (numbers are not stringified).
- ``timestamptz``: ISO-8601 text, ``T`` or space between date and time, up to
  microseconds. With an offset (``Z``, ``+02:00``, ``+0200``) it is converted to UTC;
  without one it is taken as UTC (Iceberg and Spark store timestamptz as UTC). A
  bare date means midnight UTC. Numbers are refused: epoch units are ambiguous.
- ``timestamp`` (no zone): the same text WITHOUT an offset; a value carrying an
  offset is refused, because silently dropping or applying it would change the
  wall-clock time the column stores.
- ``date``: ``YYYY-MM-DD``. ``time``: ``HH:MM[:SS[.ffffff]]`` without offset.
- ``uuid``: any spelling ``uuid.UUID`` reads. ``binary``/``fixed(n)``: base64 (JSON
  has no bytes; ``fixed(n)`` must decode to exactly n bytes). These three convert
  value by value in Python, so they are the slow column types.
- ``null`` or an absent key is a null; for a required column that is an error
  naming the column and line.

Every failure is a ``BadInputError`` (``SchemaError`` when one column is at fault)
whose message names the line (1-based, counting blank lines) and what was expected.

The package, along what it does:

    _decoder        the `Decoder` protocol and `decoder_for`, the one factory
    _records        what decoders read (`Records`, `RecordArrays`) and the `Target` table
    _decoded        what they give: `Decoded`, `DeadRecord`, `EvolveRequest`
    _screen         value checks before a parse (empty, oversized, blank, too deep)
                    and the one newline-joined body of values
    _body           HTTP bodies (NDJSON, JSON array, Arrow IPC), all or nothing
    _change_body    HTTP change bodies: rows with "_op" -> a change batch
    _json_values    Kafka JSON values, record by record
    _raw            Kafka raw values: key, value, headers as they are
    _avro           Kafka Avro values; _avro_registry where writer schemas come
                    from, _avro_schema their parse, _avro_convert records -> columns
    _keyed          Kafka change records (Debezium, keyed) -> one change batch;
                    _keyed_rows reads values and keys into rows, _connect honours
                    Debezium's Kafka Connect schemas
    _route          route values read from a field of JSON values
    _ndjson         NDJSON bodies and JSON values -> tables; all or nothing, or per record
    _json_array     JSON array bodies -> NDJSON, errors by index
    _arrow          Arrow IPC stream bodies
    _plan           the decode plan: per column, what pyarrow parses and how it converts
    _convert        the converters from what pyarrow parsed to the column types
    _checks         guards before pyarrow's parse, conversion and checks after it
    _locate         which line, index and column a failure is at (and the one bisect)
    _nesting        how deep JSON nests, found without recursion
    _json_types     JSON records that disagree on a field's type

fastavro is imported only for Avro sources, and nothing here imports the Kafka client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.decode._arrow import decode_arrow_stream
    from icespool.decode._avro import AvroValues
    from icespool.decode._body import (
        ARROW_STREAM,
        FORMATS,
        JSON,
        NDJSON,
        ArrowBody,
        JsonArrayBody,
        NdjsonBody,
    )
    from icespool.decode._change_body import key_error, no_key, refuse_changes, without_op_column
    from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest
    from icespool.decode._decoder import Decoder, decoder_for
    from icespool.decode._json_array import ndjson_from_array
    from icespool.decode._json_values import JsonValues
    from icespool.decode._keyed import KeyedChanges
    from icespool.decode._locate import RecordError, count_ndjson_records
    from icespool.decode._ndjson import LenientResult, decode_ndjson, decode_ndjson_lenient
    from icespool.decode._plan import JsonOptions
    from icespool.decode._raw import RawValues, header_name, headers_json
    from icespool.decode._records import Binary, RecordArrays, Records, Target, binary_array
    from icespool.decode._route import route_field_values

__all__ = [
    "ARROW_STREAM",
    "FORMATS",
    "JSON",
    "NDJSON",
    "ArrowBody",
    "AvroValues",
    "Binary",
    "DeadRecord",
    "Decoded",
    "Decoder",
    "EvolveRequest",
    "JsonArrayBody",
    "JsonOptions",
    "JsonValues",
    "KeyedChanges",
    "LenientResult",
    "NdjsonBody",
    "RawValues",
    "RecordArrays",
    "RecordError",
    "Records",
    "Target",
    "binary_array",
    "count_ndjson_records",
    "decode_arrow_stream",
    "decode_ndjson",
    "decode_ndjson_lenient",
    "decoder_for",
    "header_name",
    "headers_json",
    "key_error",
    "ndjson_from_array",
    "no_key",
    "refuse_changes",
    "route_field_values",
    "without_op_column",
]

# Imported when first used (see icespool._lazy): an HTTP-only daemon never imports
# fastavro, and the config's Avro check only the schema parser.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.decode._arrow": ("decode_arrow_stream",),
        "icespool.decode._avro": ("AvroValues",),
        "icespool.decode._body": (
            "ARROW_STREAM",
            "FORMATS",
            "JSON",
            "NDJSON",
            "ArrowBody",
            "JsonArrayBody",
            "NdjsonBody",
        ),
        "icespool.decode._change_body": (
            "key_error",
            "no_key",
            "refuse_changes",
            "without_op_column",
        ),
        "icespool.decode._decoded": (
            "DeadRecord",
            "Decoded",
            "EvolveRequest",
        ),
        "icespool.decode._decoder": (
            "Decoder",
            "decoder_for",
        ),
        "icespool.decode._json_array": ("ndjson_from_array",),
        "icespool.decode._json_values": ("JsonValues",),
        "icespool.decode._keyed": ("KeyedChanges",),
        "icespool.decode._locate": (
            "RecordError",
            "count_ndjson_records",
        ),
        "icespool.decode._ndjson": (
            "LenientResult",
            "decode_ndjson",
            "decode_ndjson_lenient",
        ),
        "icespool.decode._plan": ("JsonOptions",),
        "icespool.decode._raw": (
            "RawValues",
            "header_name",
            "headers_json",
        ),
        "icespool.decode._records": (
            "Binary",
            "RecordArrays",
            "Records",
            "Target",
            "binary_array",
        ),
        "icespool.decode._route": ("route_field_values",),
    },
)
