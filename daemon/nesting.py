"""How deep untrusted JSON nests, found without recursion, before any parser sees it.

Python's ``json`` recurses once per level (RecursionError past ~1,000) and
``pyarrow.json`` does too, in C: a value nested 20,000 deep overflows the C stack
and kills the process. So every body is measured here first, by byte scans that
cannot recurse:

- fast path (every ordinary body): a line cannot nest deeper than the number of
  ``[`` and ``{`` it holds, and counting them is a few numpy passes over the bytes;
- exact path (only lines with more openers than the limit): quotes not escaped by
  a backslash toggle "inside a string", and the running depth is a cumulative sum
  of +1/-1 per bracket outside strings. Vectorized too: no per-byte Python, no
  regex that could backtrack.
"""

from __future__ import annotations

from typing import Final

import numpy as np

__all__ = ["DEFAULT_MAX_DEPTH", "depth", "too_deep_lines"]

#: Deep enough for any real record; far below what the parsers survive.
DEFAULT_MAX_DEPTH: Final = 64

_OPEN_CURLY, _OPEN_SQUARE, _CLOSE_CURLY, _CLOSE_SQUARE = b"{[}]"
_NEWLINE, _QUOTE, _BACKSLASH = b'\n"\\'


def too_deep_lines(body: bytes, limit: int) -> list[int]:
    """0-based indices of the lines of ``body`` (split at ``\\n``) whose JSON nests
    deeper than ``limit`` levels, in order. Linear in the body's size."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return []  # the whole body has too few openers to nest that deep anywhere
    data = np.frombuffer(body, np.uint8)
    openers = np.flatnonzero((data == _OPEN_CURLY) | (data == _OPEN_SQUARE))
    newlines = np.flatnonzero(data == _NEWLINE)
    per_line = np.bincount(np.searchsorted(newlines, openers), minlength=len(newlines) + 1)
    suspects = np.flatnonzero(per_line > limit)
    if not suspects.size:
        return []
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(body)]))
    return [int(line) for line in suspects if depth(body[starts[line] : ends[line]]) > limit]


def depth(text: bytes) -> int:
    """The deepest nesting of brackets outside strings in ``text`` (one JSON value)."""
    data = np.frombuffer(text, np.uint8)
    if not data.size:
        return 0
    # A quote is escaped when an odd run of backslashes precedes it; the real
    # quotes alternate opening and closing strings, so brackets count only where
    # an even number of them came before.
    position = np.arange(data.size)
    last_plain = np.maximum.accumulate(np.where(data == _BACKSLASH, -1, position))
    quotes = np.flatnonzero(data == _QUOTE)
    before = np.maximum(quotes - 1, 0)
    run = np.where(quotes > 0, before - last_plain[before], 0)
    toggles = np.zeros(data.size, np.int8)
    toggles[quotes[run % 2 == 0]] = 1
    outside = np.cumsum(toggles, dtype=np.int64) % 2 == 0
    step = ((data == _OPEN_CURLY) | (data == _OPEN_SQUARE)).astype(np.int64)
    step -= (data == _CLOSE_CURLY) | (data == _CLOSE_SQUARE)
    return int(np.cumsum(step * outside).max(initial=0))
