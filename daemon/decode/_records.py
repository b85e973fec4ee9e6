"""What a decoder reads: records as Arrow arrays, and the table they are decoded for.

Every source hands its records over as `Records`: one binary value per record (an
Arrow binary array: a Kafka fetch's values, or an HTTP body as one value), plus, read
only by the decoders and columns that need them, the records' keys, headers and the
columns their source adds (Kafka's metadata columns). A Kafka fetch
(`icespool.kafka._fetch.Fetch`) is such records itself, reading its keys and headers
from the client's records only when asked; `RecordArrays` is the plain kind (HTTP
bodies, tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode._plan import JsonOptions
from icespool.schema import Policy

__all__ = ["Binary", "RecordArrays", "Records", "Target", "binary_array"]

#: Values or keys of records (large_binary only past 2 GiB of bytes).
Binary: TypeAlias = pa.BinaryArray | pa.LargeBinaryArray
#: Per record, its headers as (name, bytes) pairs.
Headers: TypeAlias = Sequence[Sequence[tuple[str, bytes]]]


def binary_array(values: Binary | pa.ChunkedArray | Sequence[bytes | None]) -> Binary:
    """``values`` as one binary array (null: no bytes, a tombstone or no key). Past
    2 GiB of bytes pyarrow hands back chunks: they become one large_binary array."""
    if isinstance(values, pa.BinaryArray | pa.LargeBinaryArray):
        return values
    array = values if isinstance(values, pa.ChunkedArray) else pa.array(values, pa.binary())
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return binary_array(array.chunk(0))
        return pa.concat_arrays([c.cast(pa.large_binary()) for c in array.chunks])
    if not pa.types.is_binary(array.type) and not pa.types.is_large_binary(array.type):
        array = array.cast(pa.binary())
    result: Binary = array
    return result


class Records(Protocol):
    """Records in order, as whole arrays (see the module doc)."""

    @property
    def values(self) -> Binary:
        """One value per record (null: the record has none, e.g. a tombstone)."""

    @property
    def keys(self) -> Binary:
        """One key per record (null: none)."""

    @property
    def headers(self) -> Headers:
        """Per record, its headers."""

    def __len__(self) -> int: ...

    def value(self, index: int) -> bytes | None:
        """One record's value as bytes (the whole of an HTTP body, without a copy)."""

    def take(self, rows: npt.NDArray[np.int64]) -> Records:
        """The records at ``rows`` (positions), in that order."""

    def source_column(self, name: str) -> pa.Array:
        """A column the source adds to every row (e.g. ``_kafka_offset``), for these
        records; KeyError when the source has no such column."""


class RecordArrays:
    """Records given as plain values (bytes or a binary array), with optional keys,
    headers and source columns: an HTTP body is one value."""

    __slots__ = ("_columns", "_given", "_headers", "_keys", "_values")

    def __init__(
        self,
        values: Binary | Sequence[bytes | None],
        keys: Binary | Sequence[bytes | None] | None = None,
        headers: Headers | None = None,
        columns: Mapping[str, pa.Array] | None = None,
    ) -> None:
        # Bytes as given, kept for `value` (an HTTP body is never copied into Arrow).
        self._given = None if isinstance(values, pa.Array) else list(values)
        self._values = binary_array(values) if isinstance(values, pa.Array) else None
        self._keys = None if keys is None else binary_array(keys)
        self._headers = None if headers is None else list(headers)
        self._columns = dict(columns or {})

    def __len__(self) -> int:
        return len(self._given) if self._given is not None else len(self.values)

    @property
    def values(self) -> Binary:
        if self._values is None:
            self._values = binary_array(self._given or [])
        return self._values

    @property
    def keys(self) -> Binary:
        if self._keys is None:
            self._keys = binary_array(pa.nulls(len(self), pa.binary()))
        return self._keys

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = [()] * len(self)
        return self._headers

    def value(self, index: int) -> bytes | None:
        found: bytes | None = (
            self._given[index] if self._given is not None else self.values[index].as_py()
        )
        return found

    def take(self, rows: npt.NDArray[np.int64]) -> RecordArrays:
        index = pa.array(np.asarray(rows, dtype=np.int64), pa.int64())
        return RecordArrays(
            self.values.take(index),
            self.keys.take(index),
            [self.headers[i] for i in index.to_pylist()],
            {name: column.take(index) for name, column in self._columns.items()},
        )

    def source_column(self, name: str) -> pa.Array:
        return self._columns[name]


@dataclass(frozen=True, slots=True)
class Target:
    """The table records are decoded for, as a decoder needs it: its name (for
    messages), Arrow schema (empty: not created yet), key (an upsert table's), JSON
    options (timestamp units, nesting depth) and evolve policy (which schema changes
    to ask for)."""

    name: str
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    key: tuple[str, ...] = ()
    options: JsonOptions = field(default_factory=JsonOptions)
    policy: Policy = "none"
