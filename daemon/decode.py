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
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.json as pj

from daemon.errors import BadInputError, SchemaError

__all__ = ["decode_arrow_stream", "decode_ndjson"]

_JSON_WS: Final = b" \t\r\n"
_BLANK: Final = re.compile(rb"[ \t\r\n]*")
_STARTS_WITH_OBJECT: Final = re.compile(rb"[ \t\r\n]*\{")
# pyarrow 26 segfaults when the first value of a block is a top-level `null`, and
# turns a later top-level `null` into an all-null row instead of an error. A
# top-level null can only follow a closing brace, and two objects on one line
# (which would break the row -> line mapping) also show `}` then `{`. A match
# (including a false one inside a string) only sends the body through a strict
# line-by-line check before pyarrow sees it.
_SUSPICIOUS: Final = re.compile(rb"}(?:[ \t\r]*\{|[ \t\r\n]*null)")
_BLANK_LINE: Final = re.compile(rb"(?:^|\n)[ \t\r]*(?=\n|\Z)")
_BLOCK: Final = 256 << 10
_SHOWN_COLUMNS: Final = 20
_SHOWN_VALUE_CHARS: Final = 60
_UNIX_DAY: Final = "1970-01-01T"

Converter = Callable[[pa.ChunkedArray], pa.Array | pa.ChunkedArray]


class _RowError(Exception):
    """A converted column failed at ``row`` (0-based record index)."""

    def __init__(self, row: int, value: object) -> None:
        self.row = row
        self.value = value
        super().__init__(row, value)


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    target: pa.DataType
    parse_type: pa.DataType  # what pyarrow.json is asked to produce
    convert: Converter | None  # parse_type -> target; None when they are equal
    required: bool
    expected: str  # for error messages: "expected <this>"


@dataclass(frozen=True, slots=True)
class _Plan:
    columns: tuple[_Column, ...]
    parse_schema: pa.Schema
    by_name: dict[str, _Column]


# ------------------------------------------------------------------ public API


def decode_ndjson(body: bytes, schema: pa.Schema) -> pa.Table:
    """Decode newline-delimited JSON objects into a table with exactly ``schema``.

    All or nothing: any bad line raises `BadInputError` (or `SchemaError`) naming
    the first bad line and, where one is at fault, the column.
    """
    if _BLANK.fullmatch(body):
        raise BadInputError("no records: the body is empty; send one JSON object per line")
    plan = _plan(schema)
    if not _STARTS_WITH_OBJECT.match(body) or _SUSPICIOUS.search(body):
        _check_one_object_per_line(body)
    try:
        raw = pj.read_json(
            pa.BufferReader(body),
            read_options=pj.ReadOptions(
                # Blocks split at newlines (newlines_in_values=False), so records never
                # straddle them; parsing blocks on pyarrow's CPU pool halves the latency
                # of a 1.6 MB body (8 -> 4.5 ms on 2 cores), and that pool is sized to
                # the cores, so concurrent requests cannot oversubscribe them.
                block_size=_BLOCK,
                use_threads=len(body) > _BLOCK,
            ),
            parse_options=pj.ParseOptions(
                explicit_schema=plan.parse_schema,
                unexpected_field_behavior="error",
                newlines_in_values=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise _explain(body, plan, exc) from exc
    if raw.num_rows != _count_lines(body) and raw.num_rows != _count_nonblank_lines(body):
        # pyarrow also reads an object spread over several lines; NDJSON does not
        # allow that, and error messages could no longer name the right line.
        _check_one_object_per_line(body)
    return _finish(raw, plan, schema, body)


def decode_arrow_stream(body: bytes, schema: pa.Schema) -> pa.Table:
    """Read an Arrow IPC stream. Casting to ``schema`` is the writer's job (``conform``)."""
    del schema  # conform() in TableWriter.append casts and names the failing column
    if not body:
        raise BadInputError("no records: the body is empty; send an Arrow IPC stream")
    try:
        with ipc.open_stream(pa.BufferReader(body)) as reader:
            table = reader.read_all()
        # The body comes from the network: offsets and lengths inside it must be
        # checked before any kernel trusts them, or a crafted stream reads out of bounds.
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        raise BadInputError(
            f"the body is not a valid Arrow IPC stream ({_first_line(str(exc))}); send "
            "the bytes of a pyarrow.ipc.new_stream writer with "
            "Content-Type application/vnd.apache.arrow.stream"
        ) from exc
    if table.num_rows == 0:
        raise BadInputError("no records: the Arrow stream holds no rows")
    return table


# ------------------------------------------------------------------ the decode plan


@functools.lru_cache(maxsize=64)
def _plan(schema: pa.Schema) -> _Plan:
    columns = tuple(_column(field) for field in schema)
    parse_schema = pa.schema([pa.field(c.name, c.parse_type) for c in columns])
    return _Plan(columns, parse_schema, {c.name: c for c in columns})


def _column(field: pa.Field) -> _Column:
    t = field.type
    required = not field.nullable

    def col(parse: pa.DataType, convert: Converter | None, expected: str) -> _Column:
        return _Column(field.name, t, parse, convert, required, expected)

    if pa.types.is_boolean(t):
        return col(t, None, "true or false")
    if pa.types.is_integer(t):
        info = _int_range(t)
        return col(t, None, f"an integer from {info[0]} to {info[1]}")
    if pa.types.is_floating(t):
        return col(t, None, "a number")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col(t, None, "a string")
    if pa.types.is_decimal(t):
        return col(
            t,
            None,
            f"a decimal (number or string) with at most {t.precision - t.scale} integer "
            f"and {t.scale} fractional digits",
        )
    if pa.types.is_timestamp(t) and t.tz is not None:
        return col(
            t,
            None,
            'an ISO-8601 timestamp string such as "2024-05-01T12:00:00Z" or '
            f'"2024-05-01T14:00:00.5+02:00" (no offset means UTC; at most {_digits(t)} '
            "fractional digits)",
        )
    if pa.types.is_timestamp(t):
        return col(
            pa.string(),
            _cast_text(t),
            'an ISO-8601 timestamp string WITHOUT offset such as "2024-05-01T12:00:00" '
            f"(the column has no time zone; at most {_digits(t)} fractional digits)",
        )
    if pa.types.is_date(t):
        return col(pa.string(), _cast_text(t), 'a date string "YYYY-MM-DD"')
    if pa.types.is_time(t):
        return col(pa.string(), _time_of_day(t), 'a time string "HH:MM:SS[.ffffff]"')
    if isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.uuid":
        return col(pa.string(), _per_value(t, _uuid_bytes), "a UUID string")
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        return col(
            pa.string(),
            _per_value(t, functools.partial(_base64_fixed, width)),
            f"a base64 string of exactly {width} bytes",
        )
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return col(pa.string(), _per_value(t, _base64), "a base64 string")
    # Anything newer than this list: let Arrow's own string cast try.
    return col(pa.string(), _cast_text(t), f"a string convertible to {t}")


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _digits(t: pa.TimestampType) -> int:
    return {"s": 0, "ms": 3, "us": 6, "ns": 9}[t.unit]


# ------------------------------------------------------------------ converters


def _cast_text(target: pa.DataType) -> Converter:
    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return pc.cast(values, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: pc.cast(pa.array([v]), target)) from exc

    return convert


def _time_of_day(target: pa.DataType) -> Converter:
    # Arrow has no string -> time cast; a time is the time of day of a naive
    # timestamp on 1970-01-01, and that cast refuses offsets for free.
    stamp = pa.timestamp(target.unit)

    def to_time(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        text = pc.binary_join_element_wise(_UNIX_DAY, values, "")
        return pc.cast(pc.cast(text, stamp), target)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return to_time(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: to_time(pa.array([v], pa.string()))) from exc

    return convert


def _per_value(target: pa.DataType, one: Callable[[str], bytes]) -> Converter:
    storage = target.storage_type if isinstance(target, pa.BaseExtensionType) else target

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        out: list[bytes | None] = []
        for row, value in enumerate(values.to_pylist()):
            if value is None:
                out.append(None)
                continue
            try:
                out.append(one(value))
            except ValueError as exc:
                raise _RowError(row, value) from exc
        array = pa.array(out, storage)
        if isinstance(target, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(target, array)
        return array

    return convert


def _uuid_bytes(text: str) -> bytes:
    return uuid.UUID(text).bytes


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc


def _base64_fixed(width: int, text: str) -> bytes:
    data = _base64(text)
    if len(data) != width:
        raise ValueError(f"{len(data)} bytes, not {width}")
    return data


def _first_failure(values: pa.ChunkedArray, attempt: Callable[[Any], object]) -> _RowError:
    """The first row whose value fails ``attempt`` (failure path only: per value)."""
    for row, value in enumerate(values.to_pylist()):
        if value is None:
            continue
        try:
            attempt(value)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return _RowError(row, value)
    return _RowError(-1, None)


# ------------------------------------------------------------------ after the parse


def _finish(raw: pa.Table, plan: _Plan, schema: pa.Schema, body: bytes) -> pa.Table:
    if raw.num_rows == 0:
        raise BadInputError("no records: the body holds only blank lines")
    columns: list[pa.Array | pa.ChunkedArray] = []
    for index, column in enumerate(plan.columns):
        values: pa.Array | pa.ChunkedArray = raw.column(index)
        if pa.types.is_string(column.parse_type):
            _check_utf8(column.name, raw.column(index), body)
        if column.convert is not None:
            try:
                values = column.convert(raw.column(index))
            except _RowError as exc:
                where = _line_of_row(body, exc.row)
                raise SchemaError(
                    column.name,
                    f"expected {column.expected}, got {_show(exc.value)}{where}",
                ) from None
        if column.required and values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise SchemaError(
                column.name, f"required column is missing or null{_line_of_row(body, row)}"
            )
        columns.append(values)
    return pa.Table.from_arrays(columns, schema=schema)


def _check_utf8(name: str, values: pa.ChunkedArray, body: bytes) -> None:
    # pyarrow.json copies string bytes as they are; invalid UTF-8 would only blow
    # up later, in the Parquet encoder or in a Spark job reading the table.
    try:
        values.validate(full=True)
    except pa.ArrowInvalid:
        for row, raw in enumerate(values.cast(pa.binary()).to_pylist()):
            try:
                (raw or b"").decode("utf-8")
            except UnicodeDecodeError:
                raise SchemaError(
                    name, f"the value is not valid UTF-8{_line_of_row(body, row)}"
                ) from None
        raise SchemaError(name, "a value is not valid UTF-8") from None


def _count_lines(body: bytes) -> int:
    """Lines if none is blank (the usual body): one C-speed count."""
    return body.count(b"\n") + (not body.endswith(b"\n"))


def _count_nonblank_lines(body: bytes) -> int:
    # Segments between newlines, minus the whitespace-only ones (this includes the
    # empty segment after a final newline).
    return body.count(b"\n") + 1 - len(_BLANK_LINE.findall(body))


def _line_of_row(body: bytes, row: int) -> str:
    """`` (line N)`` for record ``row``: one record per non-blank line was checked."""
    if row < 0:
        return ""
    seen = -1
    for number, line in _lines(body):
        if line.strip(_JSON_WS):
            seen += 1
            if seen == row:
                return f" (line {number})"
    return ""


def _lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    return enumerate(body.split(b"\n"), start=1)


# ------------------------------------------------------------------ failure path


def _check_one_object_per_line(body: bytes) -> None:
    """Strict NDJSON check, for bodies the cheap scan could not clear."""
    for number, line in _lines(body):
        if line.strip(_JSON_WS):
            _parse_line(number, line)


def _parse_line(number: int, line: bytes) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise SchemaError(key, f"appears twice in the object on line {number}")
            result[key] = value
        return result

    try:
        value = json.loads(line, object_pairs_hook=no_duplicates)
    except UnicodeDecodeError as exc:
        raise BadInputError(f"line {number}: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise BadInputError(
            f"line {number}: invalid JSON ({exc.msg} at character {exc.colno}); send one "
            "JSON object per line, without line breaks inside a record"
        ) from None
    if not isinstance(value, dict):
        raise BadInputError(f"line {number}: expected a JSON object, got {_kind(value)}")
    return value


def _explain(body: bytes, plan: _Plan, exc: Exception) -> BadInputError:
    number = _first_bad_line(body, plan)
    if number is None:
        return BadInputError(f"the body is not valid NDJSON: {_first_line(str(exc))}")
    line = body.split(b"\n")[number - 1]
    try:
        record = _parse_line(number, line)
    except BadInputError as problem:
        return problem
    unknown = [key for key in record if key not in plan.by_name]
    if unknown:
        return SchemaError(
            unknown[0],
            f"not in the table schema (line {number}); the columns are {_names(plan)}",
        )
    for key, value in record.items():
        column = plan.by_name[key]
        if not _parses(line, column):
            return SchemaError(
                key, f"expected {column.expected}, got {_show(value)} (line {number})"
            )
    return BadInputError(f"line {number}: {_first_line(str(exc))}")


def _first_bad_line(body: bytes, plan: _Plan) -> int | None:
    """Bisect on line prefixes with the same parser: O(log n) parses of the body."""
    ends: list[int] = []
    position = 0
    for line in body.split(b"\n"):
        position += len(line) + 1
        ends.append(min(position, len(body)))
    view = memoryview(body)

    def prefix_fails(count: int) -> bool:
        chunk = view[: ends[count - 1]]
        if _BLANK.fullmatch(chunk):
            return False
        try:
            pj.read_json(
                pa.BufferReader(pa.py_buffer(chunk)),
                read_options=pj.ReadOptions(block_size=len(chunk) + 1, use_threads=False),
                parse_options=pj.ParseOptions(
                    explicit_schema=plan.parse_schema,
                    unexpected_field_behavior="error",
                    newlines_in_values=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return True
        return False

    low, high = 1, len(ends)
    if not prefix_fails(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if prefix_fails(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _parses(line: bytes, column: _Column) -> bool:
    """Whether pyarrow reads this one column of one (valid JSON) line."""
    try:
        pj.read_json(
            pa.BufferReader(line),
            parse_options=pj.ParseOptions(
                explicit_schema=pa.schema([pa.field(column.name, column.parse_type)]),
                unexpected_field_behavior="ignore",
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def _names(plan: _Plan) -> str:
    names = [c.name for c in plan.columns]
    shown = ", ".join(names[:_SHOWN_COLUMNS])
    return shown if len(names) <= _SHOWN_COLUMNS else f"{shown}, ... ({len(names)} in all)"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=True)
    if len(text) > _SHOWN_VALUE_CHARS:
        text = text[: _SHOWN_VALUE_CHARS - 3] + "..."
    return text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
