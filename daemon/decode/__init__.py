"""Request bodies -> Arrow tables in a table's schema, a whole body at a time.

NDJSON is parsed by ONE ``pyarrow.json.read_json`` call with the table's types as the
explicit schema. Python reads single lines only when that call failed (to say which
line and column were wrong) or when a C-speed byte scan saw a shape pyarrow gets
wrong (a top-level ``null``, two objects on one line, an object over several lines).
Both decoders block: the HTTP handler runs them in a worker thread.

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

    _ndjson   NDJSON bodies and JSON values -> tables; all or nothing, or per record
    _arrow    Arrow IPC stream bodies
    _plan     the decode plan: per column, what pyarrow parses and how it converts
    _convert  the converters from what pyarrow parsed to the column types
    _checks   guards before pyarrow's parse, conversion and checks after it
    _locate   which line, index and column a failure is at (and the one bisect)
"""

from icespool.decode._arrow import decode_arrow_stream
from icespool.decode._change_body import (
    HTTP_OP,
    body_schema,
    key_error,
    line_of,
    no_key,
    row_of,
    to_changes,
    without_op,
)
from icespool.decode._checks import check_depth
from icespool.decode._json_array import JSON, array_error, ndjson_from_array
from icespool.decode._locate import RecordError, count_ndjson_records, split_failures
from icespool.decode._ndjson import (
    LenientResult,
    decode_ndjson,
    decode_ndjson_lenient,
    infer_ndjson_schema,
    infer_records_schema,
)
from icespool.decode._plan import JsonOptions

__all__ = [
    "HTTP_OP",
    "JSON",
    "JsonOptions",
    "LenientResult",
    "RecordError",
    "array_error",
    "body_schema",
    "check_depth",
    "count_ndjson_records",
    "decode_arrow_stream",
    "decode_ndjson",
    "decode_ndjson_lenient",
    "infer_ndjson_schema",
    "infer_records_schema",
    "key_error",
    "line_of",
    "ndjson_from_array",
    "no_key",
    "row_of",
    "split_failures",
    "to_changes",
    "without_op",
]
