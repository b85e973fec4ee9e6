"""Route values read from a field of JSON values (a Kafka source's ``route_field``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from icespool.decode._records import Binary, binary_array
from icespool.decode._screen import joined, too_deep_values

__all__ = ["route_field_values"]

# A line (value) that does not start with "{": one C-speed scan of the joined body.
_NOT_AN_OBJECT = re.compile(rb"(?:\A|\n)[ \t\r]*(?:[^ \t\r\n{]|\n|\Z)")
_UNSAFE = re.compile(rb"}(?:[ \t\r]*\{|[ \t\r\n]*null)")


def route_field_values(
    values: Binary, field: str, max_depth: int
) -> tuple[list[str | None], dict[int, str]]:
    """The route value of every value's ``field`` (None: no usable value: not an
    object, no such field, not a string or integer, or nesting deeper than
    ``max_depth``), and the values nesting deeper with the error each gets (no parser
    may see them)."""
    deep = too_deep_values(values, max_depth)
    if deep:
        mask = np.zeros(len(values), dtype=bool)
        mask[list(deep)] = True
        values = binary_array(pc.if_else(pa.array(mask), pa.scalar(b"{}", values.type), values))
        routes = _routes(values, field)
        return [None if i in deep else r for i, r in enumerate(routes)], deep
    return _routes(values, field), deep


def _routes(values: Binary, field: str) -> list[str | None]:
    body = joined(values)
    # pyarrow 26 crashes on a top-level `null` starting a block (see icespool.decode):
    # only bodies of plain objects reach it.
    if not _UNSAFE.search(body) and not _NOT_AN_OBJECT.search(body):
        try:
            parsed = pj.read_json(
                pa.BufferReader(body),
                parse_options=pj.ParseOptions(
                    explicit_schema=pa.schema([(field, pa.string())]),
                    unexpected_field_behavior="ignore",
                    newlines_in_values=False,
                ),
            )
            if parsed.num_rows == len(values):
                routes: list[str | None] = parsed.column(field).to_pylist()
                return routes
        except pa.ArrowException:
            pass
    # Some value is not an object with a string route: find out record by record.
    return [_route_of(v or b"", field) for v in values.to_pylist()]


def _route_of(value: bytes, field: str) -> str | None:
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    route = record.get(field)
    if isinstance(route, str) and route:
        return route
    if isinstance(route, int) and not isinstance(route, bool):
        return str(route)
    return None
