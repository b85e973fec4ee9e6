"""Temporal values a table can really hold, checked on whole arrays at decode.

Arrow stores any int64 as a timestamp, but pyiceberg turns the Parquet statistics
of every data file into Python ``datetime``/``date``/``time`` objects, and Spark reads
dates and timestamps from 0001-01-01 to 9999-12-31. A value outside that range
would be acked, then fail every flush (OverflowError) and every restart. So the
bounds are Python's, which are also Spark's:

- timestamps (any unit, with or without zone): 0001-01-01T00:00:00 to
  9999-12-31T23:59:59.999999 (nanosecond columns are narrower anyway: int64 ns
  covers 1677-09-21 to 2262-04-11);
- dates: 0001-01-01 to 9999-12-31;
- times of day: 00:00:00 to 23:59:59.999999 (below 24 hours, not negative).

Decimals need no range check here: every decoder casts them to the column's
precision with Arrow's checked casts, and ``validate(full=True)`` refuses digits
beyond a decimal type's own precision. Their *text* needs one guard, though
(`HUGE_EXPONENT`): pyarrow 26 uses a decimal's exponent as a table index without a
bound, so "1e-5000000" (pyarrow.json, or a string cast to decimal) reads far out of
bounds and kills the process with SIGSEGV. No value of any numeric column needs a
5-digit exponent (decimal(38) never; a double's is at most 308).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "HUGE_EXPONENT",
    "OutOfRange",
    "find_out_of_range",
    "has_huge_exponent",
    "temporal_bounds",
]

#: An exponent of 5 or more digits (see the module's doc).
HUGE_EXPONENT: Final = r"[eE][+-]?0*[1-9][0-9]{4}"

_PER_SECOND: Final = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_EPOCH: Final = datetime.datetime(1970, 1, 1)
_FIRST_SECOND: Final = int((datetime.datetime.min - _EPOCH).total_seconds())
_LAST_SECOND: Final = int((datetime.datetime.max.replace(microsecond=0) - _EPOCH).total_seconds())
_FIRST_DAY: Final = (datetime.date.min - _EPOCH.date()).days
_LAST_DAY: Final = (datetime.date.max - _EPOCH.date()).days
_DAY_SECONDS: Final = 86_400
_INT64: Final = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """The first value out of range: its path below the column (``""``: the column
    itself), its row in the array it was found in (only meaningful at the top
    level), and what the column can hold."""

    path: str
    row: int
    problem: str

    def column(self, name: str) -> str:
        """The dotted path of the value in column ``name``."""
        return f"{name}.{self.path}" if self.path else name


def temporal_bounds(t: pa.DataType) -> tuple[int, int, str] | None:
    """Storage-integer bounds of a temporal type, and how to say them."""
    if pa.types.is_timestamp(t):
        per = _PER_SECOND[t.unit]
        low = max(_FIRST_SECOND * per, _INT64[0])
        high = min(_LAST_SECOND * per + per - 1, _INT64[1])
        return low, high, "a timestamp from 0001-01-01T00:00:00 to 9999-12-31T23:59:59.999999"
    if pa.types.is_date32(t):
        return _FIRST_DAY, _LAST_DAY, "a date from 0001-01-01 to 9999-12-31"
    if pa.types.is_date64(t):
        return (
            _FIRST_DAY * _DAY_SECONDS * 1000,
            _LAST_DAY * _DAY_SECONDS * 1000,
            "a date from 0001-01-01 to 9999-12-31",
        )
    if pa.types.is_time(t):
        last = _DAY_SECONDS * _PER_SECOND[t.unit] - 1
        return 0, last, "a time of day from 00:00:00 to 23:59:59.999999"
    return None


def _has_temporal(t: pa.DataType) -> bool:
    if isinstance(t, pa.BaseExtensionType):
        return False
    if pa.types.is_struct(t):
        return any(_has_temporal(f.type) for f in t.fields)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_temporal(t.value_type)
    if pa.types.is_map(t):
        return _has_temporal(t.key_type) or _has_temporal(t.item_type)
    return temporal_bounds(t) is not None


def find_out_of_range(values: pa.Array | pa.ChunkedArray) -> OutOfRange | None:
    """The first temporal value in ``values`` (at any depth) that no Iceberg table
    read through pyiceberg and Spark can hold; None when all fit. Vectorized:
    one min/max per temporal leaf."""
    if not _has_temporal(values.type):
        return None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return _find(values, "")


def _find(array: pa.Array, path: str) -> OutOfRange | None:
    t = array.type
    if pa.types.is_struct(t):
        # flatten(): children with the parents' nulls, so a value hidden behind a
        # null struct (possible in an Arrow body) is not judged.
        for field, child in zip(t.fields, array.flatten(), strict=True):
            if _has_temporal(field.type):
                found = _find(child, _join(path, field.name))
                if found is not None:
                    return found  # a struct's rows are its column's rows
        return None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _deeper(_find(array.flatten(), _join(path, "element")))
    if pa.types.is_map(t):
        entries = pa.ListArray.from_arrays(array.offsets, array.values).flatten()
        for index, name in enumerate(("key", "value")):
            found = _deeper(_find(entries.field(index), _join(path, name)))
            if found is not None:
                return found
        return None
    bounds = temporal_bounds(t)
    if bounds is None or not len(array) or array.null_count == len(array):
        return None
    low, high, what = bounds
    numbers = array.view(pa.int64() if t.bit_width == 64 else pa.int32())
    extremes = pc.min_max(numbers)
    if extremes["min"].as_py() >= low and extremes["max"].as_py() <= high:
        return None
    bad = pc.or_(pc.less(numbers, low), pc.greater(numbers, high))
    row = pc.index(bad, True).as_py()
    return OutOfRange(path, row, f"out of range: the column holds {what} ({t})")


def _deeper(found: OutOfRange | None) -> OutOfRange | None:
    # Rows of list elements and map entries are not rows of the column.
    return None if found is None else OutOfRange(found.path, -1, found.problem)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def has_huge_exponent(text: pa.Array) -> bool:
    """Whether any string of ``text`` (bound for a decimal column) holds an exponent
    pyarrow's decimal parser cannot take safely."""
    if pa.types.is_dictionary(text.type):
        text = text.dictionary
    if pa.types.is_string_view(text.type):
        text = text.cast(pa.large_string())  # no regex kernel for views
    return bool(pc.any(pc.match_substring_regex(text, HUGE_EXPONENT)).as_py())
