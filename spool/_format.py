"""Segment file format: an Arrow IPC stream whose every batch checksums itself.

A segment is a plain Arrow IPC stream (any Arrow reader opens it):

    schema message | batch message ... | seal batch | end-of-stream marker

Every batch message carries, in its custom metadata, the value
``icespool-crc32c=XXXXXXXX``: a CRC32C over the *whole encapsulated message*
(prefix, flatbuffer metadata, body, padding) with those eight hex digits set to
``00000000``, seeded with the CRC32C of the segment's schema message. So any
flipped bit anywhere in a batch message, or in the schema message, fails the
check; nothing corrupt is ever decoded as data. Caller metadata (source
offsets, producer ids) rides in the same message under ``icespool.meta`` and is
covered by the same checksum.

The seal batch is a zero-row batch marked ``icespool.seal``; it is what tells a
finished segment from one whose writer died, so damage to the final bytes of a
sealed file is reported as corruption rather than mistaken for a torn write. Its
value says who sealed it: ``1`` the process that wrote the segment, ``recovery``
the recovery of a later one (or of a copy of the directory). Only the writer's seal
says the segment is whole: a copy taken while the writer was still appending holds
a prefix of it, sealed by its recovery.

Why parse the framing by hand: to tell a torn tail (kill -9 in the middle of a
write; the complete prefix must be recovered) from corruption (quarantine), the
reader needs each message's extent before decoding it. The framing is the
documented IPC encapsulation: 0xFFFFFFFF, int32 metadata length, flatbuffer
``Message`` (whose field 3 is the body length), body.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

CONTINUATION = b"\xff\xff\xff\xff"
EOS = CONTINUATION + b"\x00\x00\x00\x00"
TABLE_KEY = b"icespool.table"
CRC_KEY = "icespool.crc"
CRC_MARKER = b"icespool-crc32c="
META_KEY = "icespool.meta"
SEAL_KEY = "icespool.seal"
SEALED_BY_WRITER = "1"
SEALED_BY_RECOVERY = "recovery"
_PLACEHOLDER = "00000000"
_MAX_METADATA = 16 << 20  # far above any real flatbuffer header; bigger means damage
_HEADER_SCHEMA = 1
_HEADER_RECORD_BATCH = 3
_MIN_BUFFER = 1 << 20


class FormatError(Exception):
    """The bytes are not a valid icespool segment (the reason says where)."""


def segment_schema(schema: pa.Schema, table: str) -> pa.Schema:
    """The schema written to a segment: the caller's, tagged with its table."""
    metadata = dict(schema.metadata or {})
    metadata[TABLE_KEY] = table.encode("utf-8", "surrogatepass")
    return schema.with_metadata(metadata)


def encode_meta(meta: Mapping[str, object] | None) -> str | None:
    if meta is None:
        return None
    text = json.dumps(meta, separators=(",", ":"), sort_keys=True, allow_nan=False)
    if CRC_MARKER.decode() in text:
        raise ValueError(f"caller metadata must not contain {CRC_MARKER.decode()!r}")
    return text


# The encode buffer of each spool thread (see `Encoder`).
_scratch = threading.local()


def _scratch_buffer(needed: int) -> pa.Buffer:
    """This thread's encode buffer, grown to at least ``needed`` bytes."""
    buffer: pa.Buffer | None = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < needed:
        grown = 0 if buffer is None else buffer.size * 2
        buffer = _scratch.buffer = pa.allocate_buffer(max(needed, _MIN_BUFFER, grown))
    return buffer


class Encoder:
    """Turns batches into checksummed IPC messages, reusing one buffer per thread.

    A fresh in-memory IPC writer per message costs microseconds; the buffer it
    writes into is reused so large batches do not fault in new pages each time.
    The buffer belongs to the thread, not to the encoder: one per open segment was
    1 MiB of RSS per table holding records (1 GiB with 1,000 tables, and 6 ms to
    allocate each). So `encode`'s result is valid until the next `encode` in the
    same thread; the spool writes it to its file in the same call.
    Not thread-safe: one encoder belongs to one open segment, whose appends are
    serialized by the spool.
    """

    def __init__(self, schema: pa.Schema, schema_message: bytes = b"") -> None:
        # `schema_message` continues an existing file: its own schema bytes seed
        # the checksums, whatever this pyarrow version would serialize today.
        self.schema = schema
        # The writer puts the schema message in the buffer before the batch; with
        # tens of thousands of columns it is megabytes ("Write out of bounds").
        self._schema_size = len(schema_message) or schema.serialize().size
        self.schema_message = schema_message
        self._schema_crc = crc32c.crc32c(schema_message) if schema_message else 0

    def encode(
        self, batch: pa.RecordBatch, meta: str | None, *, seal: str | None = None
    ) -> memoryview:
        """One encapsulated batch message, its CRC filled in: a view into this
        thread's buffer, valid until this thread's next `encode`. ``seal``: the seal
        batch's value (`SEALED_BY_WRITER` or `SEALED_BY_RECOVERY`)."""
        metadata = {CRC_KEY: CRC_MARKER.decode() + _PLACEHOLDER}
        if meta is not None:
            metadata[META_KEY] = meta
        if seal is not None:
            metadata[SEAL_KEY] = seal
        needed = (
            self._schema_size
            + ipc.get_record_batch_size(batch)
            + len(json.dumps(metadata)) * 2
            + (64 << 10)
        )
        buffer = _scratch_buffer(needed)
        sink = pa.FixedSizeBufferWriter(buffer)
        writer = ipc.new_stream(sink, self.schema)
        writer.write_batch(batch.replace_schema_metadata(self.schema.metadata), metadata)
        end = sink.tell()
        # Closing writes the 8-byte end-of-stream marker past `end`; done now so a
        # garbage-collected writer can never scribble into a reused buffer later.
        writer.close()
        view = memoryview(buffer).cast("B")
        schema_len = _message_end(view, 0)
        if not self.schema_message:
            self.schema_message = bytes(view[:schema_len])
            self._schema_crc = crc32c.crc32c(self.schema_message)
        message = view[schema_len:end]
        offset = _crc_offset(message)
        crc = crc32c.crc32c(message, self._schema_crc)
        message[offset : offset + 8] = f"{crc:08x}".encode()
        return message


@dataclass(frozen=True, slots=True)
class Scan:
    """What a segment's bytes hold, as far as they verify."""

    table: str | None
    batches: int  # complete, verified data batches
    good_end: int  # bytes that verified; a torn tail starts here
    sealed: bool
    clean_end: bool  # sealed and terminated by the end-of-stream marker
    error: str | None  # corruption: the file must be quarantined
    # Sealed by the process that wrote it (not by a recovery): no copy holds more.
    whole: bool = False


def scan(data: bytes) -> Scan:
    """Verify every message of a segment; never raises on bad bytes.

    Returns how far the file verifies. A tail that can be the torn end of one
    append is reported via ``good_end < len(data)`` with ``error`` None; bytes
    that cannot have been produced by a torn write are reported as ``error``.
    """
    view = memoryview(data)
    pos = 0
    schema_crc: int | None = None
    table: str | None = None
    batches = 0
    sealed = False
    whole = False
    try:
        while pos < len(data):
            header = _parse_header(view, pos)
            if header is None:  # incomplete: maybe a torn tail
                problem = _tail_problem(data, pos, sealed, schema_crc is None)
                if problem is not None:
                    return Scan(table, batches, pos, sealed, False, problem)
                return Scan(table, batches, pos, sealed, False, None)
            kind, end = header
            if kind == "eos":
                if not sealed:
                    return Scan(table, batches, pos, False, False, "end-of-stream before seal")
                if end != len(data):
                    return Scan(table, batches, pos, True, False, "bytes after end-of-stream")
                return Scan(table, batches, end, True, True, None, whole)
            if sealed:
                return Scan(table, batches, pos, True, False, f"message after seal at {pos}")
            message = view[pos:end]
            if kind == "schema":
                if schema_crc is not None:
                    return Scan(table, batches, pos, False, False, f"second schema at {pos}")
                table = _schema_table(message)
                schema_crc = crc32c.crc32c(message)
            else:
                if schema_crc is None:
                    return Scan(table, batches, pos, False, False, "batch before schema")
                problem = _verify(message, schema_crc)
                if problem is not None:
                    return Scan(table, batches, pos, False, False, f"{problem} at offset {pos}")
                seal = _seal_of(message)
                if seal is not None:
                    sealed, whole = True, seal != SEALED_BY_RECOVERY
                else:
                    batches += 1
            pos = end
    except FormatError as exc:
        return Scan(table, batches, pos, sealed, False, f"{exc} at offset {pos}")
    return Scan(table, batches, pos, sealed, False, None)


@dataclass(frozen=True, slots=True)
class Decoded:
    batches: list[pa.RecordBatch]
    metas: list[dict[str, object] | None]


def decode(data: bytes | pa.Buffer, good_end: int) -> Decoded:
    """Decode the verified prefix (as found by `scan`) into batches and metadata."""
    reader = ipc.open_stream(pa.py_buffer(data)[:good_end])
    batches: list[pa.RecordBatch] = []
    metas: list[dict[str, object] | None] = []
    while True:
        try:
            batch, custom = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        keys = custom or {}
        if SEAL_KEY.encode() in keys:
            continue
        raw = keys.get(META_KEY.encode())
        metas.append(None if raw is None else json.loads(raw))
        batches.append(batch.replace_schema_metadata(_strip(batch.schema.metadata)))
    return Decoded(batches, metas)


def schema_message_of(data: bytes) -> bytes:
    """The schema message a segment starts with (the file must have scanned clean that far)."""
    return data[: _message_end(memoryview(data), 0)]


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    # pa.nulls, not pa.array([]): pyarrow 26 cannot build an empty array of a nested
    # type holding an extension type (a uuid inside a struct, list or map).
    return pa.record_batch([pa.nulls(0, type=field.type) for field in schema], schema=schema)


def _strip(metadata: dict[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    if not metadata:
        return None
    rest = {k: v for k, v in metadata.items() if k != TABLE_KEY}
    return rest or None


def _message_end(view: memoryview, pos: int) -> int:
    header = _parse_header(view, pos)
    if header is None:
        raise FormatError("incomplete message in encoder buffer")
    return header[1]


def _parse_header(view: memoryview, pos: int) -> tuple[str, int] | None:
    """(kind, end) of the message at `pos`, or None when it runs past the data."""
    n = len(view) - pos
    if n < 8:
        if bytes(view[pos : pos + min(n, 4)]) != CONTINUATION[: min(n, 4)]:
            raise FormatError("bad message prefix")
        return None
    if bytes(view[pos : pos + 4]) != CONTINUATION:
        raise FormatError("bad message prefix")
    (meta_len,) = struct.unpack_from("<i", view, pos + 4)
    if meta_len == 0:
        return ("eos", pos + 8)
    if meta_len < 0 or meta_len % 8 or meta_len > _MAX_METADATA:
        raise FormatError(f"implausible metadata length {meta_len}")
    if n < 8 + meta_len:
        return None
    header_type, body_len = _message_fields(view[pos + 8 : pos + 8 + meta_len])
    if body_len < 0 or body_len % 8:
        raise FormatError(f"implausible body length {body_len}")
    if header_type == _HEADER_SCHEMA:
        kind = "schema"
    elif header_type == _HEADER_RECORD_BATCH:
        kind = "batch"
    else:
        raise FormatError(f"unexpected message type {header_type}")
    end = pos + 8 + meta_len + body_len
    if end > len(view):
        return None
    return (kind, end)


def _message_fields(meta: memoryview) -> tuple[int, int]:
    """header_type (field 1) and bodyLength (field 3) of a flatbuffer `Message`."""
    try:
        (table,) = struct.unpack_from("<I", meta, 0)
        (vt_rel,) = struct.unpack_from("<i", meta, table)
        vtable = table - vt_rel
        (vt_size,) = struct.unpack_from("<H", meta, vtable)

        def field(index: int) -> int:
            slot = 4 + 2 * index
            if slot + 2 > vt_size:
                return 0
            (offset,) = struct.unpack_from("<H", meta, vtable + slot)
            return int(offset)

        type_off, body_off = field(1), field(3)
        header_type = struct.unpack_from("<B", meta, table + type_off)[0] if type_off else 0
        body_len = struct.unpack_from("<q", meta, table + body_off)[0] if body_off else 0
    except struct.error as exc:
        raise FormatError("unreadable message header") from exc
    if vtable < 0 or table >= len(meta):
        raise FormatError("unreadable message header")
    return int(header_type), int(body_len)


def _crc_offset(message: memoryview) -> int:
    """Offset in `message` of the eight hex digits of its CRC."""
    (meta_len,) = struct.unpack_from("<i", message, 4)
    region = bytes(message[8 : 8 + meta_len])
    at = region.find(CRC_MARKER)
    if at < 0 or region.find(CRC_MARKER, at + 1) >= 0:
        raise FormatError("missing or repeated checksum")
    return 8 + at + len(CRC_MARKER)


def _verify(message: memoryview, schema_crc: int) -> str | None:
    try:
        offset = _crc_offset(message)
    except FormatError:
        return "missing checksum"
    crc = crc32c.crc32c(message[:offset], schema_crc)
    crc = crc32c.crc32c(_PLACEHOLDER.encode(), crc)
    crc = crc32c.crc32c(message[offset + 8 :], crc)
    # Byte-exact, not int(..., 16): that would accept 'A' for 'a', a flipped bit.
    if bytes(message[offset : offset + 8]) != f"{crc:08x}".encode():
        return "checksum mismatch"
    return None


def _seal_of(message: memoryview) -> str | None:
    """Who sealed the segment, if ``message`` is its seal batch (an older version's
    seals are all `SEALED_BY_WRITER`'s)."""
    (meta_len,) = struct.unpack_from("<i", message, 4)
    meta = bytes(message[8 : 8 + meta_len])
    if SEAL_KEY.encode() not in meta:
        return None
    return SEALED_BY_RECOVERY if SEALED_BY_RECOVERY.encode() in meta else SEALED_BY_WRITER


def _schema_table(message: memoryview) -> str | None:
    try:
        schema = ipc.read_schema(pa.py_buffer(bytes(message)))
    except (pa.ArrowException, OSError) as exc:
        raise FormatError("unreadable schema") from exc
    raw = (schema.metadata or {}).get(TABLE_KEY)
    try:
        return None if raw is None else raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise FormatError("unreadable table name") from exc


def _tail_problem(data: bytes, pos: int, sealed: bool, at_start: bool) -> str | None:
    """None when data[pos:] can be the torn end of a single append, else why not."""
    tail = data[pos:]
    if sealed:
        # After the seal only the end-of-stream marker may follow.
        return None if EOS.startswith(tail) else "damaged end-of-stream after seal"
    if len(tail) >= 8:
        (meta_len,) = struct.unpack_from("<i", tail, 4)
        meta_complete = len(tail) >= 8 + meta_len
        if meta_complete and not at_start:
            meta = tail[8 : 8 + meta_len]
            if SEAL_KEY.encode() in meta and tail[8 + meta_len :].strip(b"\x00"):
                # A seal's body is only zeroed offsets; anything else here is the
                # end-of-stream marker behind a damaged body length.
                return "damaged seal"
        if not meta_complete and len(tail) >= 16 and tail.endswith(EOS):
            # A torn header never ends in an end-of-stream marker; a damaged
            # length in the last message of a sealed file does.
            return "damaged length near end of sealed segment"
    # A torn tail holds the start of ONE message: a second checksum marker
    # means a damaged length field made complete messages look incomplete.
    if tail.count(CRC_MARKER) > 1:
        return "damaged message length"
    return None
