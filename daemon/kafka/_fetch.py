"""One partition's records from one poll, as the arrays a decoder reads.

A `Fetch` holds the records' offsets and values as whole arrays and is the
`icespool.decode.Records` its source's decoder takes: keys, timestamps and headers are
read from the client's records only when something asks for them (a metadata column,
a header route, a change decoder, a dead letter), and the metadata columns
(``_kafka_topic``, ``_kafka_offset``, ...) are its source columns.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode import Binary, binary_array
from icespool.kafka._offsets import RecordMark

__all__ = ["Fetch", "record_timestamps", "with_metadata_fields"]

_OFFSET = operator.attrgetter("offset")
_VALUE = operator.attrgetter("value")
_KEY = operator.attrgetter("key")
_TIMESTAMP = operator.attrgetter("timestamp")
_HEADERS = operator.attrgetter("headers")


class Fetch:
    """The records of one partition from one poll, in offset order, as whole-fetch
    arrays: ``offsets`` (int64), ``values`` and ``keys`` (binary; null for a
    tombstone or a record without key). ``keys``, ``timestamps`` (int64 ms since the
    epoch) and ``headers`` (per record, (name, bytes) pairs) are read from the client's
    records only when something asks for them (a metadata column, a header route, a
    change decoder, a dead letter): most fetches never do."""

    __slots__ = (
        "_headers",
        "_keys",
        "_records",
        "_rows",
        "_timestamps",
        "offsets",
        "partition",
        "topic",
        "values",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offsets: npt.NDArray[np.int64] | Sequence[int],
        values: Binary | pa.ChunkedArray | Sequence[bytes | None],
        keys: Binary | pa.ChunkedArray | Sequence[bytes | None] | None,
        timestamps: npt.NDArray[np.int64] | Sequence[int] | None = None,
        headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
        *,
        records: Sequence[Any] | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offsets: npt.NDArray[np.int64] = np.asarray(offsets, dtype=np.int64)
        self.values = binary_array(values)
        self._keys = None if keys is None else binary_array(keys)
        self._timestamps = None if timestamps is None else np.asarray(timestamps, np.int64)
        self._headers = None if headers is None else list(headers)
        if records is None and (keys is None or timestamps is None or headers is None):
            raise ValueError("a fetch needs its keys, timestamps and headers, or the records")
        # The client's records (and which of them this fetch holds, after `take`):
        # where keys, timestamps and headers come from when asked.
        self._records = records
        self._rows = rows

    @classmethod
    def of_records(cls, topic: str, partition: int, records: Sequence[Any]) -> Fetch:
        """A fetch over the client's records (aiokafka's ConsumerRecord or a raw
        record: anything with offset, value, key, timestamp and headers), each
        attribute gathered by one C-level pass (no Python bytecode per record)."""
        n = len(records)
        return cls(
            topic,
            partition,
            np.fromiter(map(_OFFSET, records), np.int64, n),
            pa.array(list(map(_VALUE, records)), pa.binary()),
            None,
            records=records,
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def _source(self) -> Sequence[Any]:
        assert self._records is not None
        if self._rows is None:
            return self._records
        return list(map(self._records.__getitem__, self._rows.tolist()))

    @property
    def keys(self) -> Binary:
        if self._keys is None:
            self._keys = binary_array(list(map(_KEY, self._source())))
        return self._keys

    @property
    def timestamps(self) -> npt.NDArray[np.int64]:
        if self._timestamps is None:
            source = self._source()
            self._timestamps = np.fromiter(map(_TIMESTAMP, source), np.int64, len(source))
        return self._timestamps

    @property
    def headers(self) -> list[Sequence[tuple[str, bytes]]]:
        if self._headers is None:
            self._headers = list(map(_HEADERS, self._source()))
        return self._headers

    def last_mark(self) -> RecordMark:
        """What identifies the fetch's last record, read from that record alone (the
        fetch's keys and timestamps are not materialised for it)."""
        index = len(self.offsets) - 1
        if self._records is None:
            timestamp, key = int(self.timestamps[index]), self.key(index)
        else:
            at = index if self._rows is None else int(self._rows[index])
            last = self._records[at]
            timestamp, key = int(_TIMESTAMP(last)), _KEY(last)
        return RecordMark.of(int(self.offsets[index]), timestamp, key, self.value(index))

    def value(self, index: int) -> bytes | None:
        """One record's value (for the few records a dead letter or an error names)."""
        found: bytes | None = self.values[index].as_py()
        return found

    def key(self, index: int) -> bytes | None:
        found: bytes | None = self.keys[index].as_py()
        return found

    def source_column(self, name: str) -> pa.Array:
        """A metadata column (``_kafka_topic``, ...) of these records."""
        return _METADATA[name](self)

    def take(self, rows: npt.NDArray[np.int64]) -> Fetch:
        rows = np.asarray(rows, dtype=np.int64)
        index = pa.array(rows, pa.int64())
        timestamps = None if self._timestamps is None else self._timestamps[rows]
        keys = None if self._keys is None else self._keys.take(index)
        headers = None
        if self._headers is not None:
            headers = list(map(self._headers.__getitem__, rows.tolist()))
        lazy = self._records is not None and (keys is None or timestamps is None or headers is None)
        return Fetch(
            self.topic,
            self.partition,
            self.offsets[rows],
            self.values.take(index),
            keys,
            timestamps,
            headers,
            records=self._records if lazy else None,
            rows=(rows if self._rows is None else self._rows[rows]) if lazy else None,
        )


# Years 1-9999 in ms (see daemon.value_ranges): what a timestamptz column holds.
_FIRST_MS, _LAST_MS = -62_135_596_800_000, 253_402_300_799_999


def record_timestamps(timestamps: npt.NDArray[np.int64] | Sequence[int]) -> pa.Array:
    """Kafka record timestamps (ms) as a timestamptz column. A producer may set any
    int64: one beyond years 1-9999 is null, not a value the table cannot hold (and
    past 2^63 / 1000 ms the conversion to microseconds wrapped around silently)."""
    ms = np.asarray(timestamps, dtype=np.int64)
    bad = (ms < _FIRST_MS) | (ms > _LAST_MS)
    us = np.where(bad, 0, ms) * 1000
    return pa.array(us, pa.timestamp("us", "UTC"), mask=bad if bad.any() else None)


_METADATA: dict[str, Callable[[Fetch], pa.Array]] = {
    "_kafka_topic": lambda f: pa.repeat(pa.scalar(f.topic, pa.string()), len(f.offsets)),
    "_kafka_partition": lambda f: pa.array(np.full(len(f.offsets), f.partition, np.int32)),
    "_kafka_offset": lambda f: pa.array(f.offsets),
    "_kafka_timestamp": lambda f: record_timestamps(f.timestamps),
    "_kafka_key": lambda f: f.keys,
}


def with_metadata_fields(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """``schema`` (a route's inferred value columns) with the ``metadata_columns`` a
    source adds to every row, so a table created for the route can hold them."""
    empty = Fetch("", 0, np.empty(0, np.int64), [], [], [], [])
    fields = [pa.field(name, _METADATA[name](empty).type) for name in columns]
    return pa.schema([*(f for f in schema if f.name not in columns), *fields])
