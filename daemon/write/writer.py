"""One writer per Iceberg table: acks via the spool, commits one snapshot per flush.

Data path of a table::

    append/queue -> conform to the table's Arrow schema -> spool append (= ack)
    trigger (records | bytes | age | manual | shutdown | close | recovery | pressure)
      -> job on the table's encode-pool lane: seal, read segments back, encode
         Parquet, ONE append snapshot naming the segments, delete them.

The lane runs one job of this table at a time (FIFO), so commits of a table never
race each other, while other tables' jobs run on other workers.

The append/queue half (acks, pending counts, triggers) is `icespool.write.queue`;
this module is the flush job: seal, read back, encode, commit, quarantine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table

from icespool.cdc import OP_COLUMN, last_changes
from icespool.errors import (
    BadInputError,
    CatalogError,
    CommitError,
    IcespoolError,
)
from icespool.iceberg import (
    DELETE_FILE_MARK,
    CommitRejectedError,
    CommitResult,
    check_upsert_layout,
    commit_files,
    committed_marks,
    encode_data_files,
    encode_equality_deletes,
    refresh_table,
    remove_files,
    unavailable,
)
from icespool.runtime.retry import Backoff, retry_async
from icespool.source_claims import Claims, ClaimsMovedError
from icespool.spool import (
    SegmentCorruptError,
    SegmentData,
    SegmentInfo,
    SpoolIOError,
)
from icespool.write.encode_pool import in_flush_thread
from icespool.write.queue import TableQueue

__all__ = ["SEGMENT_ATTEMPTS", "FlushResult", "TableWriter", "UncommittableSegmentError"]

_log = logging.getLogger("icespool.writer")
# A failed flush is retried from about a second up to a minute apart (the spool keeps
# every record meanwhile).
_FLUSH_RETRY = Backoff(attempts=1, base=1.0, cap=60.0)
# unavailable()'s answer -> the cause label of icespool_flush_errors_total.
_FLUSH_CAUSES = {"the catalog": "catalog", "the object store": "object_store"}
# Re-filtering after another replica committed overlapping source positions converges
# quickly (each round sees more of its commits); more rounds mean a livelock bug.
_REFILTER_ATTEMPTS = 5
# Names of the data files this process committed, per table, that it remembers (the
# orphan sweep keeps such a file if the table loses it: daemon/maintenance/_orphans.py).
# Far more than one orphan interval's commits at any sane rate; 100 bytes each.
_REMEMBERED_FILES = 100_000
# Flushes a segment may fail through its own fault before it is quarantined: a
# few, so a schema change racing the encode does not quarantine good data, but
# bounded, so one bad segment never holds its table back for long.
SEGMENT_ATTEMPTS = 3


class UncommittableSegmentError(CommitError):
    """The segments' own rows cannot go into the table (encode error, a value or
    shape the table rejects), as opposed to the catalog or storage failing.

    ``kind`` is a short label for metrics (``schema``, ``encode``, ``rejected``,
    ``metadata``); ``claims`` what the segments' rows claim (source positions),
    withheld if the segments end in quarantine.
    """

    def __init__(self, message: str, *, kind: str, claims: Claims | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.claims = claims


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What one flush committed. ``snapshot_id`` is None when nothing was pending."""

    table: str
    reason: str
    snapshot_id: int | None
    records: int
    files: int = 0
    bytes: int = 0
    duration_ms: float = 0.0
    segments: tuple[str, ...] = ()
    already_committed: bool = False
    quarantined: tuple[str, ...] = ()
    # Attempts of the commit the catalog refused because another writer committed first.
    conflicts: int = 0


class TableWriter(TableQueue):
    """Ingest for one Iceberg table. Create through the daemon's service.

    Appends, triggers and the pending-record accounting are `TableQueue`'s; this
    class runs the flush jobs those queue on the table's lane.
    """

    async def replay(self, info: SegmentInfo) -> FlushResult:
        """Commit a segment just restored from quarantine (with whatever else is pending).

        An operator asked for this one attempt: if the segment still cannot be
        committed, it goes straight back to quarantine with the new reason
        (``FlushResult.quarantined`` names it).
        """
        self.adopt([info])
        self._strikes[info.id] = SEGMENT_ATTEMPTS - 1
        return await self.flush("replay")

    # ------------------------------------------------------------------ the flush job

    async def _flush_job(self) -> FlushResult:
        reason = self._queued_reason
        self._queued_flush = None  # from here on, new triggers queue a new job
        self._flushing = True
        started = time.perf_counter()
        try:
            seal_error: SpoolIOError | None = None
            try:
                await self._spool.seal(self.name)
            except SpoolIOError as exc:
                # Commit what IS sealed first (deleting it frees the space the seal
                # lacked); the seal failure is still this flush's failure.
                seal_error = exc
            result = FlushResult(self.name, reason, None, 0)
            segments = self._spool.segments(self.name)
            self._take(segments)
            while segments:
                chunk = _take_chunk(segments, self.settings.max_batch_bytes)
                segments = segments[len(chunk) :]
                result = _combine(result, await self._commit_chunk(chunk, reason, started))
                if segments:
                    _log.info(
                        "%s: %d more segments to commit (%s)",
                        self.name,
                        len(segments),
                        reason,
                        extra={"table": self.name, "segments_left": len(segments)},
                    )
            if seal_error is not None:
                raise seal_error
        except Exception as exc:
            self._failures += 1
            self.degraded = str(exc)
            self._metrics.table_degraded.labels(table=self.name).set(1)
            delay = _FLUSH_RETRY.delay(self._failures)
            self._retry_at = time.monotonic() + delay
            self._metrics.commit_failures.labels(table=self.name).inc()
            cause = _FLUSH_CAUSES.get(unavailable(exc) or "", "other")
            self._metrics.flush_errors.labels(table=self.name, cause=cause).inc()
            _log.error(
                "%s: flush (%s) failed, retrying in %.1fs; the spool keeps every record: %s",
                self.name,
                reason,
                delay,
                exc,
                extra={"table": self.name, "reason": reason, "error": str(exc)},
            )
            if isinstance(exc, IcespoolError | SpoolIOError):
                raise  # already say what failed and what to do
            # Say what failed instead of a raw library error (HTTP: 503, not 500).
            raise CommitError(
                f"flush of {self.name} failed ({type(exc).__name__}: {exc}); the spool keeps "
                f"every record and the daemon retries in {delay:.0f}s"
            ) from exc
        finally:
            self._flushing = False
            self._taken.clear()  # what did not commit triggers again (after _retry_at)
        self._failures = 0
        self._retry_at = 0.0
        self.degraded = None
        self._metrics.table_degraded.labels(table=self.name).set(0)
        return result

    async def _commit_chunk(
        self, chunk: list[SegmentInfo], reason: str, started: float
    ) -> FlushResult:
        """Commit ``chunk`` in one snapshot; isolate a segment that cannot be committed.

        A segment's own fault (its rows cannot be encoded or the table rejects
        them) fails its flushes ``SEGMENT_ATTEMPTS`` times, then it is quarantined
        and the table goes on with later segments. To find the guilty segment of a
        chunk, its segments are committed one by one. Any other failure (catalog,
        storage, conflicts) propagates: the flush is retried with backoff forever.
        """
        try:
            return await self._commit_segments(chunk, reason, started)
        except UncommittableSegmentError as fault:
            if len(chunk) == 1:
                return await self._strike(chunk[0], fault, reason)
            _log.warning(
                "%s: %s; committing the %d segments of the chunk one by one",
                self.name,
                fault,
                len(chunk),
                extra={"table": self.name, "segments": len(chunk)},
            )
        # Segments the failed attempt found committed (or corrupt) have left the spool.
        spooled = {s.id for s in self._spool.segments(self.name)}
        result = FlushResult(self.name, reason, None, 0)
        for info in chunk:
            if info.id in spooled:
                result = _combine(result, await self._commit_chunk([info], reason, started))
        return result

    async def _strike(
        self, info: SegmentInfo, fault: UncommittableSegmentError, reason: str
    ) -> FlushResult:
        strikes = self._strikes[info.id] = self._strikes.get(info.id, 0) + 1
        if strikes < SEGMENT_ATTEMPTS:
            raise UncommittableSegmentError(
                f"{fault} (attempt {strikes} of {SEGMENT_ATTEMPTS}; then the segment is "
                "quarantined and later segments go on)",
                kind=fault.kind,
                claims=fault.claims,
            ) from fault
        await self._spool.quarantine(info.id, str(fault))
        if fault.claims is not None:
            # Never recorded as held: a restart or a replay re-reads / commits them.
            fault.claims.withhold()
        self._settled(info)
        self._metrics.quarantined_segments.inc()  # what the quarantine alert watches
        self._metrics.uncommittable_segments.labels(table=self.name, reason=fault.kind).inc()
        _log.error(
            "%s: segment %s (%d records) quarantined after %d attempts: %s; fix the cause, "
            "then `icespool replay --segment %s`",
            self.name,
            info.id,
            info.rows,
            strikes,
            fault,
            info.id,
            extra={"table": self.name, "segment": info.id, "error": str(fault)},
        )
        return FlushResult(self.name, reason, None, 0, quarantined=(info.id,))

    async def _commit_segments(
        self, chunk: list[SegmentInfo], reason: str, started: float
    ) -> FlushResult:
        ids = [s.id for s in chunk]
        marks = await asyncio.to_thread(self._committed_marks, ids)
        self._sync_schema()  # columns renamed or dropped elsewhere apply from now on
        fresh: list[SegmentInfo] = []
        for info in chunk:
            mark = marks.get(info.id)
            if mark is not None and (mark[1] is None or mark[1] >= info.rows):
                # Committed before a crash (or by a copy of this spool), not yet deleted:
                # never commit twice.
                snapshot = mark[0]
                _log.warning(
                    "%s: segment %s already in snapshot %s; deleting it from the spool",
                    self.name,
                    info.id,
                    snapshot if snapshot >= 0 else "(expired since; the table's properties say so)",
                    extra={"table": self.name, "segment": info.id},
                )
                await self._spool.delete(info.id)
                self._settled(info)
            else:
                fresh.append(info)
        if not fresh:
            return FlushResult(self.name, reason, None, 0, already_committed=bool(marks))
        readable: list[SegmentData] = []
        for info in fresh:
            try:
                readable.append(await self._spool.read(info.id))
            except SegmentCorruptError:
                self._metrics.quarantined_segments.inc()
                self._settled(info)
        if not readable:
            return FlushResult(self.name, reason, None, 0)
        seg_ids = [data.info.id for data in readable]

        async def filter_again(number: int, exc: BaseException, _: float) -> None:
            nonlocal marks
            _log.warning("%s: %s; filtering again", self.name, exc)
            marks = await asyncio.to_thread(self._committed_marks, seg_ids)

        outcome = await retry_async(
            lambda: self._encode_and_commit(readable, marks, reason),
            attempts=_REFILTER_ATTEMPTS,
            retryable=ClaimsMovedError,
            pause=lambda *_: 0.0,
            on_retry=filter_again,
        )
        if outcome is None:  # every row was already in the table
            for data in readable:
                await self._spool.delete(data.info.id)
                self._settled(data.info)
            return FlushResult(self.name, reason, None, 0)
        commit, files, records = outcome
        if not commit.already_committed:
            self._remember(files)
        if commit.unknown_outcomes:
            self._metrics.commit_unknown_outcomes.labels(table=self.name).inc(
                commit.unknown_outcomes
            )
        for data in readable:
            await self._spool.delete(data.info.id)
            self._settled(data.info)
        duration_ms = (time.perf_counter() - started) * 1000
        result = FlushResult(
            table=self.name,
            reason=reason,
            snapshot_id=commit.snapshot_id,
            records=records,
            files=commit.files,
            bytes=commit.bytes,
            duration_ms=round(duration_ms, 1),
            segments=tuple(seg_ids),
            already_committed=commit.already_committed,
            conflicts=commit.conflicts,
        )
        self._record(result, files)
        return result

    async def _encode_and_commit(
        self,
        segments: list[SegmentData],
        marks: Mapping[str, tuple[int, int | None]],
        reason: str,
    ) -> tuple[CommitResult, list[Any], int] | None:
        """Encode and commit the rows the table does not hold yet (None: all held)."""
        claims = self._claims()
        seg_ids = [data.info.id for data in segments]
        batches: list[pa.RecordBatch] = []
        metas: list[dict[str, object] | None] = []
        spans: dict[str, tuple[int, int]] = {}
        for data in segments:
            # A copy of this spool may have committed the first part of a segment that
            # grew here afterwards: commit the rest (claims drop positioned rows).
            mark = marks.get(data.info.id)
            start = (mark[1] or 0) if mark is not None else 0
            kept, kept_metas, total = _skip_rows(data, start, claims.positional)
            batches.extend(kept)
            metas.extend(kept_metas)
            spans[data.info.id] = (min(start, total), total)
            if start:
                _log.warning(
                    "%s: segment %s has %d of its %d records in the table already (committed "
                    "by a copy of this spool); committing the other %d",
                    self.name,
                    data.info.id,
                    start,
                    total,
                    max(0, total - start),
                    extra={"table": self.name, "segment": data.info.id},
                )
        # The table was refreshed just before (segment check or ClaimsMovedError).
        try:
            rows = claims.filter(batches, metas, self._table.metadata.properties)
        except CommitError as exc:
            raise UncommittableSegmentError(
                f"{_segments_text(seg_ids)} of {self.name}: {exc}", kind="metadata"
            ) from exc
        if not rows:
            return None
        encode_started = time.perf_counter()
        try:
            files = await in_flush_thread(self._encode, rows, self._file_prefix(seg_ids[0]))
        except (CatalogError, OSError, MemoryError):
            raise  # storage or the machine, not the rows: retried with backoff
        except Exception as exc:
            if unavailable(exc) is not None:
                # The store, in an error type of its own SDK (Azure's, or adlfs's
                # RuntimeError around one): retried with backoff, never quarantined.
                raise
            raise UncommittableSegmentError(
                f"{_segments_text(seg_ids)} of {self.name} cannot be encoded for the table's "
                f"current schema: {type(exc).__name__}: {exc}",
                kind="schema" if isinstance(exc, BadInputError) else "encode",
                claims=claims,
            ) from exc
        self._metrics.encode_duration.labels(table=self.name).observe(
            time.perf_counter() - encode_started
        )
        if not files:
            return None
        if (refusal := self._commit_refusal()) is not None:
            await in_flush_thread(remove_files, self._table, files)  # never committed
            raise CommitError(refusal)
        try:
            commit = await in_flush_thread(
                commit_files,
                self._table,
                files,
                segment_ids=seg_ids,
                summary={"icespool.reason": reason, **claims.summary()},
                update_properties=claims.properties,
                spool_id=self._spool.id,
                segment_spans=spans,
            )
        except CommitError as exc:
            # A commit that fails had its conflicts too (a landed one: `_record`).
            if exc.conflicts:
                self._metrics.commit_conflicts.labels(table=self.name).inc(exc.conflicts)
            if isinstance(exc, ClaimsMovedError):
                # Raised before anything was sent: these files are never committed (the
                # next round encodes what is left), and no snapshot will name their rows.
                await in_flush_thread(remove_files, self._table, files)
            if isinstance(exc, CommitRejectedError):
                raise UncommittableSegmentError(
                    f"{_segments_text(seg_ids)} of {self.name}: {exc}",
                    kind="rejected",
                    claims=claims,
                ) from exc
            raise
        return commit, files, sum(b.num_rows for b in rows)

    def _encode(self, rows: list[pa.RecordBatch], prefix: str) -> list[Any]:
        """The files of one commit (blocking). An upsert table's rows are changes:
        the last change per key wins, its upserts become data files, and every key
        touched gets an equality delete (files ``{prefix}-eq-...``), so every older row
        of the key goes while the ones added in the same snapshot stay."""
        s = self.settings
        size = (s.target_file_size, s.row_group_records, s.compression)
        if not self.key:
            if any(OP_COLUMN in batch.schema.names for batch in rows):
                # Spooled while the table had a key: appending them would turn deletes
                # into rows. The segment's strikes quarantine it, naming the fix.
                raise BadInputError(
                    f"the spooled rows are keyed changes ({OP_COLUMN}), but table "
                    f"{self.name} has no key now; restore its [[tables]] key and replay"
                )
            return _encode_rows(self._table, rows, prefix, *size)
        # Another writer may have repartitioned the table: deletes that would miss
        # rows hold the table back (retried, nothing quarantined) instead.
        check_upsert_layout(self._table, self.key, self.name)
        resolved = last_changes(rows, self.arrow_schema, self.key)
        data = _encode_rows(self._table, resolved.upserts.to_batches(), prefix, *size)
        try:
            deletes = encode_equality_deletes(
                self._table,
                resolved.keys.to_batches(),
                self.key,
                target_file_size=s.target_file_size,
                row_group_records=s.row_group_records,
                compression=s.compression,
                file_prefix=f"{prefix}{DELETE_FILE_MARK}",
            )
        except BaseException:
            remove_files(self._table, data)  # written by this attempt, never committed
            raise
        return [*data, *deletes]

    def _committed_marks(self, ids: list[str]) -> dict[str, tuple[int, int | None]]:
        refresh_table(self._table)
        return committed_marks(self._table, ids, self._spool.id)

    def _file_prefix(self, segment_id: str) -> str:
        """Data file names of a commit: its first segment's id, then this process's
        incarnation, so that no two processes ever write a file of the same name (a
        copy of this spool encodes the same segments) and the orphan sweep can tell
        this spool's files from other writers'."""
        return f"{segment_id}-{self._spool.incarnation.tag}"

    def committed_file(self, file_name: str) -> bool:
        """Whether this process committed the data file ``file_name`` (recently)."""
        return file_name in self._committed_files

    def _remember(self, files: Sequence[Any]) -> None:
        for data_file in files:
            self._committed_files[data_file.file_path.rsplit("/", 1)[-1]] = None
        while len(self._committed_files) > _REMEMBERED_FILES:
            self._committed_files.popitem(last=False)

    def _record(self, result: FlushResult, files: Sequence[Any]) -> None:
        m = self._metrics
        m.records_committed.labels(table=self.name).inc(result.records)
        self.committed_records += result.records
        m.commits.labels(table=self.name, reason=result.reason).inc()
        m.commit_conflicts.labels(table=self.name).inc(result.conflicts)
        self.cadence.committed(result.conflicts, self.settings.batch_timeout)
        m.batch_timeout_stretch.labels(table=self.name).set(self.cadence.stretch)
        m.commit_duration.labels(table=self.name).observe(result.duration_ms / 1000)
        m.last_commit.labels(table=self.name).set(time.time())
        self.last_commit_at = time.monotonic()
        for data_file in files:
            m.data_file_size.labels(table=self.name).observe(data_file.file_size_in_bytes)
        self.last_commit = result
        self.last_commit_wall = time.time()
        # The table's shape as this commit left it (O(1): no file read).
        metadata = self._table.metadata
        current = metadata.current_snapshot()
        total = current.summary.get("total-data-files") if current and current.summary else None
        m.set_table_shape(
            self.name,
            snapshots=len(metadata.snapshots),
            data_files=int(total) if total else None,
        )
        _log.info(
            "committed %s: reason=%s records=%d files=%d bytes=%d duration_ms=%.1f snapshot=%s "
            "conflicts=%d",
            self.name,
            result.reason,
            result.records,
            result.files,
            result.bytes,
            result.duration_ms,
            result.snapshot_id,
            result.conflicts,
            extra={
                "table": self.name,
                "reason": result.reason,
                "records": result.records,
                "files": result.files,
                "bytes": result.bytes,
                "duration_ms": result.duration_ms,
                "snapshot_id": result.snapshot_id,
                "conflicts": result.conflicts,
            },
        )


def _encode_rows(
    table: Table,
    rows: Sequence[pa.RecordBatch],
    prefix: str,
    target_file_size: int,
    row_group_records: int,
    compression: str,
) -> list[Any]:
    return encode_data_files(
        table,
        rows,
        target_file_size=target_file_size,
        row_group_records=row_group_records,
        compression=compression,
        file_prefix=prefix,
    )


def _combine(earlier: FlushResult, later: FlushResult) -> FlushResult:
    """One answer for a flush that committed a backlog in several snapshots."""
    quarantined = earlier.quarantined + later.quarantined
    if earlier.snapshot_id is None:
        return dataclasses.replace(later, quarantined=quarantined)
    if later.snapshot_id is None:
        return dataclasses.replace(earlier, quarantined=quarantined)
    return FlushResult(
        table=later.table,
        reason=later.reason,
        snapshot_id=later.snapshot_id,  # the newest; the others precede it
        records=earlier.records + later.records,
        files=earlier.files + later.files,
        bytes=earlier.bytes + later.bytes,
        duration_ms=later.duration_ms,
        segments=earlier.segments + later.segments,
        already_committed=earlier.already_committed and later.already_committed,
        quarantined=quarantined,
        conflicts=earlier.conflicts + later.conflicts,
    )


def _segments_text(ids: Sequence[str]) -> str:
    return f"segment {ids[0]}" if len(ids) == 1 else f"segments {', '.join(ids)}"


def _take_chunk(segments: list[SegmentInfo], max_bytes: int) -> list[SegmentInfo]:
    """Oldest segments up to ``max_bytes`` (at least one): bounds a replay's memory."""
    chunk: list[SegmentInfo] = []
    size = 0
    for info in segments:
        if chunk and size + info.bytes > max_bytes:
            break
        chunk.append(info)
        size += info.bytes
    return chunk


def _skip_rows(
    data: SegmentData, start: int, positional: Callable[[Mapping[str, object] | None], bool]
) -> tuple[list[pa.RecordBatch], list[dict[str, object] | None], int]:
    """The segment's batches without its first ``start`` records, and its record count.
    Batches whose rows the claims place by source position are kept whole: the claims
    drop the rows the table holds, and a cut batch would no longer match its positions."""
    total = sum(batch.num_rows for batch in data.batches)
    if start <= 0:
        return list(data.batches), list(data.metas), total
    batches: list[pa.RecordBatch] = []
    metas: list[dict[str, object] | None] = []
    seen = 0
    for batch, meta in zip(data.batches, data.metas, strict=True):
        cut = 0 if positional(meta) else min(batch.num_rows, max(0, start - seen))
        seen += batch.num_rows
        if cut < batch.num_rows:
            batches.append(batch.slice(cut) if cut else batch)
            metas.append(meta)
    return batches, metas, total
