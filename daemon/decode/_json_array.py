"""``application/json`` bodies (a JSON array of objects) -> the NDJSON decode path.

A JSON array is turned into NDJSON in place, without parsing a record in Python: the
top-level commas become line breaks, the outer brackets and the line breaks between
tokens become spaces. Element ``i`` of the array is then line ``i + 1`` of the NDJSON,
so the NDJSON decoder's value rules, nesting bound and all-or-nothing answer apply as
they are, and its messages are rewritten to name the array index instead of the line.

Finding the top-level commas takes the same non-recursive, vectorized scan as
`icespool.decode._nesting`: backslash pairs and escaped quotes are blanked (same length, so byte
positions hold), then only the bytes that decide the structure (brackets, quotes,
commas, line breaks) are looked at, with running sums for "inside a string" and depth.
Nothing here recurses, so a body nested a million levels deep costs a scan, and the
NDJSON decoder's depth check (``max_nesting_depth``) then refuses it by index.
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import numpy.typing as npt

from icespool.errors import BadInputError, SchemaError

__all__ = ["JSON", "array_error", "ndjson_from_array"]

JSON: Final = "application/json"

_WS: Final = b" \t\r\n"
_BLANK: Final = re.compile(rb"[ \t\r\n]*")
_STRUCTURE: Final = np.zeros(256, np.bool_)
_STRUCTURE[list(b'[]{}",\n\r')] = True
_OPEN_SQUARE, _CLOSE_SQUARE, _OPEN_CURLY, _CLOSE_CURLY = b"[]{}"
_QUOTE, _COMMA, _NEWLINE, _RETURN, _SPACE = b'",\n\r '
_SHOWN: Final = 40
_LINE: Final = re.compile(r"\bline (\d+)\b")
_NDJSON_HINT: Final = re.compile(
    r"; send one JSON object per line, without line breaks inside a record"
)
_NDJSON_BODY: Final = "the body is not valid NDJSON"


def ndjson_from_array(body: bytes) -> bytes:
    """The NDJSON (one object per line, line ``i + 1`` = element ``i``) equivalent of a
    JSON array body; `BadInputError` when the body is not one JSON array (empty, an
    object, unclosed, trailing data, an empty element, a raw line break in a string).
    Elements that are not objects, and every value rule, are left to the NDJSON
    decoder, whose messages `array_error` rewrites. Blocking: run it off the loop."""
    start = len(body) - len(body.lstrip(_WS))
    if start == len(body):
        raise BadInputError("no records: the body is empty; send a JSON array of objects")
    if body[start] != _OPEN_SQUARE:
        got = "an object" if body[start] == _OPEN_CURLY else _shown(body[start:])
        raise BadInputError(
            f"expected a JSON array of objects ([{{...}}, ...]), got {got}; an "
            "application/json body is one array (send application/x-ndjson for one "
            "object per line)"
        )
    if start:
        body = body[start:]  # the first line must hold element 0, whatever came before
    # Same-length blanking keeps every byte's position: pairs first (as JSON reads them,
    # left to right), then the quotes the remaining backslashes escape.
    scan = body
    if b"\\" in scan:
        scan = scan.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    data = np.frombuffer(scan, np.uint8)
    at: npt.NDArray[np.intp] = np.flatnonzero(_STRUCTURE[data])
    char = data[at]
    quotes = char == _QUOTE
    # A byte is inside a string when an odd number of quotes came before it (the
    # running parity: an xor scan, cheaper than a sum).
    inside = (np.bitwise_xor.accumulate(quotes.view(np.uint8)) ^ quotes).view(np.bool_)
    breaks = (char == _NEWLINE) | (char == _RETURN)
    broken = np.flatnonzero(inside & breaks)
    broken_at = int(at[broken[0]]) if broken.size else -1
    # From here on only what is outside strings: brackets, commas, line breaks.
    keep = ~(inside | quotes)
    at, char = at[keep], char[keep]
    opens = (char == _OPEN_SQUARE) | (char == _OPEN_CURLY)
    closes = (char == _CLOSE_SQUARE) | (char == _CLOSE_CURLY)
    depth = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int64)
    ended = np.flatnonzero(depth == 0)
    if not ended.size:
        raise BadInputError(
            "the JSON array is not closed (a truncated body?); send the whole array"
        )
    last = int(ended[0])
    end = int(at[last])
    if char[last] != _CLOSE_SQUARE:
        raise BadInputError(
            f"the JSON array is closed by {chr(char[last])!r} at byte {end}; brackets do not match"
        )
    if not _BLANK.fullmatch(body, end + 1):
        raise BadInputError(
            f"trailing data after the JSON array at byte {end + 1}: "
            f"{_shown(body[end + 1 :])}; send one array per request"
        )
    at, char, depth = at[: last + 1], char[: last + 1], depth[: last + 1]
    top = (char == _COMMA) & (depth == 1)
    commas = at[top]
    if 0 <= broken_at < end:
        index = int(np.searchsorted(commas, broken_at))
        raise BadInputError(
            f"record at index {index}: invalid JSON (a raw line break inside a string; "
            "write it as \\n)"
        )
    breaks = (char == _NEWLINE) | (char == _RETURN)
    spaced = at[breaks]
    if spaced.size:
        # Line breaks left are between tokens (whitespace): the element checks skip them.
        solid = ~breaks
        at, char, top = at[solid], char[solid], top[solid]
    separators = np.concatenate(([0], np.flatnonzero(top), [at.size - 1]))
    _check_elements(body, at, char, separators)
    out = bytearray(memoryview(body)[: end + 1])
    view = np.frombuffer(out, np.uint8)
    view[spaced] = _SPACE
    view[0] = view[-1] = _SPACE
    view[commas] = _NEWLINE
    return bytes(out)


def _check_elements(
    body: bytes,
    at: npt.NDArray[np.intp],
    char: npt.NDArray[np.uint8],
    separators: npt.NDArray[np.intp],
) -> None:
    """Refuse an empty array, an empty element (``,,``, a trailing comma) and an
    element that does not start as an object: the NDJSON decoder skips blank lines, so
    those would otherwise vanish instead of being refused."""
    if (
        separators.size == 2
        and separators[1] == separators[0] + 1
        and not body[at[separators[0]] + 1 : at[separators[1]]].strip(_WS)
    ):
        raise BadInputError("no records: the JSON array is empty")
    # An element without a bracket (outside strings) is a scalar, a string or nothing
    # at all: either way the first one is the error (no loop over elements).
    bare = np.flatnonzero(np.diff(separators) == 1)
    if bare.size:
        index = int(bare[0])
        text = body[at[separators[index]] + 1 : at[separators[index + 1]]].strip(_WS)
        if not text:
            raise BadInputError(
                f"record at index {index}: empty element (two commas in a row or a trailing comma)"
            )
        raise BadInputError(f"record at index {index}: expected a JSON object, got {_kind(text)}")
    first = char[separators[:-1] + 1]
    wrong = np.flatnonzero(first != _OPEN_CURLY)
    if wrong.size:
        index = int(wrong[0])
        what = {_OPEN_SQUARE: "an array"}.get(int(first[index]))
        raise BadInputError(
            f"record at index {index}: expected a JSON object, got {what or 'invalid JSON'}"
        )


def array_error(exc: BadInputError) -> BadInputError:
    """``exc`` (raised by the NDJSON decoder for `ndjson_from_array`'s output) telling
    the array index (0-based) where it told the line."""
    if isinstance(exc, SchemaError):  # SchemaChangeError too: same fields, same class
        problem = _array_words(exc.problem)
        if problem == exc.problem:
            return exc
        return type(exc)(exc.column, problem).because(exc.reason)
    message = _array_words(str(exc))
    if type(exc) is not BadInputError or message == str(exc):
        return exc
    return BadInputError(message).because(exc.reason)


def _array_words(text: str) -> str:
    text = _LINE.sub(lambda m: f"record at index {int(m.group(1)) - 1}", text)
    text = _NDJSON_HINT.sub("", text)
    return text.replace(_NDJSON_BODY, "the body is not a valid JSON array of objects")


def _kind(text: bytes) -> str:
    if text in (b"true", b"false"):
        return "a boolean"
    if text == b"null":
        return "null"
    if text[:1] == b'"' and text[-1:] == b'"' and len(text) > 1:
        return "a string"
    if text[:1] in b"-0123456789":
        return "a number"
    return f"invalid JSON {_shown(text)}"


def _shown(text: bytes) -> str:
    shown = repr(text[:_SHOWN].decode("utf-8", "replace"))
    return shown if len(text) <= _SHOWN else shown[:-1] + "...'"
