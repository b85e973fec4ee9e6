"""The Confluent wire format every registry-backed Kafka format shares: magic byte 0,
the writer schema's 4-byte big-endian id, then the payload (Avro binary; JSON text;
for Protobuf the message-index path first). Values are grouped by schema id (read for
a whole fetch at once), each group decoded on its own, and the rows put back in record
order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest
from icespool.decode._records import Binary
from icespool.decode._screen import EMPTY, oversized

__all__ = [
    "HEADER",
    "after",
    "bad_header",
    "in_order",
    "layout",
    "message_path",
    "new_columns_request",
    "split_framed",
]

#: Magic byte and schema id.
HEADER = 5


def bad_header(value: bytes) -> str | None:
    """Why ``value`` is not in the wire format; None when it is."""
    if len(value) < HEADER:
        return (
            f"value of {len(value)} byte(s) is too short for the Confluent wire format "
            "(magic byte 0 and a 4-byte schema id)"
        )
    if value[0] != 0:
        return f"magic byte is {value[0]}, not 0: not the Confluent wire format"
    return None


def split_framed(
    values: Binary, dead: list[DeadRecord], max_bytes: int | None = None
) -> tuple[dict[int, npt.NDArray[np.int64]], Binary]:
    """The positions of the values by schema id, and every value without its header,
    read for the whole fetch at once (numpy over the values' offsets, one
    ``binary_slice``). Values that are empty, longer than ``max_bytes`` (when given)
    or not in the wire format are dead."""
    n = len(values)
    if not n:
        return {}, values
    offsets, data = layout(values)
    lengths = np.diff(offsets)
    present = lengths > 0
    if values.null_count:
        present &= values.is_valid().to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(~present).tolist():
        dead.append(DeadRecord(i, "empty", EMPTY))
    if max_bytes is not None:
        over = present & (lengths > max_bytes)
        for i in np.flatnonzero(over).tolist():
            dead.append(oversized(i, int(lengths[i]), max_bytes))
        present &= ~over
    framed = present & (lengths >= HEADER)
    starts = offsets[:-1]
    framed[framed] = data[starts[framed]] == 0
    for i in np.flatnonzero(present & ~framed).tolist():
        value = values[i].as_py()
        dead.append(DeadRecord(i, "invalid", bad_header(value) or "not the wire format"))
    at = np.flatnonzero(framed)
    first = starts[at]
    ids = (
        (data[first + 1].astype(np.int64) << 24)
        | (data[first + 2].astype(np.int64) << 16)
        | (data[first + 3].astype(np.int64) << 8)
        | data[first + 4].astype(np.int64)
    )
    groups: dict[int, npt.NDArray[np.int64]] = {}
    for schema_id in np.unique(ids).tolist():
        groups[int(schema_id)] = at[ids == schema_id].astype(np.int64)
    return groups, after(values, HEADER)


def layout(values: Binary) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """The values' offsets (one more than values) into their bytes, and those bytes."""
    offsets_type = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], offsets_type)[
        values.offset : values.offset + len(values) + 1
    ]
    data_buffer = values.buffers()[2]
    data = (
        np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    )
    return offsets.astype(np.int64), data


def after(values: Binary, start: int) -> Binary:
    """Each value without its first ``start`` bytes."""
    # An explicit stop: pyarrow 26's default one fails on binary arrays.
    cut: Binary = pc.binary_slice(values, start, 2**31 - 1)
    return cut


def message_path(body: bytes) -> tuple[tuple[int, ...], int]:
    """Protobuf's message-index path at the start of ``body`` (a value after its
    header), and where the message starts: a count and that many indexes, each a
    zigzag varint; a single 0 byte is [0]. ValueError when the bytes end first."""
    at = 0
    if body[:1] == b"\x00":
        return (0,), 1

    def varint() -> int:
        nonlocal at
        result = shift = 0
        while True:
            if at >= len(body) or shift > 63:
                raise ValueError("the message-index path is cut short")
            byte = body[at]
            at += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)

    count = varint()
    if not 0 < count <= 100:
        raise ValueError(f"the message-index path has {count} entries")
    return tuple(varint() for _ in range(count)), at


def in_order(
    parts: Sequence[tuple[pa.RecordBatch, Sequence[int] | npt.NDArray[np.int64]]],
    schema: pa.Schema,
) -> tuple[pa.Table, npt.NDArray[np.int64]]:
    """The groups' rows (each with the record positions they came from) as one table
    in record order, and those positions."""
    ok = np.concatenate([np.asarray(idx, dtype=np.int64) for _, idx in parts])
    table = pa.Table.from_batches([t for t, _ in parts], schema=schema)
    order = np.argsort(ok, kind="stable")
    if np.any(order != np.arange(len(ok))):
        table = table.take(pa.array(order))
        ok = ok[order]
    return table, ok


def new_columns_request(decoded: Decoded) -> EvolveRequest | None:
    """The columns the records' schemas declare that the table lacks (exact types),
    when records failed on one of them."""
    if decoded.declared is None:
        return None
    failed = {d.column.split(".", 1)[0] for d in decoded.dead if d.column is not None}
    if not failed & set(decoded.declared.names):
        return None
    incoming = decoded.declared
    return EvolveRequest(frozenset(incoming.names), lambda: incoming, exact=True)
