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
import decimal
import functools
import json
import re
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.json as pj

from icespool.errors import BadInputError, SchemaError
from icespool.json_types import first_conflict, merge_inferred
from icespool.nesting import DEFAULT_MAX_DEPTH, too_deep, too_deep_lines
from icespool.schema import (
    HUGE_EXPONENT,
    SchemaChangeError,
    cast_array,
    check_required_children,
    find_out_of_range,
)

__all__ = [
    "JsonOptions",
    "LenientResult",
    "RecordError",
    "check_depth",
    "count_ndjson_records",
    "decode_arrow_stream",
    "decode_ndjson",
    "decode_ndjson_lenient",
    "infer_ndjson_schema",
    "infer_records_schema",
    "split_failures",
]

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
_MAX_BLOCK: Final = 2**31 - 1  # pyarrow's block size is an int32
_STRADDLING: Final = "straddling object straddles two block boundaries"
_SHOWN_COLUMNS: Final = 20
_SHOWN_VALUE_CHARS: Final = 60
_UNIX_DAY: Final = "1970-01-01T"

Converter = Callable[[pa.ChunkedArray], pa.Array | pa.ChunkedArray]
_T = TypeVar("_T")


class _RowError(Exception):
    """A converted column failed at ``row`` (0-based record index; -1: inside a nested
    value, record unknown). ``problem`` replaces the generic "expected ..." message."""

    def __init__(
        self, row: int, value: object, problem: str | None = None, column: str | None = None
    ) -> None:
        self.row = row
        self.value = value
        self.problem = problem
        self.column = column  # nested path at fault, when deeper than the column
        super().__init__(row, value)


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    target: pa.DataType
    parse_type: pa.DataType  # what pyarrow.json is asked to produce
    convert: Converter | None  # parse_type -> target; None when they are equal
    required: bool
    expected: str  # for error messages: "expected <this>"
    nested: bool  # struct, list or map: converted arrays are cast to the target at the end


@dataclass(frozen=True, slots=True)
class _Plan:
    columns: tuple[_Column, ...]
    parse_schema: pa.Schema
    by_name: dict[str, _Column]
    duals: frozenset[str]  # timestamp paths that take epoch numbers or ISO text
    numbers: frozenset[str]  # ... of which this plan parses these as numbers


# ------------------------------------------------------------------ public API

_UNITS: Final = ("s", "ms", "us", "ns")


@dataclass(frozen=True, slots=True)
class JsonOptions:
    """How JSON values map to a table's columns beyond the fixed rules.

    ``timestamp_unit`` (``s``, ``ms``, ``us``, ``ns``) lets timestamp columns take
    epoch numbers in that unit besides ISO-8601 text; ``column_units`` overrides it
    per top-level column (and the timestamps nested in that column).
    ``max_depth`` bounds how deeply a record may nest (``max_nesting_depth``).
    ``ignore_unknown``: fields the schema lacks are skipped instead of failing the
    record (an envelope such as Debezium's carries fields no table wants).
    Hashable, so decode plans are cached per (schema, options).
    """

    timestamp_unit: str | None = None
    column_units: tuple[tuple[str, str], ...] = ()
    max_depth: int = DEFAULT_MAX_DEPTH
    ignore_unknown: bool = False

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ValueError(f"max_depth {self.max_depth}: use 1 or more")
        for unit in (self.timestamp_unit, *(u for _, u in self.column_units)):
            if unit is not None and unit not in _UNITS:
                raise ValueError(f"timestamp unit {unit!r}: use one of {', '.join(_UNITS)}")

    def unit_for(self, column: str) -> str | None:
        for name, unit in self.column_units:
            if name == column:
                return unit
        return self.timestamp_unit

    @classmethod
    def for_table(cls, table: Any, max_depth: int = DEFAULT_MAX_DEPTH) -> JsonOptions:
        """Options from a ``TableConfig`` (its ``timestamp_unit`` and its columns')
        and its effective ``max_nesting_depth``."""
        columns = getattr(table, "columns", None) or ()
        return cls(
            getattr(table, "timestamp_unit", None),
            tuple(
                (c.name, c.timestamp_unit)
                for c in columns
                if getattr(c, "timestamp_unit", None) is not None
            ),
            max_depth,
        )


_DEFAULT_OPTIONS: Final = JsonOptions()


@dataclass(frozen=True, slots=True)
class RecordError:
    """One record that could not be decoded: ``index`` is its position in the input
    (0-based value index for a sequence, 0-based line index for a body), ``column``
    the column at fault (dotted path for nested fields; None when the record is not
    a JSON object at all), ``raw`` its bytes as received, ``reason`` the error's
    short label (see `BadInputError`)."""

    index: int
    column: str | None
    message: str
    raw: bytes
    reason: str = "invalid"


@dataclass(frozen=True, slots=True)
class LenientResult:
    """``table`` holds every good record in input order (None when there is none)."""

    table: pa.Table | None
    errors: list[RecordError]


def decode_ndjson(body: bytes, schema: pa.Schema, options: JsonOptions | None = None) -> pa.Table:
    """Decode newline-delimited JSON objects into a table with exactly ``schema``.

    All or nothing: any bad line raises `BadInputError` (or `SchemaError`) naming
    the first bad line and, where one is at fault, the column.
    """
    options = options or _DEFAULT_OPTIONS
    try:
        return _decode(body, schema, options, explain=True)
    except SchemaError:
        if not _plan(schema, options, None).duals:
            raise
        # Epoch numbers and ISO text mixed in one timestamp column: pyarrow reads one
        # JSON kind per column and body, so the body is split where the kind changes.
        result = decode_ndjson_lenient(body, schema, options)
        if not result.errors and result.table is not None:
            return result.table
        _raise_first(result)
    except _Locate:
        # A value deep inside a nested column failed; its record is found by
        # bisecting the body (only on this failure path).
        _raise_first(decode_ndjson_lenient(body, schema, options))


def _raise_first(result: LenientResult) -> NoReturn:
    first = result.errors[0]
    problem = f"{first.message} (line {first.index + 1})"
    if first.column is None:
        raise BadInputError(problem).because(first.reason) from None
    raise SchemaError(first.column, problem).because(first.reason) from None


def decode_ndjson_lenient(
    data: bytes | Sequence[bytes], schema: pa.Schema, options: JsonOptions | None = None
) -> LenientResult:
    """Decode what can be decoded; report each bad record instead of failing the batch.

    ``data`` is an NDJSON body (records are its non-blank lines) or a sequence of
    JSON values (Kafka message values; an empty value is a bad record). The whole
    input is decoded at once; only when that fails is it bisected, so k bad records
    cost O(k log n) pyarrow calls and the good ones keep the vectorized path.
    """
    options = options or _DEFAULT_OPTIONS
    if isinstance(data, bytes | bytearray | memoryview):
        body = bytes(data)
    else:
        data = list(data)
        body = b"\n".join(data)
        if (
            not data
            or body.count(b"\n") != len(data) - 1
            or b"\r" in body
            or _BLANK_LINE.search(body)
        ):
            body = b""  # a value is empty or spans lines: the per-record split decides
    if body:
        try:
            return LenientResult(_decode(body, schema, options, explain=False), [])
        except (BadInputError, _Locate):
            pass  # found below, record by record
    lines, indices, errors = _split_records(data)
    line_of = dict(zip(indices, lines, strict=True))

    def decode(part: Sequence[int]) -> pa.Table:
        body = b"\n".join(line_of[i] for i in part)
        return _decode(body, schema, options, explain=len(part) == 1)

    parts, failed = split_failures(indices, decode, (BadInputError, _Locate))
    tables = [table for table, _ in parts]
    errors += [_record_error(index, line_of[index], exc) for index, exc in failed]
    errors.sort(key=lambda e: e.index)
    table = None
    if tables:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return LenientResult(table, errors)


def _split_records(
    data: bytes | Sequence[bytes],
) -> tuple[list[bytes], list[int], list[RecordError]]:
    errors: list[RecordError] = []
    if isinstance(data, bytes | bytearray | memoryview):
        lines: list[bytes] = []
        indices: list[int] = []
        for index, line in enumerate(bytes(data).split(b"\n")):
            if line.strip(_JSON_WS):
                lines.append(line)
                indices.append(index)
        return lines, indices, errors
    lines, indices = [], []
    for index, value in enumerate(data):
        raw = bytes(value)
        if not raw.strip(_JSON_WS):
            errors.append(RecordError(index, None, "empty value; expected a JSON object", raw))
            continue
        # A newline outside a JSON string is whitespace, and one inside is invalid JSON
        # either way: flattening keeps one record per line.
        if b"\n" in raw or b"\r" in raw:
            raw = raw.replace(b"\n", b" ").replace(b"\r", b" ")
        lines.append(raw)
        indices.append(index)
    return lines, indices, errors


def split_failures(
    indices: Sequence[int],
    attempt: Callable[[Sequence[int]], _T],
    catch: tuple[type[Exception], ...],
) -> tuple[list[tuple[_T, Sequence[int]]], list[tuple[int, Exception]]]:
    """``attempt`` on every index at once; where it raises ``catch``, on halves, until
    each failure stands alone. Returns the results with the indices each covers (in
    order) and the single indices that failed with their error.

    The one decode-then-bisect of the daemon (NDJSON bodies, Kafka JSON and Avro
    values): k bad records among n cost O(k log n) attempts, the good ones keep the
    vectorized path.
    """
    done: list[tuple[_T, Sequence[int]]] = []
    failed: list[tuple[int, Exception]] = []
    pending = [indices] if len(indices) else []
    while pending:
        part = pending.pop()
        try:
            done.append((attempt(part), part))
            continue
        except catch as exc:
            if len(part) == 1:
                failed.append((part[0], exc))
                continue
        middle = len(part) // 2
        pending += [part[middle:], part[:middle]]  # the first half is tried first
    done.sort(key=lambda item: item[1][0])
    return done, failed


_LINE_REF: Final = re.compile(r" \((?:line|row) \d+\)|^line \d+: ")


def _record_error(index: int, raw: bytes, exc: Exception) -> RecordError:
    reason = getattr(exc, "reason", "invalid")
    if isinstance(exc, _Locate):
        return RecordError(index, exc.column, _LINE_REF.sub("", exc.message), raw, reason)
    if isinstance(exc, SchemaError):
        return RecordError(index, exc.column, _LINE_REF.sub("", exc.problem), raw, reason)
    return RecordError(index, None, _LINE_REF.sub("", str(exc)), raw, reason)


class _Locate(Exception):
    """A nested value failed conversion; the record must be found by bisection."""

    def __init__(self, column: str, message: str, reason: str = "invalid") -> None:
        self.column = column
        self.message = message
        self.reason = reason
        super().__init__(column, message)


def infer_ndjson_schema(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> pa.Schema:
    """The Arrow schema pyarrow infers for an NDJSON body (for schema evolution).

    Same guards as `decode_ndjson` (nesting depth; pyarrow must not see a top-level
    null); raises `BadInputError` when the body is not one JSON object per line, and
    `SchemaChangeError` naming the field, both JSON types and their lines when two
    records give a field types no column holds both of (`icespool.json_types`).
    """
    try:
        return _inferred(body, max_depth)
    except BadInputError as exc:
        if _KIND_MIX in str(exc):
            conflict = first_conflict(body.split(b"\n"))
            if conflict is not None:
                raise SchemaChangeError(conflict.path, conflict.problem()) from None
        raise


# pyarrow.json's words for a field whose JSON kind differs between records.
_KIND_MIX: Final = ") changed from "


def _inferred(body: bytes, max_depth: int) -> pa.Schema:
    if _BLANK.fullmatch(body):
        raise BadInputError("no records: the body is empty; send one JSON object per line")
    check_depth(body, max_depth)
    if not _STARTS_WITH_OBJECT.match(body) or _SUSPICIOUS.search(body):
        _check_one_object_per_line(body)
    try:
        schema: pa.Schema = _read_json(body, pj.ParseOptions(newlines_in_values=False)).schema
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise BadInputError(f"the records' types cannot be inferred: {exc}") from exc
    return schema


def infer_records_schema(
    values: Sequence[bytes], columns: Collection[str] | None, max_depth: int
) -> pa.Schema:
    """The inferred types of ``columns`` (None: all) in these JSON records (blocking).

    One inference over all of them first; when that fails (some record is bad in
    another way, or records disagree on a field's type) record by record, merged by
    `merge_inferred`: long and double make double, and where no type holds both, the
    type seen first stays (the records that do not fit it are refused on their own).
    """
    try:
        return _inferred(b"\n".join(values), max_depth)
    except BadInputError:
        pass
    found: dict[str, pa.DataType] = {}
    # A nested column ("payload.kind") is inferred as its top-level one.
    wanted = None if columns is None else {c.split(".", 1)[0] for c in columns}
    for value in values:
        try:
            schema = _inferred(value, max_depth)
        except BadInputError:
            continue
        for inferred in schema:
            if wanted is not None and inferred.name not in wanted:
                continue
            seen = found.setdefault(inferred.name, inferred.type)
            found[inferred.name] = merge_inferred(seen, inferred.type)
    return pa.schema(list(found.items()))


def check_depth(body: bytes, max_depth: int) -> None:
    """Refuse a body with a line nested deeper than ``max_depth`` (`BadInputError`,
    reason ``too_deep``, naming the first such line). Runs before any parser: both
    Python's json and pyarrow.json recurse per level, and pyarrow overflows the C
    stack on deep enough input."""
    deep = too_deep_lines(body, max_depth)
    if deep:
        raise BadInputError(f"line {deep[0] + 1}: {too_deep(max_depth)}").because("too_deep")


# pyarrow.json would crash on a decimal's text with a huge exponent (see
# value_ranges.HUGE_EXPONENT), so a body with a decimal column is checked for them
# before pyarrow sees it: a C-speed search, and on a hit (also inside other text)
# an exact look at the values of the lines that have one.
_HUGE_EXPONENT: Final = re.compile(rb"[0-9.]" + HUGE_EXPONENT.encode())
_HUGE_EXPONENT_RE2: Final = _HUGE_EXPONENT.pattern.decode()
_HUGE_NUMBER: Final = re.compile(
    r"[ \t\r\n]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)" + HUGE_EXPONENT + r"[0-9]*[ \t\r\n]*"
)


class _Huge(Exception):
    pass


def _check_exponents(body: bytes, schema: pa.Schema) -> None:
    # The schema first: a search over the body costs ~20 ms per MB in Python's re,
    # holding the GIL, which every other request's decode then waits for.
    if not _has_decimal(schema) or not _has_huge_exponent(body):
        return
    for number, line in enumerate(body.split(b"\n"), 1):
        if not _HUGE_EXPONENT.search(line):
            continue
        _parse_line(number, line)  # invalid JSON is refused as such
        try:
            values = [json.loads(line, parse_float=_refuse_huge)]
            while values:  # depth is bounded already, but no recursion is needed
                value = values.pop()
                if isinstance(value, str):
                    _refuse_huge(value)
                elif isinstance(value, dict):
                    values.extend(value.values())
                elif isinstance(value, list):
                    values.extend(value)
        except _Huge as exc:
            raise BadInputError(
                f"line {number}: the value {_show(_Raw(str(exc)))} has an exponent of 5 or "
                "more digits, which no numeric column can hold"
            ).because("out_of_range") from None


def _has_huge_exponent(body: bytes) -> bool:
    """`_HUGE_EXPONENT` anywhere in ``body``, searched by Arrow's RE2 (linear time,
    ~3x Python's re here, and without the GIL) over the body's bytes, not copied."""
    data = pa.py_buffer(body)
    offsets = pa.array([0, len(body)], pa.int64()).buffers()[1]
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data])
    found = pc.match_substring_regex(whole, _HUGE_EXPONENT_RE2)[0]
    return bool(found.as_py())


def _refuse_huge(text: str) -> float:
    if _HUGE_NUMBER.fullmatch(text):
        raise _Huge(text)
    return 0.0  # only ever called for float texts and strings; the value is unused


@functools.lru_cache(maxsize=64)
def _has_decimal(schema: pa.Schema) -> bool:
    types = [field.type for field in schema]
    while types:
        t = types.pop()
        if pa.types.is_decimal(t):
            return True
        if pa.types.is_map(t):
            types += (t.key_type, t.item_type)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            types.append(t.value_type)
        elif pa.types.is_struct(t):
            types.extend(field.type for field in t.fields)
    return False


def _decode(body: bytes, schema: pa.Schema, options: JsonOptions, *, explain: bool) -> pa.Table:
    if _BLANK.fullmatch(body):
        raise BadInputError("no records: the body is empty; send one JSON object per line")
    check_depth(body, options.max_depth)
    _check_exponents(body, schema)
    if not _STARTS_WITH_OBJECT.match(body) or _SUSPICIOUS.search(body):
        _check_one_object_per_line(body)
    key = (schema, options)
    numbers = _PREFERRED.get(key)
    plan = _plan(schema, options, numbers)
    tried = {plan.numbers}
    while True:
        try:
            raw = _read(body, plan, options.ignore_unknown)
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            # A timestamp column that takes epoch numbers and ISO text is parsed as
            # one of the two; pyarrow names the column whose JSON kind did not match.
            flipped = _flip(plan, str(exc))
            if flipped is None or flipped in tried:
                if not explain:
                    raise BadInputError(_first_line(str(exc))) from exc
                raise _explain(body, plan, exc, options.ignore_unknown) from exc
            tried.add(flipped)
            plan = _plan(schema, options, flipped)
    if len(_PREFERRED) < 256:
        _PREFERRED[key] = plan.numbers
    if raw.num_rows != _count_lines(body) and raw.num_rows != _count_nonblank_lines(body):
        # pyarrow also reads an object spread over several lines; NDJSON does not
        # allow that, and error messages could no longer name the right line.
        _check_one_object_per_line(body)
    return _finish(raw, plan, schema, body)


def _read(body: bytes, plan: _Plan, ignore_unknown: bool = False) -> pa.Table:
    return _read_json(
        body,
        pj.ParseOptions(
            explicit_schema=plan.parse_schema,
            unexpected_field_behavior="ignore" if ignore_unknown else "error",
            newlines_in_values=False,
        ),
    )


def _read_json(body: bytes, parse_options: pj.ParseOptions) -> pa.Table:
    """``pyarrow.json.read_json`` in blocks, or in one block when a record is too long
    for blocks."""
    try:
        # Blocks split at newlines (newlines_in_values=False), so records never
        # straddle them; parsing blocks on pyarrow's CPU pool halves the latency
        # of a 1.6 MB body (8 -> 4.5 ms on 2 cores), and that pool is sized to
        # the cores, so concurrent requests cannot oversubscribe them.
        options = pj.ReadOptions(block_size=_BLOCK, use_threads=len(body) > _BLOCK)
        return pj.read_json(pa.BufferReader(body), options, parse_options)
    except pa.ArrowInvalid as exc:
        if _STRADDLING not in str(exc):
            raise
    # pyarrow cannot read a record longer than about two blocks ("straddling object
    # straddles two block boundaries"): a valid 600 KB record was refused, and a
    # Kafka value of that size dead-lettered. One block holds any record.
    options = pj.ReadOptions(block_size=min(len(body) + 1, _MAX_BLOCK), use_threads=False)
    return pj.read_json(pa.BufferReader(body), options, parse_options)


_KIND_CHANGE: Final = re.compile(r"Column\((?P<path>[^)]*)\) changed from (?:number|string) to")
# Which dual (epoch or text) timestamp paths were parsed as numbers last time, per
# (schema, options): a stream keeps its spelling, so the next body parses first time.
_PREFERRED: dict[tuple[pa.Schema, JsonOptions], frozenset[str]] = {}


def _flip(plan: _Plan, message: str) -> frozenset[str] | None:
    match = _KIND_CHANGE.search(message)
    if match is None or match.group("path") not in plan.duals:
        return None
    return plan.numbers ^ {match.group("path")}


def decode_arrow_stream(body: bytes) -> pa.Table:
    """Read an Arrow IPC stream as it is; `icespool.ingest` conforms it to the table
    (evolving the table where its policy allows) and names a failing column."""
    if not body:
        raise BadInputError("no records: the body is empty; send an Arrow IPC stream")
    source = pa.BufferReader(body)
    try:
        with ipc.open_stream(source) as reader:
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
    if source.tell() < len(body):
        # The reader stops at the end-of-stream marker: a second stream appended
        # to the first (or junk) would be dropped while the client counts it sent.
        raise BadInputError(
            f"{len(body) - source.tell()} bytes follow the end of the Arrow stream (two "
            "streams in one body?); send one stream per request"
        )
    if table.num_rows == 0:
        raise BadInputError("no records: the Arrow stream holds no rows")
    for name, values in zip(table.column_names, table.columns, strict=True):
        found = find_out_of_range(values)
        if found is not None:
            where = f" (row {found.row + 1})" if found.row >= 0 else ""
            raise SchemaError(found.column(name), f"{found.problem}{where}").because("out_of_range")
    return table


# ------------------------------------------------------------------ the decode plan


@functools.lru_cache(maxsize=64)
def _plan(schema: pa.Schema, options: JsonOptions, numbers: frozenset[str] | None) -> _Plan:
    duals: set[str] = set()
    columns = tuple(
        _column(field, options.unit_for(field.name), numbers, duals) for field in schema
    )
    parse_schema = pa.schema([pa.field(c.name, c.parse_type) for c in columns])
    chosen = frozenset(duals) if numbers is None else numbers & frozenset(duals)
    if numbers is None and duals:
        # First sight: a unit was configured, so numbers are the likely spelling.
        return _plan(schema, options, chosen)
    return _Plan(columns, parse_schema, {c.name: c for c in columns}, frozenset(duals), chosen)


def _column(
    field: pa.Field, unit: str | None, numbers: frozenset[str] | None, duals: set[str]
) -> _Column:
    node = _node(field.type, f"/{field.name}", unit, numbers, duals)
    return _Column(
        field.name,
        field.type,
        node.parse_type,
        node.convert,
        not field.nullable,
        node.expected,
        pa.types.is_nested(field.type),
    )


@dataclass(frozen=True, slots=True)
class _Node:
    parse_type: pa.DataType
    convert: Converter | None
    expected: str


def _node(
    t: pa.DataType,
    path: str,
    unit: str | None,
    numbers: frozenset[str] | None,
    duals: set[str],
    dotted: str = "",
) -> _Node:
    """How pyarrow.json reads one (possibly nested) type and converts it to ``t``.

    ``path`` is pyarrow's spelling of the JSON location (``/col/field/[]``), which its
    kind-mismatch errors quote; ``dotted`` is the Iceberg column path for messages.
    """
    dotted = dotted or path.strip("/")
    if pa.types.is_struct(t):
        children = [
            _node(f.type, f"{path}/{f.name}", unit, numbers, duals, f"{dotted}.{f.name}")
            for f in t.fields
        ]
        parse = pa.struct(
            [pa.field(f.name, c.parse_type) for f, c in zip(t.fields, children, strict=True)]
        )
        convert = None
        if any(c.convert is not None for c in children):
            convert = _struct_converter(t, [c.convert for c in children])
        return _Node(parse, convert, f"a JSON object {_render(t)}")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _node(t.value_type, f"{path}/[]", unit, numbers, duals, f"{dotted}.element")
        convert = None if element.convert is None else _list_converter(t, element.convert)
        return _Node(pa.list_(element.parse_type), convert, f"a JSON array {_render(t)}")
    if pa.types.is_map(t):
        key = _node(t.key_type, f"{path}/[]/key", unit, numbers, duals, f"{dotted}.key")
        item = _node(t.item_type, f"{path}/[]/value", unit, numbers, duals, f"{dotted}.value")
        parse = pa.list_(pa.struct([("key", key.parse_type), ("value", item.parse_type)]))
        return _Node(
            parse,
            _map_converter(dotted, key.convert, item.convert),
            f'a JSON array of {{"key": ..., "value": ...}} objects {_render(t)}',
        )
    leaf = _leaf(t)
    if pa.types.is_timestamp(t) and unit is not None:
        duals.add(path)
        if numbers is None or path in numbers:
            leaf = _Node(
                pa.int64(),
                _epoch(t, unit),
                f"an integer epoch in {unit} or an ISO-8601 timestamp string",
            )
    if path.count("/") > 1 and leaf.convert is not None:
        leaf = _Node(leaf.parse_type, _inner(dotted, leaf), leaf.expected)
    return leaf


def _inner(column: str, leaf: _Node) -> Converter:
    assert leaf.convert is not None
    convert = leaf.convert

    def run(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return convert(values)
        except _RowError as exc:
            raise _RowError(
                -1, exc.value, f"expected {leaf.expected}, got {_show(exc.value)}", column
            ) from None

    return run


def _render(t: pa.DataType) -> str:
    return f"({t})"


def _leaf(t: pa.DataType) -> _Node:
    def col(parse: pa.DataType, convert: Converter | None, expected: str) -> _Node:
        return _Node(parse, convert, expected)

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
        # pyarrow.json converts the number's own text (or the string), never via a
        # double, so 0.1 and 38-digit values stay exact.
        return col(
            t,
            _decimal_range(t),
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


def _combined(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _struct_converter(t: pa.StructType, converts: list[Converter | None]) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        children = []
        for index, child_convert in enumerate(converts):
            child = array.field(index)
            children.append(_combined(child_convert(child)) if child_convert else child)
        names = [f.name for f in t.fields]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, names=names, mask=mask)

    return _nested(convert)


def _list_converter(t: pa.DataType, element: Converter) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        mask = array.is_null() if array.null_count else None
        return pa.ListArray.from_arrays(array.offsets, _combined(element(array.values)), mask=mask)

    return _nested(convert)


def _map_converter(path: str, key: Converter | None, item: Converter | None) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        entries = array.values
        keys = entries.field(0)
        if keys.null_count:
            raise _RowError(-1, None, "a map key is missing or null", f"{path}.key")
        keys = _combined(key(keys)) if key else keys
        items = entries.field(1)
        items = _combined(item(items)) if item else items
        mask = array.is_null() if array.null_count else None
        return pa.MapArray.from_arrays(array.offsets, keys, items, mask=mask)

    return _nested(convert)


def _nested(convert: Callable[[pa.Array | pa.ChunkedArray], pa.Array]) -> Converter:
    # Rows of a nested value's children are not records: a failure inside is
    # reported with row -1, and the caller finds the record by bisection.
    def run(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return convert(values)
        except _RowError as exc:
            raise _RowError(-1, exc.value, exc.problem, exc.column) from None

    return run


def _decimal_range(t: pa.Decimal128Type) -> Converter:
    # pyarrow 26 checks the precision of the text as written, then rescales: 1234.5
    # passes as decimal(5,2) and becomes 1234.50, six digits. Check the magnitude,
    # at every precision: "1e28" into decimal(38,10) becomes 10^38 unscaled, 39
    # digits, which decimal128 still holds (up to ~1.7e38) but the column cannot.
    # decimal256 holds every such value and the limit 10^(P-S) itself.
    wide = pa.decimal256(76, t.scale)
    limit = pa.scalar(decimal.Decimal(10) ** (t.precision - t.scale), wide)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        too_big = pc.greater_equal(pc.abs(pc.cast(values, wide)), limit)
        if pc.any(too_big).as_py():
            row = pc.index(too_big, True).as_py()
            raise _RowError(row, _Raw(values[row].as_py()))
        return values

    return convert


def _epoch(target: pa.TimestampType, unit: str) -> Converter:
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
    source, wanted = per_second[unit], per_second[target.unit]

    def to_stamp(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        if wanted >= source:
            scaled = pc.multiply_checked(values, wanted // source)
        else:
            divisor = source // wanted
            scaled = pc.divide(values, divisor)
            exact = pc.all(pc.equal(pc.multiply(scaled, divisor), values)).as_py()
            if exact is False:
                raise pa.ArrowInvalid(
                    f"the column stores {target.unit}; finer digits would be lost"
                )
        return pc.cast(scaled, target)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return to_stamp(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: to_stamp(pa.array([v], pa.int64()))) from exc

    return convert


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
        elif column.nested and _has_string(column.parse_type):
            _check_nested_utf8(column.name, values)
        if column.convert is not None:
            try:
                values = column.convert(raw.column(index))
            except _RowError as exc:
                if exc.row < 0:
                    raise _Locate(
                        exc.column or column.name,
                        exc.problem or f"expected {column.expected}, got {_show(exc.value)}",
                    ) from None
                where = _line_of_row(body, exc.row)
                raise SchemaError(
                    column.name,
                    exc.problem or f"expected {column.expected}, got {_show(exc.value)}{where}",
                ) from None
        if column.required and values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise SchemaError(
                column.name, f"required column is missing or null{_line_of_row(body, row)}"
            )
        if column.nested:
            values = _conform_nested(column, values)
        _check_range(column.name, values, body)
        columns.append(values)
    return pa.Table.from_arrays(columns, schema=schema)


def _check_range(name: str, values: pa.Array | pa.ChunkedArray, body: bytes) -> None:
    found = find_out_of_range(values)
    if found is None:
        return
    if found.row < 0:  # inside a list or map: the record is found by bisection
        raise _Locate(found.column(name), found.problem, "out_of_range")
    raise SchemaError(
        found.column(name), f"{found.problem}{_line_of_row(body, found.row)}"
    ).because("out_of_range")


def _has_string(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(_has_string(f.type) for f in t.fields)
    if pa.types.is_list(t):
        return _has_string(t.value_type)
    return bool(pa.types.is_string(t))


def _check_nested_utf8(name: str, values: pa.ChunkedArray) -> None:
    # Strings inside lists, structs and maps (keys and values) come from the same
    # byte copy. Only the string leaves are validated: full validation of the whole
    # value would also judge other things (decimal digits) that get their own error.
    # The record is found by bisection (only on this failure path).
    for leaf in _string_leaves(_combined(values)):
        try:
            leaf.validate(full=True)
        except pa.ArrowInvalid:
            raise _Locate(
                name, "a string inside the value is not valid UTF-8", "bad_utf8"
            ) from None


def _string_leaves(array: pa.Array) -> Iterator[pa.Array]:
    """The string arrays nested in ``array`` (a parse type: structs and lists)."""
    if pa.types.is_struct(array.type):
        for child in array.flatten():
            yield from _string_leaves(child)
    elif pa.types.is_list(array.type):
        yield from _string_leaves(array.flatten())
    elif pa.types.is_string(array.type):
        yield array


def _conform_nested(column: _Column, values: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = _combined(values)
    try:
        # Required nested fields are checked here so that a bad record is a record
        # error (the writer's conform would only fail the whole batch).
        check_required_children(column.name, array, column.target)
        # Child names (list "element", map "entries") and nullability as the table has them.
        return cast_array(array, column.target)
    except SchemaError as exc:
        raise _Locate(exc.column, exc.problem) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise _Locate(column.name, _first_line(str(exc))) from None


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
                ).because("bad_utf8") from None
        raise SchemaError(name, "a value is not valid UTF-8").because("bad_utf8") from None


def _count_lines(body: bytes) -> int:
    """Lines if none is blank (the usual body): one C-speed count."""
    return body.count(b"\n") + (not body.endswith(b"\n"))


def _count_nonblank_lines(body: bytes) -> int:
    # Segments between newlines, minus the whitespace-only ones (this includes the
    # empty segment after a final newline).
    return body.count(b"\n") + 1 - len(_BLANK_LINE.findall(body))


def count_ndjson_records(body: bytes) -> int:
    """The records of an NDJSON body as the decoder counts them: its non-blank lines
    (whether or not they are valid JSON). Blocking on large bodies (one regex scan)."""
    return _count_nonblank_lines(body)


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
        raise BadInputError(f"line {number}: not UTF-8 ({exc.reason})").because(
            "bad_utf8"
        ) from None
    except json.JSONDecodeError as exc:
        raise BadInputError(
            # json says "Invalid control character at": no "at at".
            f"line {number}: invalid JSON ({exc.msg.removesuffix(' at')} at character "
            f"{exc.colno}); send one JSON object per line, without line breaks inside a record"
        ) from None
    if not isinstance(value, dict):
        raise BadInputError(f"line {number}: expected a JSON object, got {_kind(value)}")
    return value


def _explain(
    body: bytes, plan: _Plan, exc: Exception, ignore_unknown: bool = False
) -> BadInputError:
    number = _first_bad_line(body, plan, ignore_unknown)
    if number is None:
        return BadInputError(f"the body is not valid NDJSON: {_first_line(str(exc))}")
    line = body.split(b"\n")[number - 1]
    try:
        record = _parse_line(number, line)
    except BadInputError as problem:
        return problem
    unknown = [key for key in record if key not in plan.by_name]
    if unknown and not ignore_unknown:
        return SchemaError(
            unknown[0],
            f"not in the table schema (line {number}); the columns are {_names(plan)}",
        )
    # A token pyarrow cannot read at all (a number beyond a double, a lone surrogate
    # escape) fails every column; blaming the first one would mislead.
    whole = _parse_error(line, None)
    if whole is not None:
        return BadInputError(f"line {number}: {whole}")
    for key, value in record.items():
        if key not in plan.by_name:
            continue  # ignore_unknown: skipped by the parser too
        column = plan.by_name[key]
        reason = _parse_error(line, column)
        if reason is not None:
            if column.nested:
                # The column's own description would be a whole type; pyarrow's reason
                # names the value that failed.
                return SchemaError(key, f"{reason} (line {number})")
            return SchemaError(
                key, f"expected {column.expected}, got {_show(value)} (line {number})"
            )
    return BadInputError(f"line {number}: {_first_line(str(exc))}")


def _first_bad_line(body: bytes, plan: _Plan, ignore_unknown: bool = False) -> int | None:
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
                    unexpected_field_behavior="ignore" if ignore_unknown else "error",
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


def _parse_error(line: bytes, column: _Column | None) -> str | None:
    """Why pyarrow cannot read this one column of one (valid JSON) line (None: it can;
    ``column`` None: why it cannot read the line whatever the columns)."""
    fields = [] if column is None else [pa.field(column.name, column.parse_type)]
    try:
        pj.read_json(
            pa.BufferReader(line),
            parse_options=pj.ParseOptions(
                explicit_schema=pa.schema(fields),
                unexpected_field_behavior="ignore",
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        return _first_line(str(exc)).removeprefix("JSON parse error: ")
    return None


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
    if isinstance(value, dict):
        return "an object"
    return "an array"


class _Raw(str):
    """A value shown as it is (a decimal's digits), not as a JSON string."""


def _show(value: object) -> str:
    text = str(value) if isinstance(value, _Raw) else json.dumps(value, ensure_ascii=True)
    if len(text) > _SHOWN_VALUE_CHARS:
        text = text[: _SHOWN_VALUE_CHARS - 3] + "..."
    return text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
