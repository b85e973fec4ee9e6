"""What a decoder gives: rows in the table's schema, the records that failed and why,
and what the table's schema would need for them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode._records import Binary, Records
from icespool.errors import SchemaError
from icespool.schema import conform

__all__ = [
    "DeadRecord",
    "Decoded",
    "EvolveRequest",
    "RowReader",
    "Rows",
    "with_source_columns",
]


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """A record that goes to the dead-letter destination instead of its table."""

    index: int  # position in the records
    # short label for metrics: invalid, oversized, empty, unknown_route, table_limit,
    # too_deep, bad_utf8, out_of_range, unparseable
    reason: str
    error: str
    column: str | None = None  # the column at fault, when one is


@dataclass(slots=True)
class Decoded:
    """``batch``: the rows decoded, in the table's schema (None: none); ``rows``: the
    position of the record each row came from, ascending; ``dead``: the records that
    failed (lenient decoders). ``error``: an all-or-nothing decoder's failure that a
    schema change may fix (a column it could not decode; other failures are raised);
    the caller raises it when no change does."""

    batch: pa.RecordBatch | pa.Table | None
    rows: npt.NDArray[np.int64]
    dead: list[DeadRecord] = field(default_factory=list)
    # Columns the records' own schemas (Debezium's Kafka Connect schemas) declare that
    # the table lacks or holds narrower, with their exact types: what to evolve it for.
    declared: pa.Schema | None = None
    error: SchemaError | None = None

    @classmethod
    def whole(cls, batch: pa.RecordBatch | pa.Table) -> Decoded:
        """Every row of an all-or-nothing input (one record: an HTTP body)."""
        return cls(batch, np.zeros(batch.num_rows, np.int64))

    @classmethod
    def refused(cls, error: SchemaError) -> Decoded:
        """An all-or-nothing input that failed on a column."""
        return cls(None, np.empty(0, np.int64), error=error)

    def placed(self, positions: npt.NDArray[np.int64]) -> Decoded:
        """This decode of the records at ``positions`` (of a larger set), with its rows
        and dead records at their positions in that set."""
        dead = [replace(d, index=int(positions[d.index])) for d in self.dead]
        return Decoded(self.batch, positions[self.rows], dead, self.declared, self.error)


@dataclass(frozen=True, slots=True)
class EvolveRequest:
    """What a decode that failed asks of the table's schema.

    ``columns``: the columns the decode failed on; ``incoming``: the input's own Arrow
    schema (blocking: inferred from JSON); ``exact``: the input's types are exact
    (Arrow data: the table evolves for all of ``incoming`` at once), not inferred (JSON:
    it evolves for the failed columns and the top-level columns it lacks).
    """

    columns: frozenset[str]
    incoming: Callable[[], pa.Schema]
    exact: bool


#: Rows read from some of the values: (table of the good ones in order, their
#: positions, dead records by position).
Rows: TypeAlias = tuple[pa.Table | None, npt.NDArray[np.int64], list[DeadRecord]]
#: Reads the values (or keys) at ``positions`` into rows of a schema.
RowReader: TypeAlias = Callable[[Binary, npt.NDArray[np.int64], pa.Schema], Rows]


def with_source_columns(
    table: pa.Table, records: Records, schema: pa.Schema, columns: Sequence[str]
) -> pa.RecordBatch:
    """``table`` (the decoded values' columns of ``records``) with the ``columns`` the
    source adds to each row, as one batch in ``schema``."""
    for name in columns:
        table = table.append_column(name, records.source_column(name))
    return conform(table, schema)
