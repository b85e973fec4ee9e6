"""How deep untrusted JSON nests, found without recursion, before any parser sees it.

Python's ``json`` recurses once per level (RecursionError past ~1,000) and
``pyarrow.json`` does too, in C: a value nested 20,000 deep overflows the C stack
and kills the process. So every body is measured here first, by byte scans that
cannot recurse:

- fast path (every ordinary body): a line cannot nest deeper than the number of
  brackets it holds; ``bytes.translate`` keeps only brackets and newlines, and one
  regex over that (small) remainder finds the lines with more than the limit;
- exact path (only the lines with more brackets than the limit, all at once):
  C passes first reduce them to brackets, unescaped quotes and newlines; then
  quotes toggle "inside a string", and the running depth is a cumulative sum of
  +1/-1 per bracket outside strings, reset at each line. Vectorized too: no
  per-line or per-byte Python, no regex that could backtrack.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_MAX_DEPTH", "depth", "too_deep", "too_deep_lines"]

#: Deep enough for any real record; far below what the parsers survive.
DEFAULT_MAX_DEPTH: Final = 64

_OPEN_CURLY, _OPEN_SQUARE, _CLOSE_CURLY, _CLOSE_SQUARE = b"{[}]"
_QUOTE: Final = ord('"')
_NEWLINE = 10
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b"[]{}\n")))
_NOT_STRUCTURE: Final = bytes(sorted(set(range(256)) - set(b'[]{}"\n')))


def too_deep(limit: int) -> str:
    """What a record nesting deeper than ``limit`` is told."""
    return (
        f"the JSON value nests deeper than {limit} levels (max_nesting_depth); "
        "flatten the record or raise the limit"
    )


def too_deep_lines(body: bytes, limit: int) -> list[int]:
    """0-based indices of the lines of ``body`` (split at ``\\n``) whose JSON nests
    deeper than ``limit`` levels, in order. Linear in the body's size."""
    if len(body) <= limit:
        return []  # too short to hold more than ``limit`` brackets
    # Brackets and newlines only (one C pass): a line can only nest past the limit
    # if more than ``limit`` of its bytes are brackets.
    brackets = body.translate(None, _NOT_BRACKETS)
    suspects: list[int] = []
    line, seen = 0, 0
    for match in _long_line(limit).finditer(brackets):
        line += brackets.count(b"\n", seen, match.start())
        seen = match.start()
        suspects.append(line)
    if not suspects:
        return []
    lines = body.split(b"\n")
    depths = _line_depths(_structure(b"\n".join(lines[k] for k in suspects)))
    return [k for k, levels in zip(suspects, depths.tolist(), strict=True) if levels > limit]


@functools.lru_cache(maxsize=8)
def _long_line(limit: int) -> re.Pattern[bytes]:
    # Anchored at line starts: each line is scanned once, whatever its length.
    return re.compile(rb"^[^\n]{%d,}" % (limit + 1), re.MULTILINE)


def depth(text: bytes) -> int:
    """The deepest nesting of brackets outside strings in ``text`` (one JSON value,
    line breaks allowed)."""
    return int(_line_depths(_structure(text.replace(b"\n", b" "))).max(initial=0))


def _structure(text: bytes) -> bytes:
    """Only what decides the nesting: brackets, the quotes that open or close
    strings, and line breaks (C passes; the numpy pass below then costs per bracket,
    not per byte). Backslash pairs go first (left to right, as JSON reads them), then
    the quotes the remaining backslashes escape; what a lone backslash escapes now
    is never a quote, so it and every other byte can go."""
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return text.translate(None, _NOT_STRUCTURE)


def _line_depths(text: bytes) -> npt.NDArray[np.int64]:
    """The deepest nesting outside strings of each line of ``text`` (reduced by
    `_structure`), all lines in a few whole-buffer numpy passes (no Python per line
    or per byte)."""
    data = np.frombuffer(text, np.uint8)
    breaks = np.flatnonzero(data == _NEWLINE)
    starts = np.concatenate(([0], breaks + 1))
    if not data.size:
        return np.zeros(1, np.int64)
    line_of = np.zeros(data.size, np.int64)
    line_of[breaks[breaks + 1 < data.size] + 1] = 1
    np.cumsum(line_of, out=line_of)
    # Every quote left by _structure opens or closes a string (counted from each
    # line's start), so brackets count only where an even number of them came before.
    toggles = (data == _QUOTE).astype(np.int64)
    np.cumsum(toggles, out=toggles)
    outside = (toggles - _at_line_start(toggles, breaks)[line_of]) % 2 == 0
    step = ((data == _OPEN_CURLY) | (data == _OPEN_SQUARE)).astype(np.int64)
    step -= (data == _CLOSE_CURLY) | (data == _CLOSE_SQUARE)
    step *= outside
    np.cumsum(step, out=step)
    step -= _at_line_start(step, breaks)[line_of]
    depths: npt.NDArray[np.int64] = np.maximum.reduceat(step, np.minimum(starts, data.size - 1))
    depths[starts >= data.size] = 0  # a trailing empty line
    return np.maximum(depths, 0)


def _at_line_start(running: npt.NDArray[np.int64], breaks: npt.NDArray[np.intp]) -> Any:
    """The running total just before each line (0 for the first)."""
    return np.concatenate(([0], running[breaks]))
