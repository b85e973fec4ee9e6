"""Value-level checks before any parser sees a value, and the one newline-joined body.

Every check is whole-array: lengths by a pyarrow kernel, whitespace-only values by one
regex scan of the joined values, nesting depth by `too_deep_lines` over them (C passes
and numpy). A JSON decoder then reads the joined values (`joined`) in one
``pyarrow.json`` call: `joined` is the one place values become that body, so values
that already sit newline-separated in one buffer can reach the reader as they are.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._decoded import DeadRecord
from icespool.decode._nesting import too_deep, too_deep_lines
from icespool.decode._records import Binary

__all__ = [
    "EMPTY",
    "blank_lines",
    "drop",
    "joined",
    "oversized",
    "screen",
    "screened_values",
    "too_deep_values",
]

#: What a record without a value is told.
EMPTY = "the record has no value (tombstone or empty)"


def oversized(index: int, size: int, max_bytes: int) -> DeadRecord:
    """The dead record of a value of ``size`` bytes, past ``max_bytes``."""
    return DeadRecord(
        index, "oversized", f"value of {size} bytes exceeds max_record_bytes ({max_bytes})"
    )


def joined(values: Binary) -> bytes:
    """The values joined with newlines (a null as an empty line), one record per
    line: a raw newline or CR inside a value can only be JSON whitespace (strings
    escape them), so they are blanked there without changing any value. Whole-array
    work: one pyarrow kernel, C-speed byte counts; the blanking only when needed."""
    if not len(values):
        return b""
    body = _newline_joined(values)
    if body.count(b"\n") != len(values) - 1 or b"\r" in body:
        body = _newline_joined(_blanked(values))
    return body


def _newline_joined(values: Binary) -> bytes:
    lines = pc.binary_join_element_wise(
        values,
        pa.scalar(b"", values.type),
        pa.scalar(b"\n", values.type),
        null_handling="replace",
        null_replacement="",
    )
    data = lines.buffers()[2]
    # Every line ends with its newline: the last one is not part of the body.
    return data.to_pybytes()[:-1] if data is not None else b""


def _blanked(values: Binary) -> Binary:
    """``values`` with every raw newline and CR turned into a space (same offsets)."""
    validity, offsets, data = values.buffers()
    if data is None:
        return values
    spaced = data.to_pybytes().replace(b"\n", b" ").replace(b"\r", b" ")
    array: Binary = pa.Array.from_buffers(
        values.type, len(values), [validity, offsets, pa.py_buffer(spaced)], offset=values.offset
    )
    return array


def screen(values: Binary, max_bytes: int) -> tuple[npt.NDArray[np.int64], list[DeadRecord]]:
    """The positions of the values a decoder may see, and the dead records of the
    others: ``empty`` (null, zero bytes, or only whitespace) and ``oversized`` (more
    than ``max_bytes``). Lengths are one pyarrow kernel; whitespace-only values are
    found on the joined values by one regex scan (`blank_lines`)."""
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy().astype(np.int64, copy=False)
    empty = lengths == 0
    over = lengths > max_bytes
    dead = [DeadRecord(int(i), "empty", EMPTY) for i in np.flatnonzero(empty)]
    for i in np.flatnonzero(over).tolist():
        value = values[i].as_py()
        if value.isspace():  # as before: a value of only whitespace is empty, whatever its size
            dead.append(DeadRecord(i, "empty", EMPTY))
        else:
            dead.append(oversized(i, len(value), max_bytes))
    good = np.flatnonzero(~(empty | over)).astype(np.int64)
    return good, dead


# A line of only whitespace (JSON's, and the \v \f that str.isspace also counts):
# the first line, and any line after a newline (a pattern that starts with a literal
# newline is scanned at memchr speed; one with a lookbehind is tried at every byte).
_BLANK_FIRST = re.compile(rb"[ \t\r\x0b\x0c]*(?:\n|\Z)")
_BLANK_AFTER = re.compile(rb"\n[ \t\r\x0b\x0c]*(?=\n|\Z)")
_NL = 10


def blank_lines(body: bytes) -> npt.NDArray[np.int64]:
    """0-based indices of the lines of ``body`` that hold only whitespace: one regex
    scan; line numbers only when there is a match (one search per match)."""
    first = [0] if _BLANK_FIRST.match(body) else []
    after = [m.start() for m in _BLANK_AFTER.finditer(body)]
    if not after:
        return np.asarray(first, np.int64)
    breaks = np.flatnonzero(np.frombuffer(body, np.uint8) == _NL)
    lines = np.searchsorted(breaks, np.asarray(after, np.int64)) + 1
    return np.concatenate((np.asarray(first, np.int64), lines.astype(np.int64)))


def _pick(values: Binary, rows: npt.NDArray[np.int64]) -> Binary:
    return values if len(rows) == len(values) else values.take(pa.array(rows, pa.int64()))


def drop(
    good: npt.NDArray[np.int64], lines: npt.NDArray[np.int64] | list[int]
) -> npt.NDArray[np.int64]:
    """``good`` without its entries at ``lines`` (positions in ``good``)."""
    keep = np.ones(len(good), dtype=bool)
    keep[np.asarray(lines, dtype=np.int64)] = False
    return good[keep]


def screened_values(
    values: Binary, max_bytes: int, max_depth: int
) -> tuple[bytes, npt.NDArray[np.int64], list[DeadRecord]]:
    """What a JSON decoder may see of ``values``: their newline-joined body (one
    line per value, see `joined`), the positions of the values it holds, and the
    dead records of the others (``empty``, ``oversized``, ``too_deep``; unsorted).
    The body is joined again only when a guard removed lines."""
    good, dead = screen(values, max_bytes)
    body = joined(_pick(values, good))
    blank = blank_lines(body) if len(good) else np.empty(0, np.int64)
    if len(blank):
        dead.extend(DeadRecord(int(good[k]), "empty", EMPTY) for k in blank.tolist())
        good = drop(good, blank)
        body = joined(_pick(values, good))
    deep = too_deep_lines(body, max_depth) if len(good) else []
    if deep:
        # Found here, once, rather than by bisecting down to them.
        dead.extend(DeadRecord(int(good[k]), "too_deep", too_deep(max_depth)) for k in deep)
        good = drop(good, deep)
        body = joined(_pick(values, good))
    return body, good, dead


def too_deep_values(values: Binary, max_depth: int) -> dict[int, str]:
    """Which ``values`` nest deeper than ``max_depth``, with the error each gets (one
    linear scan of the joined values; see `icespool.decode._nesting`)."""
    if not len(values):
        return {}
    lines = too_deep_lines(joined(values), max_depth)
    return dict.fromkeys(lines, too_deep(max_depth))
