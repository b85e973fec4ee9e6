"""An upsert table's way from spooled changes to a commit: the last change per key wins,
its upserts become data files, and the older rows of every key it changes are deleted
in the same snapshot.

Where those rows are is the table's key index (`icespool.cdc.KeyIndex`: key -> data
file and row position, a file of its own under the spool directory), kept ready by an
`IndexKeeper`. Each commit attempt syncs it to the snapshot the attempt builds on and
decides its changes there (`icespool.write.upsert_changes`): deletes by position, one
delete file per data file, and the writer's last small file rewritten with the new
rows, so readers apply per-file positions to a handful of files
(`icespool.iceberg.commit_upsert` decides again if another writer got there first). A
key first written by this commit has no older row: nothing is deleted for it. After
the commit the index takes its changes without reading anything back.

When the index cannot answer (being built, far behind, a file it cannot read) the
commit deletes by key instead (equality deletes, as Iceberg's upsert writers do), and
maintenance turns those into position deletes within seconds (``on_equality_deletes``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyiceberg.table import Table

from icespool.cdc import DeleteKey, IndexUnavailableError, key_values, last_changes
from icespool.config import WriterSettings
from icespool.iceberg import (
    AttemptChanges,
    CommitResult,
    UpsertResult,
    check_key_columns,
    commit_upsert,
    encode_data_files_with_rows,
    remove_files,
)
from icespool.metrics import Metrics
from icespool.write.index_keeper import IndexKeeper
from icespool.write.rows import CommitMarks, Encoded
from icespool.write.upsert_changes import (
    Detail,
    Plan,
    Tails,
    equality_changes,
    position_changes,
)

__all__ = ["UpsertRows"]

_log = logging.getLogger("icespool.writer")


class UpsertRows:
    """An upsert table's rows (`icespool.write.rows.TableRows`), with its key index."""

    def __init__(
        self,
        name: str,
        key: Sequence[str],
        *,
        index_path: Path,
        load_table: Callable[[], Table],
        metrics: Metrics,
        on_equality_deletes: Callable[[], object] = lambda: None,
    ) -> None:
        """``index_path``: the key index's file; ``load_table()``: a Table object of
        the writer's table for the index's own thread (never the flush's);
        ``on_equality_deletes()``: told (from the flush's thread) after a commit that
        deleted by key, so maintenance turns those deletes into position deletes."""
        self._name = name
        self._key = tuple(key)
        self._metrics = metrics
        self._on_equality_deletes = on_equality_deletes
        self._index = IndexKeeper(
            name, key, path=index_path, load_table=load_table, metrics=metrics
        )
        # The last small data file this writer committed per partition (its tail).
        self._tails: Tails = {}
        # What the live delete files this writer wrote delete (delete path -> positions):
        # the next commit merging them into new ones need not read them back.
        self._positions: dict[DeleteKey, np.ndarray] = {}

    def start(self, table: Table) -> None:
        """Open the key index and bring it up to date in its own thread, so it is ready
        (or nearly) by the first commit."""
        self._index.open(table)

    def status(self) -> dict[str, object] | None:
        return self._index.status()

    def close(self) -> None:
        self._index.close()

    # ------------------------------------------------------------------ encode

    def encode(
        self,
        table: Table,
        rows: list[pa.RecordBatch],
        prefix: str,
        schema: pa.Schema,
        settings: WriterSettings,
    ) -> Encoded:
        """The data files of the surviving upserts, and what each attempt needs."""
        # A key column renamed by another writer holds the table back (retried, nothing
        # quarantined): the changes cannot be resolved, and the rows are not at fault.
        check_key_columns(table, self._key, self._name)
        resolved = last_changes(rows, schema, self._key)
        written = encode_data_files_with_rows(
            table,
            resolved.upserts.to_batches(),
            target_file_size=settings.target_file_size,
            row_group_records=settings.row_group_records,
            compression=settings.compression,
            file_prefix=prefix,
        )
        plan = Plan(
            prefix=prefix,
            settings=settings,
            key=self._key,
            name=self._name,
            keys=resolved.keys,
            values=key_values(resolved.keys.columns),
            upserts=resolved.upserts,
            upsert_values=key_values(resolved.upserts.select(list(self._key)).columns),
            written=written,
            spec_id=table.metadata.default_spec_id,
        )
        return Encoded([e.file for e in written], plan)

    # ------------------------------------------------------------------ commit

    def commit(self, table: Table, encoded: Encoded, marks: CommitMarks) -> CommitResult:
        plan = encoded.plan
        if not isinstance(plan, Plan):  # pragma: no cover - encoded by this object
            raise TypeError(f"not an upsert table's encoding: {plan!r}")
        result = commit_upsert(
            table,
            lambda base: self._changes(base, plan),
            segment_ids=marks.segment_ids,
            summary=marks.summary,
            update_properties=marks.update_properties,
            spool_id=marks.spool_id,
            segment_spans=marks.spans,
            spool_segments=marks.spool_segments,
        )
        self._record(table, result, plan)
        return result.commit

    def _changes(self, table: Table, plan: Plan) -> AttemptChanges:
        """One attempt's changes, for the refreshed ``table`` it builds on."""
        attempt = next(plan.attempts)
        tails = {part: f.file_path for part, f in self._tails.items()}
        with self._index.synced(table, plan.settings.key_index_memory) as index:
            if index is not None:
                try:
                    return position_changes(table, plan, attempt, index, tails, self._positions)
                except (IndexUnavailableError, sqlite3.Error) as exc:
                    self._index.fail(f"{type(exc).__name__}: {exc}")
        return equality_changes(table, plan, attempt)

    def _record(self, table: Table, result: UpsertResult, plan: Plan) -> None:
        """Count the commit; have the index take what it changed before its next use (no
        read back); drop the encoded files the commit did not use (a rewritten tail holds
        their rows)."""
        changes = result.changes
        detail = changes.detail if changes is not None else None
        if result.commit.already_committed or changes is None:
            used: frozenset[str] = frozenset()
        elif isinstance(detail, Detail):
            used = detail.used
        else:
            used = frozenset(e.file.file_path for e in plan.written)
        remove_files(table, [e.file for e in plan.written if e.file.file_path not in used])
        if changes is None:
            return
        kind = "position" if isinstance(detail, Detail) else "equality"
        self._metrics.upsert_commits.labels(table=self._name, deletes=kind).inc()
        if not isinstance(detail, Detail):
            if len(changes.written):
                self._on_equality_deletes()
            return
        self._tails.update(detail.tails)
        for key in detail.change.dropped_deletes:
            self._positions.pop(key, None)
        self._positions.update(detail.positions)
        snapshot = table.metadata.snapshot_by_id(result.commit.snapshot_id)
        if snapshot is None:  # pragma: no cover - the commit just landed
            return
        scopes = {spec_id: spec.is_unpartitioned() for spec_id, spec in table.specs().items()}
        change, parent_id, row_ids = detail.change, result.parent_id, result.row_ids
        self._index.defer(
            lambda index: index.committed(
                snapshot.snapshot_id,
                parent_id,
                snapshot.sequence_number or 0,
                change,
                scopes,
                row_ids,
            )
        )
