"""NDJSON bodies and JSON values -> tables: all or nothing (`decode_ndjson`), record by
record (`decode_ndjson_lenient`), and the inferred schema of records."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, NoReturn

import pyarrow as pa
import pyarrow.json as pj

from icespool.decode._checks import _check_exponents, _finish, check_depth
from icespool.decode._json_types import first_conflict, merge_inferred
from icespool.decode._locate import (
    _BLANK,
    _BLANK_LINE,
    _JSON_WS,
    RecordError,
    _check_one_object_per_line,
    _count_lines,
    _count_nonblank_lines,
    _explain,
    _first_line,
    _Locate,
    _record_error,
    split_failures,
)
from icespool.decode._nesting import DEFAULT_MAX_DEPTH
from icespool.decode._plan import _DEFAULT_OPTIONS, JsonOptions, _Plan, _plan
from icespool.errors import BadInputError, SchemaError
from icespool.schema import SchemaChangeError

_STARTS_WITH_OBJECT: Final = re.compile(rb"[ \t\r\n]*\{")
# pyarrow 26 segfaults when the first value of a block is a top-level `null`, and
# turns a later top-level `null` into an all-null row instead of an error. A
# top-level null can only follow a closing brace, and two objects on one line
# (which would break the row -> line mapping) also show `}` then `{`. A match
# (including a false one inside a string) only sends the body through a strict
# line-by-line check before pyarrow sees it.
_SUSPICIOUS: Final = re.compile(rb"}(?:[ \t\r]*\{|[ \t\r\n]*null)")
_BLOCK: Final = 256 << 10
_MAX_BLOCK: Final = 2**31 - 1  # pyarrow's block size is an int32
_STRADDLING: Final = "straddling object straddles two block boundaries"


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


def infer_ndjson_schema(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> pa.Schema:
    """The Arrow schema pyarrow infers for an NDJSON body (for schema evolution).

    Same guards as `decode_ndjson` (nesting depth; pyarrow must not see a top-level
    null); raises `BadInputError` when the body is not one JSON object per line, and
    `SchemaChangeError` naming the field, both JSON types and their lines when two
    records give a field types no column holds both of (`icespool.decode._json_types`).
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
