"""Segment file names that no table name can escape or collide through."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

SUFFIX = ".arrow"
_SEP = "__"
_MAX_NAME = 255  # bytes, the common filesystem limit for one path component
_ID_LEN = 36
_BUDGET = _MAX_NAME - _ID_LEN - len(SUFFIX) - 2 * len(_SEP)
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def _encode(part: str) -> str:
    # Everything outside [A-Za-z0-9] becomes _XX per UTF-8 byte. '_' is always
    # followed by two hex digits, so the '__' separator can never occur inside
    # a part, and '/', '.', NUL or '..' can never reach the filesystem.
    if not part:
        return "-"
    out: list[str] = []
    for ch in part:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"_{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def _shorten(encoded: str, keep: int) -> str:
    cut = encoded[:keep]
    # Do not leave half an escape at the end.
    tail = cut.rfind("_")
    if tail >= 0 and tail > len(cut) - 3:
        cut = cut[:tail]
    return cut


def segment_file_name(table: str, segment_id: str) -> str:
    """``{namespace}__{table}__{segment_id}.arrow`` with both parts encoded.

    Names too long for one path component keep a readable prefix plus a hash
    of the full table name, so two long names still never collide.
    """
    return f"{table_file_stem(table)}{_SEP}{segment_id}{SUFFIX}"


def table_file_stem(table: str) -> str:
    """``{namespace}__{table}``, encoded as in `segment_file_name`: a name for a file of
    the table's own that no table name can escape or collide through."""
    if not table:
        raise ValueError("table name must not be empty")
    namespace, _, name = table.rpartition(".")
    ns_enc, name_enc = _encode(namespace), _encode(name)
    if len(ns_enc) + len(name_enc) > _BUDGET:
        digest = hashlib.sha256(table.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        half = (_BUDGET - len(digest) - 1) // 2
        ns_enc = _shorten(ns_enc, half)
        name_enc = _shorten(name_enc, half) + "-" + digest
    return f"{ns_enc}{_SEP}{name_enc}"


def segment_writer(segment_id: str) -> str:
    """The last group of a segment id's text: its writer's incarnation tag, for the ids
    this version makes (`new_segment_id` with a writer); random digits for others."""
    return segment_id.rpartition("-")[2].lower()


def segment_id_of(file_name: str) -> str | None:
    """The segment id of a file name made by `segment_file_name`, else None."""
    if not file_name.endswith(SUFFIX):
        return None
    stem = file_name[: -len(SUFFIX)]
    _, sep, segment_id = stem.rpartition(_SEP)
    if not sep or len(segment_id) != _ID_LEN:
        return None
    return segment_id


class _Uuid7:
    """RFC 9562 version-7 ids, strictly increasing within this process.

    Their canonical text sorts in creation order, which is how recovery orders
    a table's leftover segments. A segment's id also names the process that wrote
    it: its last 48 bits (the text's last group) are the writer's incarnation tag
    (`segment_writer`), where other ids have random bits. A table records which of
    a spool's segments it holds as ranges of ids per writer; one writer's ids sort
    in the order it made them, and no other writer's id falls into its ranges.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self, writer: str | None = None) -> str:
        """A new id; ``writer`` (12 hex digits, an incarnation's tag) fills its last
        48 bits, else they are random."""
        low = (
            secrets.randbits(62) if writer is None else secrets.randbits(14) << 48 | int(writer, 16)
        )
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = secrets.randbits(10)  # leaves room to count up within a ms
            else:
                self._counter += 1
                if self._counter >= 1 << 12:
                    self._last_ms += 1
                    self._counter = 0
            value = (self._last_ms & ((1 << 48) - 1)) << 80
            value |= 0x7 << 76 | self._counter << 64
            value |= 0b10 << 62 | low
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"

    def follow(self, segment_id: str) -> None:
        """Make every later id sort after ``segment_id`` (a leftover of an earlier
        process, whose clock may have run ahead of this one's): a table's segments
        are committed in id order, which must stay the order they were acked in."""
        digits = segment_id.replace("-", "")
        if len(digits) != 32:
            return
        try:
            ms, counter = int(digits[:12], 16), int(digits[13:16], 16)
        except ValueError:
            return
        with self._lock:
            if (ms, counter) > (self._last_ms, self._counter):
                self._last_ms, self._counter = ms, counter


new_segment_id = _Uuid7()
