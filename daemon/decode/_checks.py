"""What runs around pyarrow's parse: the guards a body passes before it (nesting
depth, huge exponents) and, after it, the conversion of each column with the checks
pyarrow does not make (UTF-8, required values, ranges)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._convert import _combined, _Raw, _RowError, _show
from icespool.decode._locate import _first_line, _line_of_row, _Locate, _parse_line
from icespool.decode._nesting import too_deep, too_deep_lines
from icespool.decode._plan import _Column, _Plan
from icespool.errors import BadInputError, SchemaError
from icespool.schema import HUGE_EXPONENT, cast_array, check_required_children, find_out_of_range


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
