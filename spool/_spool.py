"""The spool: durable, per-table, append-only segments of Arrow record batches."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyarrow as pa

from ._errors import (
    SegmentCorruptError,
    SpoolClosedError,
    SpoolError,
    SpoolFullError,
    SpoolIOError,
    UnknownSegmentError,
)
from ._format import Scan, decode, encode_meta, scan
from ._fs import REAL, FileSystem
from ._incarnation import Incarnation
from ._lock import DirectoryLock
from ._names import new_segment_id, segment_id_of
from ._recovery import (
    QUARANTINE,
    REASON_SUFFIX,
    QuarantinedSegment,
    RecoveryReport,
    SegmentInfo,
    list_quarantined,
    quarantine,
    recover,
)
from ._schemas import load_schemas, newest_segment_schemas, record_schemas
from ._segment import OpenSegment

Durability = Literal["page-cache", "fsync"]
_ID_FILE = "spool-id"
_INCARNATIONS_FILE = "incarnations"
_INCARNATIONS_KEPT = 1000
_T = TypeVar("_T")
_log = logging.getLogger("icespool.spool")


@dataclass(frozen=True, slots=True)
class AppendAck:
    """Proof that a batch is in the spool (page cache or disk, per durability)."""

    segment_id: str
    batch_index: int
    bytes: int


@dataclass(frozen=True, slots=True)
class SegmentData:
    """A sealed segment read back and verified."""

    info: SegmentInfo
    batches: list[pa.RecordBatch]
    metas: list[dict[str, object] | None]


@dataclass(frozen=True, slots=True)
class TableUsage:
    bytes: int
    segments: int  # sealed plus the open one, if any


@dataclass(frozen=True, slots=True)
class SpoolStats:
    bytes: int
    segments: int
    tables: dict[str, TableUsage]
    appends: int
    fsyncs: int
    # Quarantined files stay on the same volume, so they count against max_bytes.
    quarantine_bytes: int = 0
    quarantined: int = 0


class _GroupSync:
    """Group commit for one open segment: one fsync serves every append before it.

    Each append notes the write sequence number it reached; the first waiter
    starts an fsync covering everything written so far and later waiters ride
    on it, so N concurrent appenders cost about one fsync per round, not N.
    """

    def __init__(self, sync: Callable[[], Awaitable[None]]) -> None:
        self.written = 0
        self.synced = 0
        self._sync = sync
        self._running: asyncio.Future[None] | None = None

    async def wait(self, seq: int) -> None:
        while self.synced < seq:
            if self._running is not None:
                await asyncio.shield(self._running)
                continue
            target = self.written
            running = self._running = asyncio.get_running_loop().create_future()
            try:
                await self._sync()
                self.synced = max(self.synced, target)
                running.set_result(None)
            except BaseException as exc:
                running.set_exception(exc)
                running.exception()  # the waiters re-raise it; nothing goes unretrieved
                raise
            finally:
                self._running = None

    def mark_all_synced(self) -> None:
        self.synced = self.written


@dataclass(slots=True)
class _Pending:
    batch: pa.RecordBatch
    meta: str | None
    future: asyncio.Future[AppendAck]


@dataclass(slots=True)
class _Lane:
    """Everything the spool tracks for one table."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # writes vs seal
    open: OpenSegment | None = None
    sync: _GroupSync | None = None
    sealed: dict[str, SegmentInfo] = field(default_factory=dict)  # creation order
    queue: list[_Pending] = field(default_factory=list)
    writer: asyncio.Task[None] | None = None
    sealing: set[asyncio.Task[SegmentInfo | None]] = field(default_factory=set)


class Spool:
    """Durable spool of Arrow record batches in one directory.

    Usage::

        async with Spool(path, durability="fsync", max_bytes=10 << 30) as spool:
            for info in spool.recovered.segments: ...  # commit leftovers first
            ack = await spool.append("ns.table", batch, {"offset": 42})
            info = await spool.seal("ns.table")
            data = await spool.read(info.id)
            await spool.delete(info.id)   # only once committed elsewhere

    Appends for one table are written in call order, off the event loop. An
    append returns only when its bytes are in the page cache (``page-cache``)
    or on disk (``fsync``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durability: Durability = "page-cache",
        max_bytes: int | None = None,
        segment_max_bytes: int = 128 << 20,
        io_threads: int = 8,
        fs: FileSystem | None = None,
        commit_executor: Executor | None = None,
    ) -> None:
        if durability not in ("page-cache", "fsync"):
            raise ValueError(f"durability must be 'page-cache' or 'fsync', not {durability!r}")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if segment_max_bytes <= 0:
            raise ValueError("segment_max_bytes must be positive")
        self.directory = Path(directory)
        self.durability: Durability = durability
        self.max_bytes = max_bytes
        self.segment_max_bytes = segment_max_bytes
        self.recovered = RecoveryReport()
        self._fs = fs or REAL  # tests pass one that makes the disk misbehave
        self._io_threads = io_threads
        self._executor: ThreadPoolExecutor | None = None
        # Reading sealed segments back and deleting them serve commits, not acks:
        # the owner may run them elsewhere (the daemon: its lower-priority flush
        # threads), so a flush's checksum pass and page-cache copies of a whole
        # segment never take a core from an append. None: the spool's own threads.
        self._commit_executor = commit_executor
        self._lock = DirectoryLock(self.directory)
        self._lanes: dict[str, _Lane] = {}
        self._owner: dict[str, str] = {}  # sealed segment id -> table
        self._bytes = 0
        self._quarantine_bytes = 0
        self._quarantined = 0
        self._reserved = 0
        self._appends = 0
        self._fsyncs = 0
        self._state: Literal["new", "open", "closed"] = "new"
        self._acking: set[asyncio.Task[None]] = set()
        # Each table's newest segment schema, and what the schemas file holds (_schemas.py).
        self._schemas: dict[str, pa.Schema] = {}
        self._recorded: Mapping[str, pa.Schema] = {}
        self.id = ""  # set by open(): this directory's identity (see _spool_id)
        # Set by open(): this process (see _incarnation.py), and the earlier processes
        # this directory recorded, oldest first.
        self.incarnation = Incarnation("", "-", "-", "-", 0, "-")
        self.earlier_incarnations: tuple[Incarnation, ...] = ()

    async def __aenter__(self) -> Spool:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> RecoveryReport:
        """Lock the directory and recover leftover segments (which become sealed)."""
        if self._state != "new":
            raise SpoolError("a Spool object can be opened once")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        self._executor = ThreadPoolExecutor(self._io_threads, thread_name_prefix="icespool-spool")
        try:
            self.id = await self._in_thread(_spool_id, self.directory, self._fs)
            self.recovered = await self._in_thread(recover, self.directory, self._fs)
            self.incarnation = Incarnation.current()
            self.earlier_incarnations = await self._in_thread(
                _incarnations, self.directory, self._fs, self.incarnation
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            self._lock.release()
            raise
        for info in self.recovered.segments:
            self._add_sealed(info)
            self._bytes += info.bytes
            new_segment_id.follow(info.id)
        await self._in_thread(self.quarantined)
        self._recorded = await self._in_thread(load_schemas, self.directory)
        leftovers = [(s.table, s.path) for s in self.recovered.segments]
        self._schemas = {
            **self._recorded,
            **await self._in_thread(newest_segment_schemas, leftovers),
        }
        if self._quarantined:
            _log.warning(
                "%d quarantined segment files hold %d bytes in %s; they count against "
                "spool.max_bytes until restored or removed (icespool replay --segment)",
                self._quarantined,
                self._quarantine_bytes,
                self.directory / QUARANTINE,
                extra={"quarantined": self._quarantined, "bytes": self._quarantine_bytes},
            )
        self._state = "open"
        return self.recovered

    async def close(self) -> None:
        """Seal every open segment and release the directory. Idempotent."""
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        try:
            for lane in self._lanes.values():
                if lane.writer is not None:
                    await asyncio.wait([lane.writer])
            if self._acking:
                await asyncio.wait(list(self._acking))
            for table in self._lanes:
                try:
                    await self.seal(table)
                except (OSError, SpoolIOError):
                    _log.exception("sealing %s on close failed", table)
            await self._record_schemas()
        finally:
            assert self._executor is not None
            self._executor.shutdown(wait=True)
            self._lock.release()

    async def append(
        self, table: str, batch: pa.RecordBatch, meta: Mapping[str, object] | None = None
    ) -> AppendAck:
        """Spool one batch for `table`; returns once it is durable per `durability`.

        Raises `SpoolFullError` (retriable) when the batch would pass ``max_bytes``
        (quarantined files included) and `SpoolIOError` (retriable) when the disk
        refuses it; in both cases nothing of the batch is acknowledged.
        """
        if self._state != "open":
            raise SpoolClosedError("the spool is not open")
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"append takes a pyarrow.RecordBatch, not {type(batch).__name__}")
        meta_text = encode_meta(meta)
        estimate = batch.nbytes
        if self.max_bytes is not None:
            if estimate > self.max_bytes:
                raise SpoolError(
                    f"a batch of {estimate} bytes can never fit max_bytes {self.max_bytes}; "
                    "send smaller batches or raise spool.max_bytes"
                )
            used = self._bytes + self._quarantine_bytes + self._reserved
            if used + estimate > self.max_bytes:
                raise SpoolFullError(used, estimate, self.max_bytes, self._quarantine_bytes)
        lane = self._lanes.setdefault(table, _Lane())
        future: asyncio.Future[AppendAck] = asyncio.get_running_loop().create_future()
        lane.queue.append(_Pending(batch, meta_text, future))
        if lane.writer is None:
            lane.writer = asyncio.create_task(self._write_queue(table, lane))
        self._reserved += estimate
        try:
            return await future
        finally:
            self._reserved -= estimate

    async def _write_queue(self, table: str, lane: _Lane) -> None:
        """Drain a table's queued appends in order, a group per thread hop.

        Everything queued while the previous group was being written goes out
        in the next hop, and in fsync mode one fsync (overlapping the next
        group's write) acknowledges the whole group: that is the group commit.
        """
        try:
            while lane.queue:
                schema = lane.queue[0].batch.schema
                count = 1
                while count < len(lane.queue) and lane.queue[count].batch.schema.equals(schema):
                    count += 1
                group, lane.queue[:count] = lane.queue[:count], []
                try:
                    await self._write_group(table, lane, group)
                except Exception:
                    # The group's callers got the error; later appends still get their turn.
                    _log.exception("spool write for %s failed", table)
        finally:
            lane.writer = None

    async def _write_group(self, table: str, lane: _Lane, group: list[_Pending]) -> None:
        async with lane.lock:
            segment = lane.open
            if segment is not None and (
                segment.failed is not None or not group[0].batch.schema.equals(segment.schema)
            ):
                # The schema changed, or the disk broke this segment: rotate.
                self._seal_in_background(table, lane)
                segment = None
            if segment is None:
                segment = OpenSegment(
                    self.directory,
                    table,
                    group[0].batch.schema,
                    new_segment_id(self.incarnation.tag or None),
                    self._fs,
                )
                self._schemas[table] = group[0].batch.schema
                lane.open = segment
                lane.sync = _GroupSync(functools.partial(self._fsync, segment))
            sync = lane.sync
            assert sync is not None
            first_index = segment.batches
            try:
                results = await self._in_thread(
                    segment.write_many, [(p.batch, p.meta) for p in group]
                )
            except BaseException as exc:
                for pending in group:
                    _settle(pending.future, exc)
                raise
            acks: list[tuple[_Pending, AppendAck | Exception]] = []
            index = first_index
            for pending, result in zip(group, results, strict=True):
                if isinstance(result, Exception):
                    acks.append((pending, result))
                    continue
                self._bytes += result
                self._appends += 1
                acks.append((pending, AppendAck(segment.id, index, result)))
                index += 1
            sync.written += 1
            seq = sync.written
            if segment.size >= self.segment_max_bytes or segment.failed is not None:
                self._seal_in_background(table, lane)
        if self.durability == "fsync":
            # Acknowledge after the fsync, but let the next group start writing now.
            task = asyncio.create_task(self._ack_after_sync(sync, seq, acks))
            self._acking.add(task)
            task.add_done_callback(self._acking.discard)
        else:
            for pending, outcome in acks:
                _settle(pending.future, outcome)

    async def _ack_after_sync(
        self, sync: _GroupSync, seq: int, acks: list[tuple[_Pending, AppendAck | Exception]]
    ) -> None:
        try:
            await sync.wait(seq)
        except BaseException as exc:
            for pending, _ in acks:
                _settle(pending.future, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for pending, outcome in acks:
            _settle(pending.future, outcome)

    async def seal(self, table: str) -> SegmentInfo | None:
        """Seal the table's open segment; None when it has none (nothing appended)."""
        lane = self._lanes.get(table)
        if lane is None:
            return None
        async with lane.lock:
            # Detach under the lock (the next append starts a new segment), but
            # fsync outside it so appends never wait behind a flush's seal.
            sealing = self._seal_in_background(table, lane) if lane.open else None
        if lane.sealing:
            await asyncio.wait(set(lane.sealing))
        return None if sealing is None else sealing.result()

    @property
    def schemas(self) -> Mapping[str, pa.Schema]:
        """The Arrow schema of each table's newest segment, also of segments committed
        and deleted since, in this run or (recorded at close) an earlier one."""
        return self._schemas

    async def _record_schemas(self) -> None:
        self._recorded = await self._in_thread(
            record_schemas, self.directory, dict(self._schemas), self._recorded, self._fs
        )

    def segments(self, table: str) -> list[SegmentInfo]:
        """The table's sealed, not yet deleted segments, oldest first."""
        lane = self._lanes.get(table)
        # Background seals may finish out of order; uuid7 ids sort by creation.
        return sorted(lane.sealed.values(), key=lambda s: s.id) if lane else []

    def tables(self) -> list[str]:
        return list(self._lanes)

    async def held_ids(self, table: str) -> frozenset[str]:
        """The id of every segment of ``table`` this directory holds: sealed, open,
        quarantined, and those recovery left in place (a quarantined or left file whose
        table is unknown counts for every table). Whoever records segments as committed
        by ranges of ids must never let a range cover one of these."""
        lane = self._lanes.get(table)
        held = set(lane.sealed) if lane else set()
        if lane is not None and lane.open is not None:
            held.add(lane.open.id)
        held.update(
            found
            for path, _ in self.recovered.failed
            if (found := segment_id_of(path.name)) is not None
        )
        quarantined = await self._in_thread(list_quarantined, self.directory)
        held.update(q.id for q in quarantined if q.id is not None and q.table in (table, None))
        return frozenset(held)

    def open_segment(self, table: str) -> tuple[str, int, int] | None:
        """(id, bytes, rows) of the table's open segment, if it has one."""
        lane = self._lanes.get(table)
        if lane is None or lane.open is None or lane.open.batches == 0:
            return None
        return (lane.open.id, lane.open.size, lane.open.rows)

    async def read(self, segment_id: str) -> SegmentData:
        """Read a sealed segment back, verifying every checksum.

        A segment that no longer verifies is quarantined and `SegmentCorruptError`
        raised: its records must not be committed as if they were intact.
        """
        info = self._sealed_info(segment_id)
        try:
            data = await self._for_commit(self._fs.read_bytes, info.path)
        except OSError as exc:
            raise SpoolIOError(f"reading segment {segment_id}", exc) from exc
        if not info.sealed:
            data = data[: info.bytes]  # an unsealable segment: its verified prefix only
        # Every checksum of a segment of up to segment_max_bytes: tens of ms that
        # would stall the event loop (and so every ack) at the start of each flush.
        result = await self._for_commit(scan, data)
        reason = _unverified(info, result, len(data))
        if reason is not None:
            await self._in_thread(
                quarantine, self.directory, info.path, reason, info.table, self._fs
            )
            self._forget(info)
            self._count_quarantined(1, info.bytes)
            raise SegmentCorruptError(f"segment {segment_id} failed verification: {reason}")
        decoded = await self._for_commit(decode, data, len(data))
        return SegmentData(info, decoded.batches, decoded.metas)

    async def quarantine(self, segment_id: str, reason: str) -> QuarantinedSegment:
        """Move a sealed segment its owner cannot commit to ``quarantine/``, with its reason.

        It leaves the table's queue (later segments go on) and is kept until an
        operator restores it (`restore`) or removes it.
        """
        info = self._sealed_info(segment_id)
        target = await self._in_thread(
            quarantine, self.directory, info.path, reason, info.table, self._fs
        )
        self._forget(info)
        self._count_quarantined(1, info.bytes)
        return QuarantinedSegment(segment_id, info.table, target, info.bytes, reason, time.time())

    def quarantined(self) -> list[QuarantinedSegment]:
        """Every quarantined file with its reason. Blocking (lists a directory).

        Also re-counts what quarantine holds, so files an operator removed by
        hand stop counting against ``max_bytes``.
        """
        found = list_quarantined(self.directory)
        self._quarantine_bytes = sum(q.bytes for q in found)
        self._quarantined = len(found)
        return found

    async def restore(self, segment_id: str) -> SegmentInfo:
        """Bring a quarantined segment back as sealed, once it verifies again.

        For retrying after the cause was fixed (``icespool replay --segment``).
        Raises `UnknownSegmentError` when no quarantined file has this id and
        `SegmentCorruptError` when it does not verify (it stays in quarantine).
        """
        if self._state != "open":
            raise SpoolClosedError("the spool is not open")
        found = [q for q in await self._in_thread(self.quarantined) if q.id == segment_id]
        if not found:
            raise UnknownSegmentError(f"no quarantined segment {segment_id!r}")
        info = await self._in_thread(_restore, self.directory, found[0], self._fs)
        self._add_sealed(info)
        self._bytes += info.bytes
        self._count_quarantined(-1, -info.bytes)
        return info

    async def delete(self, segment_id: str) -> None:
        """Remove a sealed segment; call only after its records are committed."""
        info = self._sealed_info(segment_id)
        await self._for_commit(_unlink, info.path, self.directory, self._fs)
        self._forget(info)

    @property
    def used_bytes(self) -> int:
        """Bytes of the spool's segments (sealed and open), as `stats` counts them,
        in O(1) (`stats` walks every table; this is asked for on every fetch)."""
        return self._bytes

    @property
    def quarantine_bytes(self) -> int:
        """Bytes of quarantined segment files as last counted (see `quarantined`)."""
        return self._quarantine_bytes

    def stats(self) -> SpoolStats:
        tables: dict[str, TableUsage] = {}
        for table, lane in self._lanes.items():
            size = sum(s.bytes for s in lane.sealed.values())
            count = len(lane.sealed)
            if lane.open is not None and lane.open.size:
                size += lane.open.size
                count += 1
            tables[table] = TableUsage(size, count)
        return SpoolStats(
            bytes=self._bytes,
            segments=sum(t.segments for t in tables.values()),
            tables=tables,
            appends=self._appends,
            fsyncs=self._fsyncs,
            quarantine_bytes=self._quarantine_bytes,
            quarantined=self._quarantined,
        )

    def _seal_in_background(self, table: str, lane: _Lane) -> asyncio.Task[SegmentInfo | None]:
        """Detach the open segment and seal it in a task (call with the lane locked).

        Appends go on into a new segment while the old one's fsync runs, instead
        of every later append waiting behind the disk.
        """
        assert lane.open is not None
        segment, sync = lane.open, lane.sync
        lane.open, lane.sync = None, None
        task = asyncio.create_task(self._seal(table, segment, sync))
        lane.sealing.add(task)
        task.add_done_callback(functools.partial(_sealed_in_background, lane, segment))
        return task

    async def _seal(
        self, table: str, segment: OpenSegment, sync: _GroupSync | None
    ) -> SegmentInfo | None:
        before = segment.size
        try:
            sealed = await self._in_thread(segment.seal)
        except SpoolIOError:
            await self._keep_prefix(segment, before)
            raise
        except BaseException:
            segment.abandon()
            raise
        if self.durability == "fsync":
            self._fsyncs += 1
        if sync is not None:
            sync.mark_all_synced()
        if not sealed:
            return None
        self._bytes += segment.size - before
        info = SegmentInfo(
            segment.id,
            table,
            segment.path,
            segment.size,
            segment.batches,
            segment.rows,
            whole=True,
        )
        self._add_sealed(info)
        return info

    async def _keep_prefix(self, segment: OpenSegment, before: int) -> None:
        """A segment the disk would not seal: commit its trusted prefix as it is.

        In fsync mode only what a successful fdatasync covered is trusted (the
        appends after it were not acked and fail); in page-cache mode every
        whole message written is. Cutting the rest frees space, and reads stop
        at the prefix, so not one more byte is needed on a full disk.
        """
        end = segment.durable if self.durability == "fsync" else segment.size
        info = await self._in_thread(_prefix_info, segment, end, self._fs)
        self._bytes += end - before
        if info is not None:
            self._add_sealed(info)

    def _add_sealed(self, info: SegmentInfo) -> None:
        lane = self._lanes.setdefault(info.table, _Lane())
        lane.sealed[info.id] = info
        self._owner[info.id] = info.table

    def _sealed_info(self, segment_id: str) -> SegmentInfo:
        table = self._owner.get(segment_id)
        if table is None:
            raise UnknownSegmentError(f"no sealed segment {segment_id!r}")
        return self._lanes[table].sealed[segment_id]

    def _count_quarantined(self, files: int, size: int) -> None:
        self._quarantined = max(0, self._quarantined + files)
        self._quarantine_bytes = max(0, self._quarantine_bytes + size)

    def _forget(self, info: SegmentInfo) -> None:
        del self._lanes[info.table].sealed[info.id]
        del self._owner[info.id]
        self._bytes -= info.bytes

    async def _fsync(self, segment: OpenSegment) -> None:
        if await self._in_thread(segment.sync):
            self._fsyncs += 1

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        # Arrow IPC encoding and file I/O block; they run in the spool's threads.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def _for_commit(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._commit_executor is None:
            return await self._in_thread(fn, *args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._commit_executor, functools.partial(fn, *args))


def _sealed_in_background(
    lane: _Lane, segment: OpenSegment, task: asyncio.Task[SegmentInfo | None]
) -> None:
    lane.sealing.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _log.error(
            "sealing segment %s failed: %s; it stays on disk and is recovered at the next start",
            segment.path.name,
            task.exception(),
        )


def _settle(future: asyncio.Future[AppendAck], outcome: AppendAck | BaseException) -> None:
    # A caller that gave up (cancelled) no longer listens; its batch is spooled anyway.
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _unverified(info: SegmentInfo, result: Scan, size: int) -> str | None:
    """Why a segment read back is not what was sealed (or kept as a prefix), else None."""
    if result.error is not None:
        return result.error
    if info.sealed:
        return None if result.clean_end else "not cleanly sealed"
    if result.good_end != size or result.batches != info.batches:
        return f"its unsealed prefix no longer holds {info.batches} whole batches"
    return None


def _spool_id(directory: Path, fs: FileSystem) -> str:
    """A uuid naming this spool directory for as long as it exists.

    Segment ids are only unique per spool; what proves that a spool's segments
    were committed is kept per spool id (the committer's committed-through mark).
    """
    path = directory / _ID_FILE
    try:
        text = path.read_text().strip()
        return str(uuid.UUID(text))
    except FileNotFoundError:
        pass
    except ValueError as exc:
        raise SpoolError(
            f"{path} does not hold a uuid ({exc}); it names this spool in the tables' "
            "commit records - restore it, or move the spool's contents to a fresh directory"
        ) from None
    value = str(uuid.uuid4())
    tmp = directory / (_ID_FILE + ".tmp")
    fs.write_file(tmp, (value + "\n").encode())
    fs.replace(tmp, path)
    fs.fsync_directory(directory)
    return value


def _incarnations(directory: Path, fs: FileSystem, current: Incarnation) -> tuple[Incarnation, ...]:
    """Record ``current`` among the incarnations of this directory; return the earlier ones.

    An incarnation's tag is part of every data file name it writes: the orphan sweep
    removes files of this process and of earlier incarnations that have provably ended,
    never others'. The list keeps its last `_INCARNATIONS_KEPT` entries (an older
    incarnation's leftovers are then left alone, never mistaken for another's). A
    volume that cannot take the write (full) still starts: this incarnation's files
    are then only known as its own while it runs."""
    path = directory / _INCARNATIONS_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    earlier = [found for line in lines if (found := Incarnation.parse(line)) is not None]
    earlier = earlier[-(_INCARNATIONS_KEPT - 1) :]
    try:
        tmp = directory / (_INCARNATIONS_FILE + ".tmp")
        text = "".join(f"{i.record}\n" for i in [*earlier, current])
        fs.write_file(tmp, text.encode())
        fs.replace(tmp, path)
        fs.fsync_directory(directory)
    except OSError as exc:
        _log.warning(
            "could not record %s in %s (%s): its data files are swept as orphans only "
            "while it runs",
            current.describe(),
            path,
            exc,
        )
    return tuple(earlier)


def _restore(directory: Path, entry: QuarantinedSegment, fs: FileSystem) -> SegmentInfo:
    data = fs.read_bytes(entry.path)
    result = scan(data)
    if result.error is not None or not result.clean_end or result.table is None:
        raise SegmentCorruptError(
            f"quarantined segment {entry.id} does not verify "
            f"({result.error or 'not cleanly sealed'}); it stays in {entry.path.parent}"
        )
    assert entry.id is not None
    rows = sum(b.num_rows for b in decode(data, len(data)).batches)
    target = directory / entry.path.name
    fs.replace(entry.path, target)
    with contextlib.suppress(FileNotFoundError):
        fs.unlink(directory / QUARANTINE / (entry.path.name + REASON_SUFFIX))
    fs.fsync_directory(directory)
    fs.fsync_directory(directory / QUARANTINE)
    return SegmentInfo(
        entry.id, result.table, target, len(data), result.batches, rows, whole=result.whole
    )


def _unlink(path: Path, directory: Path, fs: FileSystem) -> None:
    try:
        fs.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SpoolIOError(f"deleting segment {path.name}", exc) from exc
    try:
        fs.fsync_directory(directory)
    except OSError as exc:
        # The file is gone for this process. Should it come back after a crash,
        # its owner finds it already committed (segment ids are recorded).
        _log.warning("deleting %s is not yet durable: %s", path.name, exc)


def _prefix_info(segment: OpenSegment, end: int, fs: FileSystem) -> SegmentInfo | None:
    """Cut an unsealable segment to `end` and describe that prefix (None: nothing kept)."""
    segment.keep_prefix(end)
    try:
        if end == 0:
            fs.unlink(segment.path)  # holds nothing acked
            return None
        data = fs.read_bytes(segment.path)[:end]
        result = scan(data)
        if result.error is not None or result.good_end != end or result.table is None:
            raise SpoolIOError(f"re-reading segment {segment.path.name}: {result.error}")
    except (OSError, SpoolIOError) as exc:
        _log.error(
            "segment %s could not be sealed nor re-read (%s); recovery at the next start "
            "commits what verifies",
            segment.path.name,
            exc,
        )
        return None
    rows = sum(b.num_rows for b in decode(data, end).batches)
    _log.error(
        "segment %s could not be sealed; its %d verified batches are committed from the "
        "unsealed file",
        segment.path.name,
        result.batches,
    )
    return SegmentInfo(segment.id, segment.table, segment.path, end, result.batches, rows, False)
