"""A table's flush job: seal -> read back -> encode -> commit, and what it leaves behind.

A flush seals the table's open segment, then commits its sealed segments oldest first,
one snapshot per ``max_batch_bytes`` of them: each snapshot names its segments (never
committed twice: `icespool.iceberg.committed_marks`), then the segments leave the spool.
A segment whose own rows cannot be committed fails ``SEGMENT_ATTEMPTS`` flushes, then is
quarantined; any other failure (catalog, storage) is retried with backoff while the
spool keeps every record, and marks the table degraded until a flush succeeds.

`FlushJob` runs on the table's lane (one job of a table at a time) when its queue
(`icespool.write.queue.TableQueue`) asks; it tells the queue, its `Ledger`, which
segments it takes and which left the spool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from pyiceberg.table import Table

from icespool.config import WriterSettings
from icespool.errors import BadInputError, CatalogError, CommitError, IcespoolError
from icespool.iceberg import (
    CommitRejectedError,
    CommitResult,
    SpoolSegments,
    committed_marks,
    refresh_table,
    remove_files,
    unavailable,
)
from icespool.metrics import Metrics
from icespool.runtime.retry import Backoff, retry_async
from icespool.source_claims import Claims, ClaimsFactory, ClaimsMovedError
from icespool.spool import SegmentCorruptError, SegmentData, SegmentInfo, Spool, SpoolIOError
from icespool.write.encode_pool import in_flush_thread
from icespool.write.result import FlushResult
from icespool.write.rows import CommitMarks, Encoded, TableRows

__all__ = ["SEGMENT_ATTEMPTS", "FlushJob", "Ledger", "UncommittableSegmentError"]

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

# A segment's committed mark: (snapshot id or -1 once expired, records committed or None).
_Marks = Mapping[str, tuple[int, int | None]]


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


class Ledger(Protocol):
    """What a flush tells of the segments it commits (`icespool.write.queue.TableQueue`)."""

    def take(self, segments: Iterable[SegmentInfo]) -> None:
        """The flush starting now commits ``segments``."""
        ...

    def settled(self, info: SegmentInfo) -> None:
        """The segment left the spool (committed or quarantined)."""
        ...


@dataclass(frozen=True, slots=True)
class _Run:
    """One flush: why, since when (``time.perf_counter()``), and whom it tells."""

    reason: str
    started: float
    ledger: Ledger


class FlushJob:
    """One table's flushes, and their outcome: the last commit, the failure state."""

    def __init__(
        self,
        name: str,
        table: Table,
        spool: Spool,
        metrics: Metrics,
        *,
        rows: TableRows,
        settings: Callable[[], WriterSettings],
        sync_schema: Callable[[], pa.Schema],
        on_commit: Callable[[FlushResult], None],
        claims: ClaimsFactory,
        commit_refusal: Callable[[], str | None],
    ) -> None:
        """``settings()``: the table's current settings; ``sync_schema()``: adopts the
        table's current schema (just refreshed) and returns the Arrow schema to encode
        with; ``on_commit(result)``: told of every snapshot that lands, before it is
        logged; ``claims()``: what a commit claims besides its rows;
        ``commit_refusal()``: why this process must not commit now (None: it may)."""
        self.name = name  # also how a stuck blocking call names its table
        self._table = table
        self._spool = spool
        self._metrics = metrics
        self._rows = rows
        self._settings = settings
        self._sync_schema = sync_schema
        self._on_commit = on_commit
        self._claims = claims
        self._commit_refusal = commit_refusal
        self._failures = 0
        self.retry_at = 0.0  # time.monotonic() before which triggers wait
        self._strikes: dict[str, int] = {}  # segment id -> flushes it failed by its own fault
        self.degraded: str | None = None  # why the last flush failed; None once one succeeds
        self.last_commit: FlushResult | None = None
        # Records this process committed for the table (what
        # icespool_records_committed_total counts), for totals read without the registry.
        self.committed_records = 0
        # When the last commit happened (None before the first): monotonic for ages
        # (immune to wall-clock steps), wall clock for /v1/status's "at".
        self.last_commit_at: float | None = None
        self.last_commit_wall: float | None = None
        self._committed_files: OrderedDict[str, None] = OrderedDict()

    def start(self) -> None:
        """Prepare the table's first commit (an upsert table's key index)."""
        self._rows.start(self._table)

    def close(self) -> None:
        """The table commits no more: release what its rows hold (the key index)."""
        self._rows.close()

    @property
    def key_index(self) -> dict[str, object] | None:
        """An upsert table's key index as /v1/status shows it (None: an append table)."""
        return self._rows.status()

    def last_chance(self, segment_id: str) -> None:
        """The segment's next failure by its own fault quarantines it (an operator's
        replay of a quarantined segment is one attempt)."""
        self._strikes[segment_id] = SEGMENT_ATTEMPTS - 1

    def committed_file(self, file_name: str) -> bool:
        """Whether this process committed the data file ``file_name`` (recently)."""
        return file_name in self._committed_files

    # ------------------------------------------------------------------ one flush

    async def run(self, reason: str, ledger: Ledger) -> FlushResult:
        """Seal and commit what the table has spooled; tell ``ledger`` of its segments."""
        flush = _Run(reason, time.perf_counter(), ledger)
        try:
            result = await self._commit_spooled(flush)
        except Exception as exc:
            delay = self._failed(exc, reason)
            if isinstance(exc, IcespoolError | SpoolIOError):
                raise  # already say what failed and what to do
            # Say what failed instead of a raw library error (HTTP: 503, not 500).
            raise CommitError(
                f"flush of {self.name} failed ({type(exc).__name__}: {exc}); the spool keeps "
                f"every record and the daemon retries in {delay:.0f}s"
            ) from exc
        self._failures = 0
        self.retry_at = 0.0
        self.degraded = None
        self._metrics.table_degraded.labels(table=self.name).set(0)
        return result

    async def _commit_spooled(self, flush: _Run) -> FlushResult:
        seal_error: SpoolIOError | None = None
        try:
            await self._spool.seal(self.name)
        except SpoolIOError as exc:
            # Commit what IS sealed first (deleting it frees the space the seal
            # lacked); the seal failure is still this flush's failure.
            seal_error = exc
        result = FlushResult(self.name, flush.reason, None, 0)
        segments = self._spool.segments(self.name)
        flush.ledger.take(segments)
        while segments:
            chunk = _take_chunk(segments, self._settings().max_batch_bytes)
            segments = segments[len(chunk) :]
            result = result.followed_by(await self._commit_chunk(flush, chunk))
            if segments:
                _log.info(
                    "%s: %d more segments to commit (%s)",
                    self.name,
                    len(segments),
                    flush.reason,
                    extra={"table": self.name, "segments_left": len(segments)},
                )
        if seal_error is not None:
            raise seal_error
        return result

    def _failed(self, exc: Exception, reason: str) -> float:
        """Count and log a failed flush, mark the table degraded; returns the retry delay."""
        self._failures += 1
        self.degraded = str(exc)
        self._metrics.table_degraded.labels(table=self.name).set(1)
        delay = _FLUSH_RETRY.delay(self._failures)
        self.retry_at = time.monotonic() + delay
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
        return delay

    def _settled(self, flush: _Run, info: SegmentInfo) -> None:
        self._strikes.pop(info.id, None)
        flush.ledger.settled(info)

    # ------------------------------------------------------------------ segment isolation

    async def _commit_chunk(self, flush: _Run, chunk: list[SegmentInfo]) -> FlushResult:
        """Commit ``chunk`` in one snapshot; isolate a segment that cannot be committed.

        A segment's own fault (its rows cannot be encoded or the table rejects
        them) fails its flushes ``SEGMENT_ATTEMPTS`` times, then it is quarantined
        and the table goes on with later segments. To find the guilty segment of a
        chunk, its segments are committed one by one. Any other failure (catalog,
        storage, conflicts) propagates: the flush is retried with backoff forever.
        """
        try:
            return await self._commit_segments(flush, chunk)
        except UncommittableSegmentError as fault:
            if len(chunk) == 1:
                return await self._strike(flush, chunk[0], fault)
            _log.warning(
                "%s: %s; committing the %d segments of the chunk one by one",
                self.name,
                fault,
                len(chunk),
                extra={"table": self.name, "segments": len(chunk)},
            )
        # Segments the failed attempt found committed (or corrupt) have left the spool.
        spooled = {s.id for s in self._spool.segments(self.name)}
        result = FlushResult(self.name, flush.reason, None, 0)
        for info in chunk:
            if info.id in spooled:
                result = result.followed_by(await self._commit_chunk(flush, [info]))
        return result

    async def _strike(
        self, flush: _Run, info: SegmentInfo, fault: UncommittableSegmentError
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
        self._settled(flush, info)
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
        return FlushResult(self.name, flush.reason, None, 0, quarantined=(info.id,))

    # ------------------------------------------------------------------ one snapshot

    async def _commit_segments(self, flush: _Run, chunk: list[SegmentInfo]) -> FlushResult:
        marks = await asyncio.to_thread(self._committed_marks, [s.id for s in chunk])
        schema = self._sync_schema()  # columns renamed or dropped elsewhere apply from now on
        fresh: list[SegmentInfo] = []
        for info in chunk:
            if not await self._drop_committed(flush, info, marks):
                fresh.append(info)
        if not fresh:
            return FlushResult(self.name, flush.reason, None, 0, already_committed=bool(marks))
        readable = await self._read_back(flush, fresh)
        if not readable:
            return FlushResult(self.name, flush.reason, None, 0)
        seg_ids = [data.info.id for data in readable]

        async def filter_again(number: int, exc: BaseException, _: float) -> None:
            nonlocal marks
            _log.warning("%s: %s; filtering again", self.name, exc)
            marks = await asyncio.to_thread(self._committed_marks, seg_ids)

        outcome = await retry_async(
            lambda: self._encode_and_commit(readable, marks, flush.reason, schema),
            attempts=_REFILTER_ATTEMPTS,
            retryable=ClaimsMovedError,
            pause=lambda *_: 0.0,
            on_retry=filter_again,
        )
        if outcome is None:  # every row was already in the table
            await self._delete(flush, readable)
            return FlushResult(self.name, flush.reason, None, 0)
        commit, files, records = outcome
        if not commit.already_committed:
            self._remember(files)
        if commit.unknown_outcomes:
            self._metrics.commit_unknown_outcomes.labels(table=self.name).inc(
                commit.unknown_outcomes
            )
        await self._delete(flush, readable)
        result = FlushResult(
            table=self.name,
            reason=flush.reason,
            snapshot_id=commit.snapshot_id,
            records=records,
            files=commit.files,
            bytes=commit.bytes,
            duration_ms=round((time.perf_counter() - flush.started) * 1000, 1),
            segments=tuple(seg_ids),
            already_committed=commit.already_committed,
            conflicts=commit.conflicts,
        )
        self._record(result, files)
        return result

    async def _drop_committed(self, flush: _Run, info: SegmentInfo, marks: _Marks) -> bool:
        """Delete the segment from the spool if the table holds all of its rows."""
        mark = marks.get(info.id)
        if mark is None or (mark[1] is not None and mark[1] < info.rows):
            return False
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
        self._settled(flush, info)
        return True

    async def _read_back(self, flush: _Run, segments: list[SegmentInfo]) -> list[SegmentData]:
        """The segments' rows; a corrupt one is dropped (the spool quarantined it)."""
        readable: list[SegmentData] = []
        for info in segments:
            try:
                readable.append(await self._spool.read(info.id))
            except SegmentCorruptError:
                self._metrics.quarantined_segments.inc()
                self._settled(flush, info)
        return readable

    async def _delete(self, flush: _Run, segments: list[SegmentData]) -> None:
        for data in segments:
            await self._spool.delete(data.info.id)
            self._settled(flush, data.info)

    async def _encode_and_commit(
        self, segments: list[SegmentData], marks: _Marks, reason: str, schema: pa.Schema
    ) -> tuple[CommitResult, list[Any], int] | None:
        """Encode and commit the rows the table does not hold yet (None: all held)."""
        claims = self._claims()
        seg_ids = [data.info.id for data in segments]
        batches, metas, spans = self._unheld_rows(segments, marks, claims)
        # The table was refreshed just before (segment check or ClaimsMovedError).
        try:
            rows = claims.filter(batches, metas, self._table.metadata.properties)
        except CommitError as exc:
            raise UncommittableSegmentError(
                f"{_segments_text(seg_ids)} of {self.name}: {exc}", kind="metadata"
            ) from exc
        if not rows:
            return None
        encoded = await self._encode_files(rows, seg_ids, claims, schema)
        if not encoded.files and encoded.plan is None:
            return None
        files = list(encoded.files)
        if (refusal := self._commit_refusal()) is not None:
            await in_flush_thread(remove_files, self._table, files)  # never committed
            raise CommitError(refusal)
        known = await self._spool_segments(segments)
        commit = await self._commit(encoded, seg_ids, spans, claims, reason, known)
        return commit, files, sum(b.num_rows for b in rows)

    async def _spool_segments(self, segments: list[SegmentData]) -> SpoolSegments:
        """What this spool knows of the commit's segments and the table's others, for
        the spool's segment ranges in the table."""
        spool = self._spool
        ids = {data.info.id for data in segments}
        held = await spool.held_ids(self.name)
        return SpoolSegments(
            writers=frozenset(
                [spool.incarnation.tag, *(i.tag for i in spool.earlier_incarnations)]
            ),
            whole=frozenset(data.info.id for data in segments if data.info.whole),
            held=held - ids,
        )

    def _unheld_rows(
        self, segments: list[SegmentData], marks: _Marks, claims: Claims
    ) -> tuple[list[pa.RecordBatch], list[dict[str, object] | None], dict[str, tuple[int, int]]]:
        """The segments' batches and metas past the rows a copy of this spool committed,
        and each segment's span of rows this commit covers."""
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
        return batches, metas, spans

    async def _encode_files(
        self, rows: list[pa.RecordBatch], seg_ids: list[str], claims: Claims, schema: pa.Schema
    ) -> Encoded:
        """The commit's files, written; a failure the rows caused is the segments'."""
        encode_started = time.perf_counter()
        prefix = self._file_prefix(seg_ids[0])
        try:
            encoded = await in_flush_thread(
                self._rows.encode, self._table, rows, prefix, schema, self._settings()
            )
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
        return encoded

    async def _commit(
        self,
        encoded: Encoded,
        seg_ids: list[str],
        spans: Mapping[str, tuple[int, int]],
        claims: Claims,
        reason: str,
        known: SpoolSegments,
    ) -> CommitResult:
        """One snapshot of ``encoded`` naming the segments; a rejection is the segments'."""
        marks = CommitMarks(
            segment_ids=seg_ids,
            spans=spans,
            spool_id=self._spool.id,
            summary={"icespool.reason": reason, **claims.summary()},
            update_properties=claims.properties,
            spool_segments=known,
        )
        try:
            return await in_flush_thread(self._rows.commit, self._table, encoded, marks)
        except CommitError as exc:
            # A commit that fails had its conflicts too (a landed one: `_record`).
            if exc.conflicts:
                self._metrics.commit_conflicts.labels(table=self.name).inc(exc.conflicts)
            if isinstance(exc, ClaimsMovedError):
                # Raised before anything was sent: these files are never committed (the
                # next round encodes what is left), and no snapshot will name their rows.
                await in_flush_thread(remove_files, self._table, encoded.files)
            if isinstance(exc, CommitRejectedError):
                raise UncommittableSegmentError(
                    f"{_segments_text(seg_ids)} of {self.name}: {exc}",
                    kind="rejected",
                    claims=claims,
                ) from exc
            raise

    def _committed_marks(self, ids: list[str]) -> dict[str, tuple[int, int | None]]:
        refresh_table(self._table)
        return committed_marks(self._table, ids, self._spool.id)

    def _file_prefix(self, segment_id: str) -> str:
        """Data file names of a commit: its first segment's id, then this process's
        incarnation, so that no two processes ever write a file of the same name (a
        copy of this spool encodes the same segments) and the orphan sweep can tell
        this spool's files from other writers'."""
        return f"{segment_id}-{self._spool.incarnation.tag}"

    # ------------------------------------------------------------------ after a commit

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
        self._on_commit(result)
        m.commit_duration.labels(table=self.name).observe(result.duration_ms / 1000)
        m.last_commit.labels(table=self.name).set(time.time())
        self.last_commit_at = time.monotonic()
        for data_file in files:
            m.data_file_size.labels(table=self.name).observe(data_file.file_size_in_bytes)
        self.last_commit = result
        self.last_commit_wall = time.time()
        self._gauge_shape()
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

    def _gauge_shape(self) -> None:
        """The table's shape as the last commit left it (O(1): no file read)."""
        metadata = self._table.metadata
        current = metadata.current_snapshot()
        total = current.summary.get("total-data-files") if current and current.summary else None
        self._metrics.set_table_shape(
            self.name,
            snapshots=len(metadata.snapshots),
            data_files=int(total) if total else None,
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
