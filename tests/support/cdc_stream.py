"""A Debezium-shaped change stream for the CDC acceptance tests, and the final state it
leads to, computed independently of the generator.

`debezium_stream(changes, keys, seed)` draws a deterministic stream of Kafka messages
(partition, key bytes, value bytes or None) over a table ``(id long key, name string,
qty long, note string)``: snapshot reads (``r``) and inserts (``c``) of unseen keys,
updates (``u``), deletes (``d``), tombstones (a null value) after deletes, re-inserts
of deleted keys, and deletes followed by re-inserts of the same key close together (so
one commit chunk sees both). Every change of a key goes to the same partition (the key
decides it, as Debezium's producer does), so per-key order is offset order.

`final_state(messages)` does NOT look at the generator's bookkeeping: it parses the
produced bytes back and applies Debezium's semantics (c/r/u: the row is ``after``;
d: no row for ``before``'s key; a tombstone: no row for the Kafka key), message by
message in each partition's offset order. The tests compare Spark's view with it key by
key (`compare`).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaProducer

__all__ = [
    "COLUMNS",
    "KEY",
    "SCHEMA",
    "Message",
    "compare",
    "debezium_stream",
    "final_state",
    "merged_rows",
    "produce_messages",
    "row_tuple",
    "upsert_table_toml",
]

KEY = "id"
COLUMNS = ("id", "name", "qty", "note")
#: The table as ``[[tables]] schema`` declares it (key column required).
SCHEMA: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "qty", "type": "long"},
    {"name": "note", "type": "string"},
]

Envelope = Literal["plain", "schema", "mixed"]


@dataclass(frozen=True, slots=True)
class Message:
    """One Kafka message of the stream: where it goes and its raw bytes."""

    partition: int
    key: bytes
    value: bytes | None


# The Kafka Connect schemas Debezium's JsonConverter puts beside each payload when
# schemas.enable is on (the "schema envelope").
_ROW_FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int64", "optional": True, "field": "qty"},
    {"type": "string", "optional": True, "field": "note"},
]
_VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "db.inv.items.Value",
            "field": "before",
        },
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "db.inv.items.Value",
            "field": "after",
        },
        {
            "type": "struct",
            "fields": [
                {"type": "string", "optional": False, "field": "connector"},
                {"type": "int64", "optional": False, "field": "lsn"},
            ],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "db.inv.items.Envelope",
}
_KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "int64", "optional": False, "field": "id"}],
    "optional": False,
    "name": "db.inv.items.Key",
}


_KEY_SCHEMA_BYTES = json.dumps(_KEY_SCHEMA, separators=(",", ":")).encode()
_VALUE_SCHEMA_BYTES = json.dumps(_VALUE_SCHEMA, separators=(",", ":")).encode()
# In a "mixed" stream, the share of messages with the schema envelope (each carries
# about 1 KB of schema: a fifth keeps the broker's and the decoder's load moderate).
_WRAPPED = 0.2


def _wrap(schema: bytes, payload: bytes) -> bytes:
    return b'{"schema":' + schema + b',"payload":' + payload + b"}"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _row(key: int, change: int, rng: random.Random) -> dict[str, Any]:
    # qty is the change's position in the stream: a stale row can never pass for the
    # latest one. note is null now and then (a nullable column that goes null).
    return {
        "id": key,
        "name": f"item-{key}-{change}",
        "qty": change,
        "note": None if rng.random() < 0.2 else f"n{change % 97}",
    }


def debezium_stream(
    changes: int = 100_000,
    keys: int = 10_000,
    *,
    partitions: int = 4,
    seed: int = 16,
    envelope: Envelope = "mixed",
) -> list[Message]:
    """``changes`` Kafka messages (tombstones included) over ids ``0 .. keys - 1``.

    ``envelope``: "plain" (payload only), "schema" (``{"schema":..,"payload":..}`` for
    key and value) or "mixed" (a fifth of the messages, drawn at random, have the envelope).
    """
    rng = random.Random(seed)
    alive: dict[int, dict[str, Any]] = {}
    seen: set[int] = set()
    out: list[Message] = []
    # A key deleted just now is re-inserted a few changes later (same commit chunk).
    soon: list[int] = []

    def emit(key: int, value: dict[str, Any] | None) -> None:
        wrapped = envelope == "schema" or (envelope == "mixed" and rng.random() < _WRAPPED)
        key_bytes = b'{"id":%d}' % key
        body = None if value is None else _dumps(value)
        if wrapped:
            key_bytes = _wrap(_KEY_SCHEMA_BYTES, key_bytes)
            body = None if body is None else _wrap(_VALUE_SCHEMA_BYTES, body)
        out.append(Message(key % partitions, key_bytes, body))

    while len(out) < changes:
        position = len(out)
        key = soon.pop(0) if soon and rng.random() < 0.3 else rng.randrange(keys)
        source = {"connector": "postgresql", "lsn": position}
        if key in alive:
            before = alive[key]
            if rng.random() < 0.75:
                after = _row(key, position, rng)
                alive[key] = after
                emit(key, {"before": before, "after": after, "source": source, "op": "u"})
            else:
                del alive[key]
                emit(key, {"before": before, "after": None, "source": source, "op": "d"})
                if len(out) < changes and rng.random() < 0.5:
                    emit(key, None)  # the tombstone Debezium sends after a delete
                if rng.random() < 0.3:
                    soon.append(key)
        else:
            after = _row(key, position, rng)
            alive[key] = after
            # The first tenth of the stream is the initial snapshot: op r.
            op = "r" if key not in seen and position < changes // 10 else "c"
            seen.add(key)
            emit(key, {"before": None, "after": after, "source": source, "op": op})
    return out[:changes]


def _payload(raw: bytes) -> Any:
    value = json.loads(raw)
    if isinstance(value, dict) and "schema" in value and "payload" in value:
        return value["payload"]
    return value


def final_state(messages: Iterable[Message]) -> dict[int, tuple[Any, ...]]:
    """The table after every message, from the bytes alone: id -> `row_tuple`.

    Messages are taken in the given order, which is each partition's offset order
    (a key's messages all share one partition, so that order is the only one that
    matters)."""
    state: dict[int, tuple[Any, ...]] = {}
    for message in messages:
        if message.value is None:
            state.pop(int(_payload(message.key)[KEY]), None)
            continue
        event = _payload(message.value)
        op = event["op"]
        if op in ("c", "r", "u"):
            after = event["after"]
            state[int(after[KEY])] = row_tuple(after)
        elif op == "d":
            state.pop(int(event["before"][KEY]), None)
        else:
            raise AssertionError(f"the stream holds an op the test does not know: {op!r}")
    return state


def row_tuple(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A row as the comparison takes it: the table's columns in order."""
    return tuple(row.get(c) for c in COLUMNS)


def compare(
    got: Iterable[Sequence[Any]], expected: Mapping[int, tuple[Any, ...]], *, shown: int = 5
) -> None:
    """Assert that the rows ``got`` (tuples in `COLUMNS` order) are ``expected`` key by
    key: no key missing, none extra, none twice, every value equal. The message names
    the first few differences of each kind."""
    rows: dict[int, tuple[Any, ...]] = {}
    twice: list[int] = []
    for row in got:
        key = int(row[0])
        if key in rows:
            twice.append(key)
        rows[key] = tuple(row)
    missing = sorted(expected.keys() - rows.keys())
    extra = sorted(rows.keys() - expected.keys())
    different = sorted(k for k in rows.keys() & expected.keys() if rows[k] != expected[k])
    problems = []
    if twice:
        problems.append(f"{len(twice)} keys twice, e.g. {sorted(twice)[:shown]}")
    if missing:
        problems.append(f"{len(missing)} keys missing, e.g. {missing[:shown]}")
    if extra:
        sample = [(k, rows[k]) for k in extra[:shown]]
        problems.append(f"{len(extra)} deleted keys present, e.g. {sample}")
    if different:
        sample2 = [(rows[k], expected[k]) for k in different[:shown]]
        problems.append(f"{len(different)} keys with other values, e.g. (got, expected) {sample2}")
    assert not problems, "; ".join(problems) + f" ({len(rows)} rows, {len(expected)} expected)"


async def produce_messages(
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    *,
    linger_ms: int = 20,
) -> int:
    """Produce ``messages`` in order to their partitions (per-partition order kept:
    one producer, sends awaited in order). Returns the count sent."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=linger_ms,
        max_batch_size=512 << 10,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        pending: list[asyncio.Future[Any]] = []
        for message in messages:
            pending.append(
                await producer.send(
                    topic, value=message.value, key=message.key, partition=message.partition
                )
            )
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return len(messages)


def upsert_table_toml(table: str) -> str:
    """The ``[[tables]]`` block of the upsert table the acceptance tests use."""
    columns = ",\n".join(
        "  {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in c.items()) + "}" for c in SCHEMA
    )
    return f"""
[[tables]]
name = "{table}"
create = true
key = ["{KEY}"]
schema = [
{columns},
]
"""


def merged_rows(table: Any, columns: Sequence[str] = COLUMNS) -> list[tuple[Any, ...]]:
    """The rows of ``table`` (a pyiceberg Table, current snapshot) with its equality and
    position deletes applied, read file by file: pyiceberg 0.12's ``scan()`` refuses
    equality deletes, and this reader shares nothing with the daemon's.

    Iceberg's rules: an equality delete of data sequence number N removes the rows with
    its key values from data files of sequence number < N; a position delete of N
    removes (file, pos) from data files of sequence number <= N."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    io = table.io
    data: list[tuple[int, str]] = []
    equality: list[tuple[int, pa.Table]] = []
    positions: dict[str, list[tuple[int, pa.Array]]] = {}
    names = {f.field_id: f.name for f in table.schema().fields}

    def read(path: str, wanted: Sequence[str] | None = None) -> pa.Table:
        with io.new_input(path).open() as stream:
            return pq.read_table(stream, columns=list(wanted) if wanted else None)

    for manifest in snapshot.manifests(io):
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            file = entry.data_file
            content = int(file.content)
            sequence = int(entry.sequence_number)
            if content == 0:
                data.append((sequence, file.file_path))
            elif content == 2:
                key = [names[i] for i in file.equality_ids]
                equality.append((sequence, read(file.file_path, key)))
            else:
                deletes = read(file.file_path, ["file_path", "pos"])
                for path in set(deletes.column("file_path").to_pylist()):
                    mask = pc.equal(deletes.column("file_path"), path)
                    positions.setdefault(path, []).append(
                        (sequence, deletes.filter(mask).column("pos").combine_chunks())
                    )
    out: list[tuple[Any, ...]] = []
    for sequence, path in data:
        rows = read(path)
        keep = pa.array([True] * rows.num_rows)
        index = pa.array(range(rows.num_rows), pa.int64())
        for delete_sequence, pos in positions.get(path, []):
            if delete_sequence >= sequence:
                keep = pc.and_(keep, pc.invert(pc.is_in(index, value_set=pos)))
        for delete_sequence, keys in equality:
            if delete_sequence > sequence:
                if keys.num_columns == 1:
                    hit = pc.is_in(rows.column(keys.column_names[0]), value_set=keys.column(0))
                else:  # a row-wise match on several key columns (rare: tests only)
                    names_ = keys.column_names
                    wanted = set(zip(*(keys.column(c).to_pylist() for c in names_), strict=True))
                    got = zip(*(rows.column(c).to_pylist() for c in names_), strict=True)
                    hit = pa.array([t in wanted for t in got])
                keep = pc.and_(keep, pc.invert(hit))
        kept = rows.filter(keep)
        out.extend(zip(*(kept.column(c).to_pylist() for c in columns), strict=True))
    return out
