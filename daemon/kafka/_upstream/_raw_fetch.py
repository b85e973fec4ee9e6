"""A partition's records read past what aiokafka's record parser refuses.

aiokafka decodes a record's header keys as UTF-8 (they are bytes on the wire, and
brokers store whatever a producer sent), and a record batch whose CRC or structure
is wrong stops its iterator. Either way ``getmany`` raises on every call at the
same position, for ever, and the other partitions of that fetch stall with it.

This module fetches one partition's raw bytes at an offset (one Fetch request
through the consumer's own client, so it uses the same brokers, TLS and SASL) and
parses record batches (message format v2) itself, tolerantly:

- a header key that is not UTF-8 is kept with its bytes escaped (surrogateescape)
  and the record is marked with the problem: key, value and headers are recovered;
- a record whose structure does not parse, or a batch that fails its CRC, loses
  its bytes: its offsets (through the end of the batch) come back marked, with no
  key or value, so they are dead-lettered with their offsets instead of retried.

With ``read_committed`` it reads what the consumer would: the broker returns nothing
past the last stable offset, and the batches of aborted transactions (the fetch's
aborted-transactions list, each producer up to its abort marker) are left out as
aiokafka leaves them out.

Relies on (checked by ``_contract``): the consumer's ``_client`` (an ``AIOKafkaClient``
with ``cluster`` and ``send(node_id, request)``), ``FetchRequest(max_wait_time,
min_bytes, max_bytes, isolation_level, topics)``, and ``_DefaultRecordBatchPy``'s
``_buffer``, ``_pos``, ``_num_records`` and ``_maybe_uncompress``, read as its
``_read_msg`` reads them, with ``decode_varint_py(buffer, pos)``.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.util import decode_varint_py

__all__ = ["RawRecord", "fetch_raw", "parse_batches"]

_BATCH_HEAD: Final = struct.Struct(">qi")  # base offset, batch length
_MAGIC_AT: Final = 16
_ISOLATION: Final = {"read_uncommitted": 0, "read_committed": 1}
# Some brokers (Tansu) answer a fetch with max_wait 0 before reading the log.
_MAX_WAIT_MS: Final = 200


@dataclass(frozen=True, slots=True)
class RawRecord:
    """The attributes of a ConsumerRecord the source reads, plus ``problem``: why
    aiokafka could not parse the record (None: it could)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    problem: str | None = None


async def fetch_raw(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    offset: int,
    max_bytes: int,
    seconds: float,
    isolation_level: str = "read_uncommitted",
) -> tuple[list[RawRecord], int]:
    """The records of ``tp`` from ``offset`` in one fetch through ``consumer``'s client
    (bounded by ``seconds``), and the offset after the last complete batch (``offset``
    when there is none yet)."""
    client: Any = consumer._client
    node = client.cluster.leader_for_partition(tp)
    if node is None or node < 0:
        raise KafkaError(f"no leader known for {tp.topic}[{tp.partition}]")
    request = FetchRequest(
        _MAX_WAIT_MS,
        1,
        max_bytes,
        _ISOLATION[isolation_level],
        [(tp.topic, [(tp.partition, offset, max_bytes)])],
    )
    response = await asyncio.wait_for(client.send(node, request), seconds)
    for _, partitions in response.topics:
        for partition, error_code, _highwater, *data in partitions:
            if partition != tp.partition:
                continue
            if error_code:
                raise for_code(error_code)(f"fetching {tp.topic}[{tp.partition}] at {offset}")
            aborted = None
            if isolation_level == "read_committed":
                # After the last stable offset (v4), and the log start offset (v5 on).
                aborted = data[2 if response.API_VERSION >= 5 else 1] or []
            return parse_batches(bytes(data[-1] or b""), offset, aborted)
    return [], offset


def parse_batches(
    data: bytes, offset: int, aborted: list[tuple[int, int]] | None = None
) -> tuple[list[RawRecord], int]:
    """Records at or after ``offset`` in the complete batches of ``data``; with
    ``aborted`` (a read_committed fetch's (producer id, first offset) list), none of the
    aborted transactions'."""
    records: list[RawRecord] = []
    position = 0
    next_offset = offset
    aborts = _Aborts(aborted) if aborted is not None else None
    while position + _BATCH_HEAD.size <= len(data):
        base, length = _BATCH_HEAD.unpack_from(data, position)
        end = position + _BATCH_HEAD.size + length
        if end > len(data) or length < _MAGIC_AT:
            break  # a batch cut off by the fetch size: the next fetch gets it whole
        chunk = data[position:end]
        position = end
        if chunk[_MAGIC_AT] != 2:
            # Formats before Kafka 0.11 have no headers; a broken one is not read.
            batch_end = base + 1
            records.append(_lost(max(base, offset), "a message set in a pre-0.11 format"))
        else:
            batch = _Batch(chunk)
            batch_end = batch.next_offset
            aborted_batch = aborts is not None and aborts.skips(batch)
            if not aborted_batch and not batch.is_control_batch:
                records.extend(r for r in batch.read_all() if r.offset >= offset)
        next_offset = max(next_offset, batch_end)
    return records, next_offset


class _Aborts:
    """aiokafka's read_committed filter (``PartitionRecords._unpack_records``): a
    producer is aborted from the first offset the fetch lists for it until its abort
    marker, and its transactional batches meanwhile are left out."""

    def __init__(self, aborted: list[tuple[int, int]]) -> None:
        self._pending = sorted(aborted, key=lambda a: a[1])
        self._producers: set[int] = set()

    def skips(self, batch: _Batch) -> bool:
        while self._pending and self._pending[0][1] <= batch.base_offset:
            self._producers.add(self._pending.pop(0)[0])
        if batch.is_control_batch and _is_abort_marker(batch):
            self._producers.discard(batch.producer_id)
        return bool(batch.is_transactional and batch.producer_id in self._producers)


def _is_abort_marker(batch: _Batch) -> bool:
    """Whether a control batch is an abort marker (one that does not read is not)."""
    try:
        record = next(iter(batch))
        return bool(ControlRecord.parse(record.key) == ABORT_MARKER)
    except Exception:  # a broken control batch ends nothing
        return False


def _lost(offset: int, problem: str) -> RawRecord:
    return RawRecord(offset, -1, None, None, [], f"{problem}; its bytes cannot be recovered")


class _Batch(_DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's pure-Python v2 batch, reading records the way it does except
    that nothing in a record stops the records after it."""

    def read_all(self) -> list[RawRecord]:
        base, last = self.base_offset, self.next_offset - 1
        if not self.validate_crc():
            return [_lost(o, "the record batch fails its CRC check") for o in range(base, last + 1)]
        try:
            self._maybe_uncompress()
        except Exception as exc:  # any codec error: the batch's records are lost
            return [
                _lost(o, f"the batch does not decompress ({exc})") for o in range(base, last + 1)
            ]
        out: list[RawRecord] = []
        for _ in range(self._num_records):
            try:
                out.append(self._read_tolerant())
            except (ValueError, IndexError, struct.error) as exc:
                first = out[-1].offset + 1 if out else base
                problem = f"the record does not parse ({exc})"
                return out + [_lost(o, problem) for o in range(first, last + 1)]
        return out

    def _read_tolerant(self) -> RawRecord:
        buffer: bytearray = self._buffer
        pos: int = self._pos  # type: ignore[has-type]
        length, pos = decode_varint_py(buffer, pos)
        start = pos
        _, pos = decode_varint_py(buffer, pos)  # attributes
        ts_delta, pos = decode_varint_py(buffer, pos)
        timestamp = (
            self.max_timestamp
            if self.timestamp_type == self.LOG_APPEND_TIME
            else self.first_timestamp + ts_delta
        )
        offset_delta, pos = decode_varint_py(buffer, pos)
        key, pos = _bytes(buffer, pos)
        value, pos = _bytes(buffer, pos)
        count, pos = decode_varint_py(buffer, pos)
        if count < 0:
            raise ValueError(f"negative header count {count}")
        headers: list[tuple[str, bytes]] = []
        problem = None
        for _ in range(count):
            name, pos = _bytes(buffer, pos)
            if name is None:
                raise ValueError("a header key is null")
            try:
                text = name.decode("utf-8")
            except UnicodeDecodeError:
                text = name.decode("utf-8", "surrogateescape")
                problem = f"header key {name!r} is not UTF-8"
            header_value, pos = _bytes(buffer, pos)
            headers.append((text, header_value or b""))
        if pos - start != length:
            raise ValueError(f"record length {length} does not match its {pos - start} bytes")
        self._pos = pos
        return RawRecord(self.base_offset + offset_delta, timestamp, key, value, headers, problem)


def _bytes(buffer: bytearray, pos: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint_py(buffer, pos)
    if size < 0:
        return None, pos
    if pos + size > len(buffer):
        raise ValueError("a field runs past the end of the record")
    return bytes(buffer[pos : pos + size]), pos + size
