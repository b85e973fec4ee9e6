"""How a flush turns a table's spooled rows into one commit: the part that differs between
an append table (`AppendRows`) and an upsert table (`icespool.write.upserts.UpsertRows`).

The flush job (`icespool.write.flush`) reads the segments back, drops what the table holds
already, then asks its table's rows to ``encode`` them (data files written through the
table's FileIO) and to ``commit`` what was encoded as ONE snapshot marked with the
segments. Both run in the flush's thread (blocking).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icespool.cdc import OP_COLUMN
from icespool.config import WriterSettings
from icespool.errors import BadInputError
from icespool.iceberg import (
    CommitResult,
    PropertyUpdate,
    SpoolSegments,
    commit_files,
    encode_data_files,
)

__all__ = ["AppendRows", "CommitMarks", "Encoded", "TableRows"]


@dataclass(frozen=True)
class Encoded:
    """What one flush encoded: the data ``files`` written (deleted again if the commit
    never happens) and what else its commit needs (``plan``: an upsert's keys)."""

    files: Sequence[DataFile]
    plan: object = None


@dataclass(frozen=True)
class CommitMarks:
    """What a flush's commit carries besides its files: the segments it adds and how
    much of each, the spool they come from, its summary, and the source positions it
    claims (set as table properties in the same commit), and what the spool knows of its
    segments (to add them to the spool's segment ranges in the table)."""

    segment_ids: Sequence[str]
    spans: Mapping[str, tuple[int, int]]
    spool_id: str
    summary: Mapping[str, str] = field(default_factory=dict)
    update_properties: PropertyUpdate | None = None
    spool_segments: SpoolSegments | None = None


class TableRows(Protocol):
    """A table's way from spooled rows to a commit."""

    def encode(
        self,
        table: Table,
        rows: list[pa.RecordBatch],
        prefix: str,
        schema: pa.Schema,
        settings: WriterSettings,
    ) -> Encoded:
        """Write the data files of ``rows`` (in the table's Arrow ``schema``), named
        ``{prefix}-...``; raises when the rows cannot go into the table."""
        ...

    def commit(self, table: Table, encoded: Encoded, marks: CommitMarks) -> CommitResult:
        """Commit ``encoded`` as ONE snapshot with ``marks`` (idempotent per segment)."""
        ...

    def start(self, table: Table) -> None:
        """Prepare for the table's first commit (an upsert table builds its key index)."""
        ...

    def status(self) -> dict[str, object] | None:
        """What /v1/status shows of it (None: nothing)."""
        ...

    def close(self) -> None:
        """Release what the rows hold (files, threads); the table commits no more."""
        ...


class AppendRows:
    """An append table's rows: every spooled row becomes a row of the table."""

    def __init__(self, name: str) -> None:
        self._name = name

    def encode(
        self,
        table: Table,
        rows: list[pa.RecordBatch],
        prefix: str,
        schema: pa.Schema,
        settings: WriterSettings,
    ) -> Encoded:
        if any(OP_COLUMN in batch.schema.names for batch in rows):
            # Spooled while the table had a key: appending them would turn deletes
            # into rows. The segment's strikes quarantine it, naming the fix.
            raise BadInputError(
                f"the spooled rows are keyed changes ({OP_COLUMN}), but table "
                f"{self._name} has no key now; restore its [[tables]] key and replay"
            )
        return Encoded(encode_rows(table, rows, prefix, settings))

    def commit(self, table: Table, encoded: Encoded, marks: CommitMarks) -> CommitResult:
        return commit_files(
            table,
            encoded.files,
            segment_ids=marks.segment_ids,
            summary=marks.summary,
            update_properties=marks.update_properties,
            spool_id=marks.spool_id,
            segment_spans=marks.spans,
            spool_segments=marks.spool_segments,
        )

    def start(self, table: Table) -> None:
        return None

    def status(self) -> dict[str, object] | None:
        return None

    def close(self) -> None:
        return None


def encode_rows(
    table: Table, rows: Sequence[pa.RecordBatch], prefix: str, settings: WriterSettings
) -> list[DataFile]:
    """Data files of ``rows`` sized and compressed by the table's ``settings``."""
    return encode_data_files(
        table,
        rows,
        target_file_size=settings.target_file_size,
        row_group_records=settings.row_group_records,
        compression=settings.compression,
        file_prefix=prefix,
    )
