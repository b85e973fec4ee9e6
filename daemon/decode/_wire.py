"""The Confluent wire format every registry-backed Kafka format shares: magic byte 0,
the writer schema's 4-byte big-endian id, then the payload (Avro binary; JSON text;
for Protobuf the message-index path first). Values are grouped by schema id, each
group decoded on its own, and the rows put back in record order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode._decoded import DeadRecord, Decoded, EvolveRequest

__all__ = [
    "HEADER",
    "bad_header",
    "group_by_id",
    "in_order",
    "message_path",
    "new_columns_request",
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


def group_by_id(
    values: Sequence[bytes | None], indices: Sequence[int], dead: list[DeadRecord]
) -> dict[int, list[int]]:
    """The values at ``indices`` by schema id; those not in the wire format are dead
    letters (``invalid``)."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        value = values[i]
        assert value is not None
        problem = bad_header(value)
        if problem is not None:
            dead.append(DeadRecord(i, "invalid", problem))
        else:
            groups.setdefault(int.from_bytes(value[1:HEADER], "big"), []).append(i)
    return groups


def message_path(value: bytes) -> tuple[tuple[int, ...], int]:
    """Protobuf's message-index path after the header, and where the message starts:
    a count and that many indexes, each a zigzag varint; a single 0 byte is [0].
    ValueError when the bytes end first."""
    at = HEADER
    if len(value) > at and value[at] == 0:
        return (0,), at + 1

    def varint() -> int:
        nonlocal at
        result = shift = 0
        while True:
            if at >= len(value) or shift > 63:
                raise ValueError("the message-index path is cut short")
            byte = value[at]
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
    parts: list[tuple[pa.RecordBatch, list[int]]], schema: pa.Schema
) -> tuple[pa.Table, npt.NDArray[np.int64]]:
    """The groups' rows (each with the record positions they came from) as one table
    in record order, and those positions."""
    ok = np.asarray([i for _, idx in parts for i in idx], dtype=np.int64)
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
