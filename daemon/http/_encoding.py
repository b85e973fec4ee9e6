"""Request bodies' Content-Encoding (RFC 9110 section 8.4): the one place they are decoded.

aiohttp's own decompression is switched off (`start_http`), so the codings taken, the
errors and the size bound are this module's alone:

- ``gzip`` (``x-gzip``), ``deflate`` (zlib-wrapped as RFC 9110 says, or raw deflate as
  some browsers send it), ``br`` and ``zstd``; ``identity`` is no coding at all;
- several codings (``Content-Encoding: gzip, br``, or several headers) were applied in
  the order listed and are undone in reverse;
- every layer's output is bounded while it is produced: a body that would decode to
  more than the limit stops at about the limit (a zip bomb never allocates more), and a
  truncated, corrupt or over-long stream is refused naming its coding.

`Decoding` is blocking (decompression is CPU work): the caller runs its steps in a
thread, one bounded ``read`` at a time.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final, Protocol

import brotli
import zstandard

__all__ = [
    "CODINGS",
    "CorruptEncoding",
    "DecodedTooLarge",
    "Decoding",
    "EncodingError",
    "UnsupportedEncoding",
    "codings",
]

CODINGS: Final = ("gzip", "x-gzip", "deflate", "br", "zstd", "identity")
_ALIASES: Final = {"x-gzip": "gzip"}
# Compressed bytes a layer pulls from the one below at a time.
_INPUT: Final = 64 * 1024
# python-zstandard's decompressobj takes no output bound: it is fed slices small enough
# that even zstd's densest blocks (a 4-byte RLE block is 128 KiB) cannot overshoot the
# budget by more than _ZSTD_MIN_FEED << _ZSTD_RATIO_BITS (1 MiB).
_ZSTD_RATIO_BITS: Final = 15
_ZSTD_MIN_FEED: Final = 32
# The window a zstd frame may ask the decoder to allocate: about the body limit, at
# least what encoders stream with up to level 19 (8 MiB), at most the library's 128 MiB.
_ZSTD_MIN_WINDOW: Final = 1 << 23
_ZSTD_MAX_WINDOW: Final = 1 << 27
_SHOWN_CHARS: Final = 60


class EncodingError(Exception):
    """A body whose Content-Encoding cannot be undone; ``str()`` says why."""


class UnsupportedEncoding(EncodingError):
    """A coding this daemon does not decode (415)."""

    def __init__(self, coding: str) -> None:
        shown = repr(coding) if len(coding) <= _SHOWN_CHARS else repr(coding[:_SHOWN_CHARS]) + "..."
        super().__init__(
            f"unsupported Content-Encoding {shown}; send the body as it is (identity) or "
            "encoded with gzip, x-gzip, deflate, br or zstd (several, comma-separated, "
            "in the order they were applied)"
        )
        self.coding = coding


class CorruptEncoding(EncodingError):
    """Bytes that are not a whole stream of their coding (400)."""

    def __init__(self, coding: str, problem: str) -> None:
        super().__init__(f"the request body is not valid {coding} (Content-Encoding): {problem}")
        self.coding = coding


class DecodedTooLarge(EncodingError):
    """A layer decoded to more than the limit (413); the caller names the limit."""

    def __init__(self, coding: str, limit: int) -> None:
        super().__init__(f"more than {limit} bytes after undoing Content-Encoding {coding}")
        self.coding = coding
        self.limit = limit


def codings(values: Iterable[str]) -> tuple[str, ...]:
    """The codings named by every ``Content-Encoding`` header value, in the order they
    were applied, ``x-gzip`` as ``gzip``, ``identity`` and empty list items left out.
    Raises `UnsupportedEncoding` for any other name."""
    found = []
    for value in values:
        for item in value.split(","):
            name = item.strip(" \t").lower()
            if not name or name == "identity":
                continue
            if name not in CODINGS:
                raise UnsupportedEncoding(item.strip(" \t"))
            found.append(_ALIASES.get(name, name))
    return tuple(found)


class _Readable(Protocol):
    def read(self, size: int) -> bytes: ...


class _Bytes:
    """The body as received: the bottom layer."""

    def __init__(self, body: bytes) -> None:
        self._view = memoryview(body)
        self._at = 0

    def read(self, size: int) -> bytes:
        piece = bytes(self._view[self._at : self._at + size])
        self._at += len(piece)
        return piece


class _Layer:
    """One coding undone over the layer below; ``read`` returns up to about ``size``
    bytes, b"" at the end of the stream (never before: a truncated one raises)."""

    def __init__(self, coding: str, below: _Readable, limit: int) -> None:
        self.coding = coding
        self._below = below
        self._limit = limit
        self._produced = 0
        self._pending = b""  # input taken from below, not yet given to the decoder
        self._ended = False  # the stream (or the current member/frame) is complete

    def read(self, size: int) -> bytes:
        size = max(1, size)
        while True:
            out = self._step(size)
            if out:
                self._produced += len(out)
                if self._produced > self._limit:
                    raise DecodedTooLarge(self.coding, self._limit)
                return out
            if self._holds_input():
                continue  # a new member or frame started on input already held
            data = self._below.read(_INPUT)
            if not data:
                if self._ended:
                    return b""
                raise CorruptEncoding(self.coding, "the stream ends before it is complete")
            self._next(data)

    def _step(self, size: int) -> bytes:
        """Decoded bytes from the input held (b"" when more input is needed)."""
        raise NotImplementedError

    def _holds_input(self) -> bool:
        return bool(self._pending)

    def _next(self, data: bytes) -> None:
        """Input that arrived after the decoder asked for more."""
        if self._ended:
            raise CorruptEncoding(self.coding, "there are bytes after the end of the stream")
        self._pending = data


class _Zlib(_Layer):
    """gzip (members one after another, as RFC 1952 allows) and deflate."""

    def __init__(self, coding: str, below: _Readable, limit: int) -> None:
        super().__init__(coding, below, limit)
        self._obj: zlib._Decompress | None = None

    def _step(self, size: int) -> bytes:
        obj = self._obj
        if obj is None:
            if not self._pending:
                return b""
            if len(self._pending) < 2:  # the zlib header check needs two bytes
                self._pending += self._below.read(_INPUT)
            obj = self._obj = zlib.decompressobj(self._wbits(self._pending))
        try:
            out = obj.decompress(self._pending, size)
        except zlib.error as exc:
            raise CorruptEncoding(self.coding, str(exc)) from None
        self._pending = obj.unconsumed_tail
        if obj.eof:
            self._ended = True
            rest, self._pending = obj.unused_data, b""
            if rest:
                self._next(rest)
        return out

    def _next(self, data: bytes) -> None:
        if self._ended and self.coding == "gzip":
            self._ended = False  # the next member
            self._obj = None
        super()._next(data)

    def _wbits(self, first: bytes) -> int:
        if self.coding == "gzip":
            return 16 + zlib.MAX_WBITS
        # RFC 1950's header: compression method 8, and a check over its two bytes.
        # Without one, the body is raw deflate (what some browsers send as "deflate").
        zlib_header = (
            len(first) >= 2
            and first[0] & 0x0F == 8
            and first[0] >> 4 <= 7
            and (first[0] << 8 | first[1]) % 31 == 0
        )
        return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS


class _Brotli(_Layer):
    def __init__(self, coding: str, below: _Readable, limit: int) -> None:
        super().__init__(coding, below, limit)
        self._obj = brotli.Decompressor()

    def _step(self, size: int) -> bytes:
        obj = self._obj
        # After output was cut at the bound, only empty input may follow until the
        # decoder takes more; even then it may still hold output: drain it first.
        data = b""
        if self._pending and obj.can_accept_more_data():
            data, self._pending = self._pending, b""
        elif obj.is_finished():
            return b""
        try:
            out: bytes = obj.process(data, output_buffer_limit=size)
        except brotli.error as exc:
            raise CorruptEncoding(self.coding, str(exc) or "not a brotli stream") from None
        self._ended = bool(obj.is_finished())
        return out


class _Zstd(_Layer):
    """zstd, frames one after another (RFC 8878 allows several)."""

    def __init__(self, coding: str, below: _Readable, limit: int) -> None:
        super().__init__(coding, below, limit)
        window = min(max(_ZSTD_MIN_WINDOW, 1 << max(0, limit - 1).bit_length()), _ZSTD_MAX_WINDOW)
        self._context = zstandard.ZstdDecompressor(max_window_size=window)
        self._obj: zstandard.ZstdDecompressionObj | None = None
        self._spill = b""  # decoded beyond what a read asked for
        self._input = memoryview(b"")  # the input held, sliced without copying

    def _step(self, size: int) -> bytes:
        if not self._spill:
            self._spill = self._decode()
        out, self._spill = self._spill[:size], self._spill[size:]
        return out

    def _decode(self) -> bytes:
        if not self._input:
            return b""
        if self._obj is None:
            self._obj = self._context.decompressobj()
        budget = self._limit + 1 - self._produced
        feed = max(_ZSTD_MIN_FEED, budget >> _ZSTD_RATIO_BITS)
        data, self._input = self._input[:feed], self._input[feed:]
        try:
            out = self._obj.decompress(data)
        except zstandard.ZstdError as exc:
            raise CorruptEncoding(self.coding, str(exc)) from None
        if self._obj.eof:
            self._ended = True
            rest = self._obj.unused_data + bytes(self._input)
            self._obj, self._input = None, memoryview(b"")
            if rest:
                self._next(rest)
        return out

    def _holds_input(self) -> bool:
        return bool(self._input)

    def _next(self, data: bytes) -> None:
        self._ended = False  # a frame may follow a frame
        self._input = memoryview(data)


_LAYERS: Final = {"gzip": _Zlib, "deflate": _Zlib, "br": _Brotli, "zstd": _Zstd}


class Decoding:
    """``body`` with ``applied`` (`codings`) undone, read in bounded steps; every
    layer's output is bounded by ``limit`` (`DecodedTooLarge`)."""

    def __init__(self, body: bytes, applied: tuple[str, ...], limit: int) -> None:
        top: _Readable = _Bytes(body)
        for coding in reversed(applied):
            top = _LAYERS[coding](coding, top, limit)
        self._top = top

    def read(self, size: int) -> bytes:
        """Up to about ``size`` decoded bytes; b"" once the body is whole."""
        return self._top.read(size)

    def whole(self) -> bytes:
        """Every decoded byte (for small bodies)."""
        pieces = []
        while piece := self.read(_INPUT):
            pieces.append(piece)
        return b"".join(pieces)
