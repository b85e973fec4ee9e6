"""Dead-letter replay: records of a dead-letter table back into their tables, once.

After the cause of dead letters is fixed (the target's schema evolved, the config
changed, a producer's bug understood), an operator replays them
(``POST /v1/tables/{dead-letter table}/replay``). Each selected dead letter is
rebuilt as the Kafka record it was (topic, partition, offset, timestamp, key, value,
headers) and walks the live path again through its source (`KafkaSource.redecode`:
route, decode with the source's format, evolve per the table's policy, all through
`icespool.write.ingest`). There is no second decode path.

Exactly once rests on the machinery live consumption uses (`icespool.kafka._offsets`),
under a key family of its own so it never meets a consumer group's ranges: rows
re-ingested into a target carry `batch_meta` with the group
``dead-letter-replay/<dead-letter table>`` and the record's original topic,
partition and offset. The target's commit records those offsets in its properties
in the same snapshot as the rows, and drops rows whose offsets it already holds.
Only then are the dead letters removed from the dead-letter table (a copy-on-write
delete on the dead-letter table's own lane). A crash between the two leaves rows
that the next replay finds held by the target (``already_present``): they are not
appended again, only removed. Records that still fail stay where they are, with the
new error in the answer; nothing about them changes.

Work is bounded: at most ``limit`` rows per call, read as a stream and handled in
chunks of `CHUNK_ROWS` rows (one target commit and one delete per chunk), and a
daemon that starts shutting down stops between chunks.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Or,
)
from pyiceberg.table import Table

from icespool.config._model import REPLAY_GROUP_PREFIX as _CONFIG_PREFIX
from icespool.errors import BackpressureError, BadInputError, ShuttingDownError
from icespool.kafka._fetch import Fetch
from icespool.kafka._offsets import Ranges, batch_meta, ranges_from_properties
from icespool.runtime.retry import retry_async
from icespool.write.writer import TableWriter

if TYPE_CHECKING:  # the Kafka client is imported only where a source is configured
    from icespool.kafka._source import KafkaSource

__all__ = [
    "CHUNK_ROWS",
    "DEFAULT_LIMIT",
    "FILTER_KEYS",
    "MAX_LIMIT",
    "REPLAY_GROUP_PREFIX",
    "DeadLetterReplay",
    "ReplayFilter",
    "ReplayResult",
    "remove_dead_letters",
    "replay_group",
]

_log = logging.getLogger("icespool.kafka.replay")

#: Replayed rows are claimed in their target under ``<prefix><dead-letter table>``
#: (the config refuses consumer groups named so).
REPLAY_GROUP_PREFIX: Final = _CONFIG_PREFIX
#: Rows one call replays when the request names no ``limit``.
DEFAULT_LIMIT: Final = 10_000
MAX_LIMIT: Final = 1_000_000
#: Rows per chunk: one target commit and one dead-letter delete each. Bounds memory
#: (values may be up to max_record_bytes each) and the work a crash repeats.
CHUNK_ROWS: Final = 1_000
_CHUNK_BYTES: Final = 64 << 20
#: Still-failing records named in one answer (all of them are counted).
_FAILURES_SHOWN: Final = 100
_APPEND_ATTEMPTS: Final = 10
_FLUSH_REASON: Final = "dead-letter-replay"
# Sentinel for a null Kafka timestamp: outside years 1-9999, so it decodes to null again.
_NO_TIMESTAMP_MS: Final = 253_402_300_800_000
_COLUMNS: Final = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "key",
    "value",
    "headers",
    "target_table",
    "reason",
)
#: The keys of a replay request's filters (the JSON body, the CLI's options).
FILTER_KEYS: Final = (
    "reason",
    "topic",
    "partition",
    "from_offset",
    "to_offset",
    "since",
    "until",
    "target_table",
    "limit",
)


def replay_group(dead_letter_table: str) -> str:
    """The claims group of records replayed from ``dead_letter_table``."""
    return f"{REPLAY_GROUP_PREFIX}{dead_letter_table}"


# ---------------------------------------------------------------------- the request


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters to replay; every field given must match (``since``
    inclusive and ``until`` exclusive, on ``dead_lettered_at``)."""

    reason: str | None = None
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    target_table: str | None = None
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_json(cls, data: object) -> ReplayFilter:
        """Read a request body (a JSON object); `BadInputError` names the bad key."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise BadInputError("the replay request must be a JSON object of filters")
        unknown = sorted(set(data) - set(FILTER_KEYS))
        if unknown:
            raise BadInputError(
                f"unknown replay filter {', '.join(map(repr, unknown))}; "
                f"filters: {', '.join(FILTER_KEYS)}"
            )
        values: dict[str, Any] = {}
        for key in ("reason", "topic", "target_table"):
            if data.get(key) is not None:
                values[key] = _text(key, data[key])
        for key in ("partition", "from_offset", "to_offset"):
            if data.get(key) is not None:
                values[key] = _count(key, data[key], minimum=0)
        for key in ("since", "until"):
            if data.get(key) is not None:
                values[key] = _instant(key, data[key])
        if data.get("limit") is not None:
            values["limit"] = _count("limit", data["limit"], minimum=1, maximum=MAX_LIMIT)
        made = cls(**values)
        first, last = made.from_offset, made.to_offset
        if first is not None and last is not None and first > last:
            raise BadInputError(
                f"from_offset {made.from_offset} is after to_offset {made.to_offset}"
            )
        if made.since is not None and made.until is not None and made.since >= made.until:
            raise BadInputError(f"since {made.since} is not before until {made.until}")
        return made

    def row_filter(self) -> BooleanExpression:
        """The dead-letter table's rows this filter selects."""
        parts: list[BooleanExpression] = []
        for name in ("reason", "topic", "partition", "target_table"):
            value = getattr(self, name)
            if value is not None:
                parts.append(_predicate(EqualTo, name, value))
        if self.from_offset is not None:
            parts.append(_predicate(GreaterThanOrEqual, "offset", self.from_offset))
        if self.to_offset is not None:
            parts.append(_predicate(LessThanOrEqual, "offset", self.to_offset))
        if self.since is not None:
            parts.append(_predicate(GreaterThanOrEqual, "dead_lettered_at", _micros(self.since)))
        if self.until is not None:
            parts.append(_predicate(LessThan, "dead_lettered_at", _micros(self.until)))
        if not parts:
            return AlwaysTrue()
        return parts[0] if len(parts) == 1 else And(*parts)

    def describe(self) -> str:
        shown = [
            f"{name}={getattr(self, name)}"
            for name in FILTER_KEYS
            if getattr(self, name) is not None
        ]
        return " ".join(shown)


def _predicate(
    kind: Callable[..., BooleanExpression], column: str, value: object
) -> BooleanExpression:
    # pyiceberg's predicates are pydantic models whose synthesized signatures the
    # pydantic mypy plugin gets wrong; their real __init__ takes (term, literal(s)).
    return kind(column, value)


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise BadInputError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _count(key: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadInputError(f"{key} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise BadInputError(f"{key} must be at most {maximum}, got {value}")
    return value


def _instant(key: str, value: object) -> datetime:
    if not isinstance(value, str):
        raise BadInputError(f"{key} must be an ISO-8601 timestamp string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadInputError(
            f"{key} {value!r} is not an ISO-8601 timestamp (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    # A timestamp without an offset means UTC, as the dead-letter table stores it.
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _micros(instant: datetime) -> int:
    delta = instant - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# ---------------------------------------------------------------------- the answer


@dataclass(slots=True)
class ReplayResult:
    """What one replay call did. ``removed`` counts dead-letter rows deleted (those
    replayed now and those a target already held from an interrupted replay)."""

    table: str
    scanned: int = 0
    replayed: int = 0
    already_present: int = 0
    still_failing: int = 0
    removed: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None

    def fail(self, topic: str, partition: int, offset: int, reason: str, error: str) -> None:
        self.still_failing += 1
        if len(self.failures) < _FAILURES_SHOWN:
            self.failures.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "reason": reason,
                    "error": error,
                }
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "scanned": self.scanned,
            "replayed": self.replayed,
            "already_present": self.already_present,
            "still_failing": self.still_failing,
            "removed": self.removed,
            "targets": dict(self.targets),
            "failures": list(self.failures),
            "interrupted": self.interrupted,
            "error": self.error,
        }


# ---------------------------------------------------------------------- the work

#: A dead letter's key: (topic, partition) -> offsets.
_Keys = dict[tuple[str, int], list[npt.NDArray[np.int64]]]


async def remove_dead_letters(
    writer: TableWriter, keys: Mapping[tuple[str, int], npt.NDArray[np.int64]], group: str
) -> bool:
    """Delete the dead letters ``keys`` names from ``writer``'s table (one commit)."""
    parts: list[BooleanExpression] = [
        And(
            _predicate(EqualTo, "topic", topic),
            _predicate(EqualTo, "partition", partition),
            _predicate(In, "offset", {int(o) for o in offsets}),
        )
        for (topic, partition), offsets in keys.items()
    ]
    row_filter = parts[0] if len(parts) == 1 else Or(*parts)
    summary = {"icespool.reason": _FLUSH_REASON, "icespool.replay-group": group}
    return await writer.delete_rows(row_filter, summary)


class DeadLetterReplay:
    """One replay call over the dead-letter table ``table``."""

    def __init__(
        self,
        table: str,
        *,
        sources: Sequence[KafkaSource],
        dead_letters: TableWriter,
        writer_for: Callable[[str], TableWriter],
        load_table: Callable[[str], Table],
        load_properties: Callable[[str], Mapping[str, str]],
        stopping: Callable[[], bool],
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.table = table
        self.group = replay_group(table)
        self._sources = list(sources)
        self._dead_letters = dead_letters
        self._writer_for = writer_for
        self._load_table = load_table
        self._load_properties = load_properties
        self._stopping = stopping
        self._chunk_rows = chunk_rows

    async def run(self, selection: ReplayFilter) -> ReplayResult:
        """Replay what ``selection`` picks (at most its ``limit`` rows)."""
        result = ReplayResult(self.table)
        started = time.monotonic()
        _log.info(
            "dead-letter replay of %s started (%r)",
            self.table,
            selection.describe(),  # repr: filter values come from a request
            extra={"table": self.table},
        )
        try:
            # The cause was fixed outside, perhaps: decode with the tables as they are now.
            for table in {t for source in self._sources for t in source.tables}:
                await self._writer_for(table).refresh()
            reader = await asyncio.to_thread(self._open, selection)
            try:
                async for chunk in self._chunks(reader, selection.limit):
                    if self._stopping():
                        result.interrupted = True
                        break
                    await self._chunk(chunk, result)
                    _log.info(
                        "dead-letter replay of %s: %d rows read, %d replayed, %d already "
                        "present, %d still failing, %d removed",
                        self.table,
                        result.scanned,
                        result.replayed,
                        result.already_present,
                        result.still_failing,
                        result.removed,
                        extra={"table": self.table, **_figures(result)},
                    )
            finally:
                reader.close()
        except ShuttingDownError:
            result.interrupted = True
        except Exception as exc:
            # The chunks before are done; this one is repeated safely by the next call.
            result.error = f"{type(exc).__name__}: {exc}"
            _log.error(
                "dead-letter replay of %s stopped: %s; replaying again is safe",
                self.table,
                result.error,
                extra={"table": self.table, "error": result.error},
            )
        _log.info(
            "dead-letter replay of %s %s in %.1fs: %d replayed, %d already present, "
            "%d still failing, %d removed",
            self.table,
            "interrupted by shutdown" if result.interrupted else "finished",
            time.monotonic() - started,
            result.replayed,
            result.already_present,
            result.still_failing,
            result.removed,
            extra={"table": self.table, **_figures(result)},
        )
        return result

    # ------------------------------------------------------------------ reading

    def _open(self, selection: ReplayFilter) -> pa.RecordBatchReader:
        # A Table of its own: the dead-letter writer's is refreshed in place by its commits.
        table = self._load_table(self.table)
        scan = table.scan(
            row_filter=selection.row_filter(), selected_fields=_COLUMNS, limit=selection.limit
        )
        reader: pa.RecordBatchReader = scan.to_arrow_batch_reader()
        return reader

    async def _chunks(self, reader: pa.RecordBatchReader, limit: int) -> AsyncIterator[pa.Table]:
        """At most ``limit`` rows of ``reader`` in tables of about `CHUNK_ROWS` rows."""
        pending: list[pa.RecordBatch] = []
        rows = size = total = 0
        while total < limit:
            batch = await asyncio.to_thread(_next_batch, reader)
            if batch is None:
                break
            batch = batch.slice(0, limit - total)
            total += batch.num_rows
            for piece in _pieces(batch, self._chunk_rows):
                pending.append(piece)
                rows += piece.num_rows
                size += piece.nbytes
                if rows >= self._chunk_rows or size >= _CHUNK_BYTES:
                    yield pa.Table.from_batches(pending)
                    pending, rows, size = [], 0, 0
        if pending:
            yield pa.Table.from_batches(pending)

    # ------------------------------------------------------------------ one chunk

    async def _chunk(self, rows: pa.Table, result: ReplayResult) -> None:
        result.scanned += rows.num_rows
        settled: _Keys = {}  # held by their target now: removed from the dead letters
        appended: dict[str, _Keys] = {}  # spooled for a target by this chunk
        held_cache: dict[str, Mapping[str, str]] = {}
        for (topic, partition), group in _by_partition(rows):
            fetch = _fetch(topic, partition, group)
            source, problem = self._source_for(topic)
            if source is None:
                for offset in fetch.offsets.tolist():
                    result.fail(topic, partition, offset, "no_source", problem)
                continue
            per_table, dead = await source.redecode(fetch)
            for table, decoded in per_table.items():
                if decoded.batch is None:
                    continue
                offsets = fetch.offsets[decoded.rows]
                if table not in held_cache:
                    held_cache[table] = await asyncio.to_thread(self._load_properties, table)
                held = ranges_from_properties(held_cache[table], self.group, topic, partition)
                present = held.mask(offsets)
                if present.any():
                    result.already_present += int(present.sum())
                    settled.setdefault((topic, partition), []).append(offsets[present])
                fresh = ~present
                if fresh.any():
                    kept = offsets[fresh]
                    runs = Ranges.runs(kept)
                    batch = decoded.batch.filter(pa.array(fresh))
                    meta = batch_meta(self.group, topic, partition, runs, runs)
                    await self._append(table, batch, meta)
                    appended.setdefault(table, {}).setdefault((topic, partition), []).append(kept)
            for record, _ in dead:
                offset = int(fetch.offsets[record.index])
                result.fail(topic, partition, offset, record.reason, record.error)
        for table in appended:
            await self._writer_for(table).flush(_FLUSH_REASON)
        await self._confirm(appended, settled, result)
        if settled:
            keys = {key: np.unique(np.concatenate(parts)) for key, parts in settled.items()}
            await remove_dead_letters(self._dead_letters, keys, self.group)
            result.removed += _count_rows(rows, keys)

    async def _append(self, table: str, batch: pa.RecordBatch, meta: dict[str, object]) -> None:
        """Spool ``batch`` for ``table``, waiting out a full queue a bounded while."""
        writer = self._writer_for(table)

        def full(exc: BaseException) -> bool:
            # A draining daemon (ShuttingDownError) takes nothing more: no retry.
            return (
                isinstance(exc, BackpressureError)
                and not isinstance(exc, ShuttingDownError)
                and not self._stopping()
            )

        await retry_async(
            lambda: writer.append(batch, meta),
            attempts=_APPEND_ATTEMPTS,
            retryable=full,
            pause=lambda _, exc: exc.retry_after if isinstance(exc, BackpressureError) else 0.0,
        )

    async def _confirm(
        self, appended: Mapping[str, _Keys], settled: _Keys, result: ReplayResult
    ) -> None:
        """Count as replayed what the targets now hold; the rest stays a dead letter
        (its commit failed for a reason the writer logged: quarantined, say)."""
        for table, parts in appended.items():
            props = await asyncio.to_thread(self._load_properties, table)
            for (topic, partition), chunks in parts.items():
                offsets = np.concatenate(chunks)
                held = ranges_from_properties(props, self.group, topic, partition).mask(offsets)
                count = int(held.sum())
                result.replayed += count
                result.targets[table] = result.targets.get(table, 0) + count
                settled.setdefault((topic, partition), []).append(offsets[held])
                for offset in offsets[~held].tolist():
                    result.fail(
                        topic,
                        partition,
                        offset,
                        "not_committed",
                        f"{table} did not commit it (see the daemon's log); it stays a dead "
                        "letter and a later replay retries it",
                    )

    def _source_for(self, topic: str) -> tuple[KafkaSource | None, str]:
        matching = [s for s in self._sources if s.consumes(topic)]
        if len(matching) == 1:
            return matching[0], ""
        if not matching:
            return None, (
                f"no [[kafka]] source writing dead letters to {self.table} consumes topic "
                f"{topic!r} any more; its format and routing are unknown"
            )
        names = ", ".join(s.name for s in matching)
        return None, (
            f"sources {names} all consume topic {topic!r} into {self.table}; which one's "
            "routing applies is ambiguous"
        )


# ---------------------------------------------------------------------- helpers


def _next_batch(reader: pa.RecordBatchReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


def _pieces(batch: pa.RecordBatch, rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _by_partition(rows: pa.Table) -> Iterator[tuple[tuple[str, int], pa.Table]]:
    """The rows of each (topic, partition), in offset order, each offset once."""
    topics = rows.column("topic").to_pylist()
    partitions = rows.column("partition").to_pylist()
    groups: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(zip(topics, partitions, strict=True)):
        groups.setdefault(key, []).append(i)
    for key, indices in sorted(groups.items()):
        group = rows.take(pa.array(indices, pa.int64()))
        group = group.take(pc.sort_indices(group, [("offset", "ascending")]))
        offsets = group.column("offset").to_numpy()
        _, first = np.unique(offsets, return_index=True)
        if first.size != group.num_rows:
            group = group.take(pa.array(first, pa.int64()))
        yield key, group


def _fetch(topic: str, partition: int, rows: pa.Table) -> Fetch:
    """The Kafka records ``rows`` (dead letters of one partition) were."""
    stamps = rows.column("timestamp")
    micros = pc.fill_null(pc.cast(stamps, pa.int64()), 0).to_numpy()
    valid = stamps.is_valid().to_numpy(zero_copy_only=False)
    ms = np.where(valid, micros // 1000, _NO_TIMESTAMP_MS)
    return Fetch(
        topic,
        partition,
        np.asarray(rows.column("offset").to_numpy(), dtype=np.int64),
        rows.column("value"),
        rows.column("key"),
        ms,
        [_headers(h) for h in rows.column("headers").to_pylist()],
    )


def _headers(text: str | None) -> list[tuple[str, bytes]]:
    """Headers as the dead-letter table keeps them: a JSON list of [name, base64]."""
    if not text:
        return []
    try:
        pairs = json.loads(text)
        return [(str(name), base64.b64decode(value)) for name, value in pairs]
    except (ValueError, TypeError, binascii.Error):
        return []  # a hand-edited row: its headers are lost, its value is not


def _count_rows(rows: pa.Table, keys: Mapping[tuple[str, int], npt.NDArray[np.int64]]) -> int:
    topics = rows.column("topic").to_pylist()
    partitions = rows.column("partition").to_pylist()
    offsets = rows.column("offset").to_pylist()
    wanted = {(t, p): set(o.tolist()) for (t, p), o in keys.items()}
    return sum(
        1
        for t, p, o in zip(topics, partitions, offsets, strict=True)
        if o in wanted.get((t, p), ())
    )


def _figures(result: ReplayResult) -> dict[str, int]:
    return {
        "replayed": result.replayed,
        "already_present": result.already_present,
        "still_failing": result.still_failing,
        "removed": result.removed,
    }
