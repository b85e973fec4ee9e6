"""Locating failures: which line (body), index (sequence of values) and column a bad
record is at, by the one decode-then-bisect (`split_failures`), by bisecting a body's
line prefixes with pyarrow (`_first_bad_line`) and by reading one line in Python."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pyarrow as pa
import pyarrow.json as pj

from icespool.decode._convert import _show
from icespool.decode._json_types import json_kind
from icespool.decode._plan import _Column, _Plan
from icespool.errors import BadInputError, SchemaError

_JSON_WS: Final = b" \t\r\n"
_BLANK: Final = re.compile(rb"[ \t\r\n]*")
_BLANK_LINE: Final = re.compile(rb"(?:^|\n)[ \t\r]*(?=\n|\Z)")
_SHOWN_COLUMNS: Final = 20

_T = TypeVar("_T")


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
        raise BadInputError(f"line {number}: expected a JSON object, got {json_kind(value)}")
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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
