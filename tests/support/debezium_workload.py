"""The real-Debezium workload shared by the acceptance tests (tests/cdc/test_debezium_real.py
reads the result with pyiceberg, tests/spark/test_spark_debezium.py with Spark as well).

`run_debezium` creates three source tables (one with a composite key) in the
``DebeziumPostgres`` database, starts Debezium on them with its default settings, runs
a real ``icespool run`` child with one upsert table per source table (``evolve =
"add-and-widen"``) and a seeded workload of inserts, updates, deletes, primary-key
changes and schema changes (ADD COLUMN, integer -> bigint, numeric(12,3) ->
numeric(18,3)), kills the daemon -9 at the given fractions of the workload, then waits
until every Iceberg table's merged state (`icespool.cdc.read_merged`) equals ``SELECT *``
of its source table row by row, typed values compared exactly (`typed`), and checks
that every Kafka record was claimed once and none became a dead letter.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pyiceberg.catalog import load_catalog

from icespool.cdc import read_merged
from icespool.kafka._offsets import ranges_from_properties
from support.daemon_harness import CATALOG_NAME, Daemon, DaemonDir
from support.debezium import DebeziumPostgres
from support.kafka_harness import Broker, create_topic

__all__ = ["DDL", "ICEBERG", "NAMESPACE", "Outcome", "Rows", "run_debezium", "typed"]

UTC = datetime.UTC
SEED = 20261128
NAMESPACE = "dbz"
CONVERGE_WITHIN = 180.0

# Source DDL and the Iceberg declaration of the same columns (the key required).
DDL = {
    "accounts": """CREATE TABLE accounts (
        id bigint PRIMARY KEY, name text, balance numeric(12,3), opened timestamp,
        seen timestamptz, born date, active boolean, n integer)""",
    "orders": """CREATE TABLE orders (
        region text, id bigint, amount numeric(12,3), placed timestamptz, due date,
        paid boolean, note text, opened timestamp, PRIMARY KEY (region, id))""",
    "events": """CREATE TABLE events (
        id bigint PRIMARY KEY, kind text, at timestamp, at_tz timestamptz,
        amount numeric(12,3), day date, flag boolean)""",
}
ICEBERG = {
    "accounts": (
        ["id"],
        [
            ("id", "long", True),
            ("name", "string", False),
            ("balance", "decimal(12,3)", False),
            ("opened", "timestamp", False),
            ("seen", "timestamptz", False),
            ("born", "date", False),
            ("active", "boolean", False),
            ("n", "int", False),
        ],
    ),
    "orders": (
        ["region", "id"],
        [
            ("region", "string", True),
            ("id", "long", True),
            ("amount", "decimal(12,3)", False),
            ("placed", "timestamptz", False),
            ("due", "date", False),
            ("paid", "boolean", False),
            ("note", "string", False),
            ("opened", "timestamp", False),
        ],
    ),
    "events": (
        ["id"],
        [
            ("id", "long", True),
            ("kind", "string", False),
            ("at", "timestamp", False),
            ("at_tz", "timestamptz", False),
            ("amount", "decimal(12,3)", False),
            ("day", "date", False),
            ("flag", "boolean", False),
        ],
    ),
}
# Schema changes at these fractions of the workload.
ALTERS = [
    (0.25, "ALTER TABLE events ADD COLUMN extra text"),
    (0.45, "ALTER TABLE accounts ALTER COLUMN n TYPE bigint"),
    (0.60, "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(18,3)"),
    (0.75, "ALTER TABLE events ADD COLUMN score numeric(10,2), ADD COLUMN big bigint"),
]

# ------------------------------------------------------------------ values at the edges

_TS_EDGES = [
    datetime.datetime(1, 1, 1),
    datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
    datetime.datetime(1970, 1, 1),
    datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),
]
_DATE_EDGES = [
    datetime.date(1, 1, 1),
    datetime.date(9999, 12, 31),
    datetime.date(1970, 1, 1),
    datetime.date(1969, 12, 31),
]
_TEXT = ["", "plain", "é✓ ünïcödé", "x" * 300, "'quoted'", "line\nbreak"]


def _decimal(rng: random.Random, digits: int, scale: int) -> Decimal | None:
    roll = rng.random()
    if roll < 0.08:
        return None
    top = 10**digits - 1
    if roll < 0.2:
        unscaled = rng.choice([0, -1, 1, top, -top, -(10**scale)])
    else:
        unscaled = rng.randint(-top, top) // rng.choice([1, 1000, 10**6])
    return Decimal(unscaled).scaleb(-scale)


def _timestamp(rng: random.Random) -> datetime.datetime | None:
    roll = rng.random()
    if roll < 0.08:
        return None
    if roll < 0.25:
        return rng.choice(_TS_EDGES)
    first, last = _TS_EDGES[0], _TS_EDGES[1]
    span = int((last - first).total_seconds())
    return first + datetime.timedelta(
        seconds=rng.randrange(span), microseconds=rng.randrange(1_000_000)
    )


def _date(rng: random.Random) -> datetime.date | None:
    roll = rng.random()
    if roll < 0.08:
        return None
    if roll < 0.25:
        return rng.choice(_DATE_EDGES)
    return datetime.date(1, 1, 1) + datetime.timedelta(days=rng.randrange(3652058))


def _zoned(rng: random.Random) -> datetime.datetime | None:
    stamp = _timestamp(rng)
    return None if stamp is None else stamp.replace(tzinfo=UTC)


def _maybe(rng: random.Random, value: Any) -> Any:
    return None if rng.random() < 0.08 else value


# ------------------------------------------------------------------ the workload


@dataclass
class Workload:
    """The seeded statements against the source database, run in a thread."""

    source: DebeziumPostgres
    rng: random.Random
    statements: int
    done: int = 0
    transactions: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    widened: set[str] = field(default_factory=set)
    columns: dict[str, list[str]] = field(default_factory=dict)
    alive: dict[str, set[tuple[Any, ...]]] = field(default_factory=dict)
    error: BaseException | None = None
    #: Statement counts at which the workload waits (``waiting`` set) until ``go``: each
    #: kill lands mid-stream, however slowly the daemon restarts.
    gates: list[int] = field(default_factory=list)
    waiting: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # the test thread raises it
            self.error = exc

    def _run(self) -> None:
        conn = self.source.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute("SET TIME ZONE 'UTC'")
            conn.commit()
            alters = list(ALTERS)
            while self.done < self.statements:
                if alters and self.done >= alters[0][0] * self.statements:
                    _, ddl = alters.pop(0)
                    with conn.cursor() as cursor:
                        cursor.execute(ddl)
                    conn.commit()
                    self._count("alter")
                    self._altered(ddl)
                    continue
                size = self.rng.randint(2, 8) if self.rng.random() < 0.3 else 1
                with conn.cursor() as cursor:
                    for _ in range(size):
                        self._statement(cursor)
                        self.done += 1
                conn.commit()
                self.transactions += 1
                if self.gates and self.done >= self.gates[0]:
                    self.gates.pop(0)
                    self.go.clear()
                    self.waiting.set()
                    if not self.go.wait(300):
                        raise TimeoutError("the test never let the workload go on")
                time.sleep(0.004)  # spread over seconds, so the kills land mid-stream
        finally:
            conn.close()

    def _altered(self, ddl: str) -> None:
        if "ADD COLUMN extra" in ddl:
            self.columns["events"].append("extra")
        elif "n TYPE bigint" in ddl:
            self.widened.add("accounts.n")
        elif "amount TYPE numeric(18,3)" in ddl:
            self.widened.add("orders.amount")
        elif "ADD COLUMN score" in ddl:
            self.columns["events"] += ["score", "big"]

    def _count(self, kind: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def _key(self, table: str) -> tuple[Any, ...]:
        if table == "orders":
            return (self.rng.choice(["eu", "us", "apac", "süd"]), self.rng.randrange(150))
        return (self.rng.randrange(400),)

    def _values(self, table: str, column: str) -> Any:
        rng = self.rng
        if column in ("balance", "amount"):
            digits = 15 if f"{table}.{column}" in self.widened else 9
            return _decimal(rng, digits + 3, 3)
        if column == "score":
            return _decimal(rng, 10, 2)
        if column in ("opened", "at"):
            return _timestamp(rng)
        if column in ("seen", "placed", "at_tz"):
            return _zoned(rng)
        if column in ("born", "due", "day"):
            return _date(rng)
        if column in ("active", "paid", "flag"):
            return _maybe(rng, rng.random() < 0.5)
        if column == "n":
            top = 2**63 - 1 if "accounts.n" in self.widened else 2**31 - 1
            return _maybe(rng, rng.choice([0, -1, top, -top - 1, rng.randint(-top, top)]))
        if column == "big":
            return _maybe(rng, rng.randint(-(2**63), 2**63 - 1))
        return _maybe(rng, rng.choice(_TEXT))

    def _statement(self, cursor: Any) -> None:
        table = self.rng.choice(list(DDL))
        key_names = ICEBERG[table][0]
        columns = self.columns[table]
        alive = self.alive[table]
        roll = self.rng.random()
        where = " AND ".join(f"{k} = %s" for k in key_names)
        if not alive or roll < 0.35:
            key = self._key(table)
            if key in alive:
                return self._statement(cursor)
            rest = [c for c in columns if c not in key_names]
            names = [*key_names, *rest]
            values = [*key, *(self._values(table, c) for c in rest)]
            marks = ", ".join(["%s"] * len(names))
            cursor.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})", values)
            alive.add(key)
            self._count("insert")
        elif roll < 0.70:
            key = self.rng.choice(sorted(alive))
            rest = [c for c in columns if c not in key_names]
            chosen = self.rng.sample(rest, self.rng.randint(1, len(rest)))
            sets = ", ".join(f"{c} = %s" for c in chosen)
            values = [self._values(table, c) for c in chosen]
            cursor.execute(f"UPDATE {table} SET {sets} WHERE {where}", [*values, *key])
            self._count("update")
        elif roll < 0.85:
            key = self.rng.choice(sorted(alive))
            cursor.execute(f"DELETE FROM {table} WHERE {where}", key)
            alive.discard(key)
            self._count("delete")
        else:
            old = self.rng.choice(sorted(alive))
            new = self._key(table)
            if new in alive:
                return self._statement(cursor)
            sets = ", ".join(f"{k} = %s" for k in key_names)
            cursor.execute(f"UPDATE {table} SET {sets} WHERE {where}", [*new, *old])
            alive.discard(old)
            alive.add(new)
            self._count("key_change")
        return None


# ------------------------------------------------------------------ comparing


def typed(value: Any) -> tuple[str, Any]:
    """A value as (kind, exact text): Decimal digits and scale, timestamps in UTC."""
    if value is None:
        return ("null", None)
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return ("timestamp", value.isoformat())
        return ("timestamptz", value.astimezone(UTC).replace(tzinfo=None).isoformat())
    if isinstance(value, datetime.date):
        return ("date", value.isoformat())
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, int):
        return ("integer", value)
    if isinstance(value, str):
        return ("string", value)
    raise AssertionError(f"unexpected {type(value).__name__}: {value!r}")


Rows = list[tuple[tuple[str, Any], ...]]


def _source_rows(source: DebeziumPostgres, table: str) -> tuple[list[str], Rows]:
    conn = source.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
            cursor.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cursor.description]
            rows = [tuple(typed(v) for v in row) for row in cursor.fetchall()]
    finally:
        conn.close()
    return names, sorted(rows, key=repr)


def _iceberg_rows(home: DaemonDir, name: str, table: str, names: Sequence[str]) -> tuple[Rows, Any]:
    catalog = _catalog(home, name)
    try:
        loaded = catalog.load_table(f"{NAMESPACE}.{table}")
        merged = read_merged(loaded)
    finally:
        catalog.engine.dispose()
    missing = [n for n in names if n not in merged.column_names]
    if missing:
        return [(("missing columns", tuple(missing)),)], loaded
    columns = [merged.column(n).to_pylist() for n in names]
    rows = [tuple(typed(v) for v in row) for row in zip(*columns, strict=True)]
    return sorted(rows, key=repr), loaded


def _catalog(home: DaemonDir, name: str) -> Any:
    return load_catalog(name, **home.catalog_properties)


def _first_difference(expected: Rows, got: Rows) -> str:
    want, have = set(expected), set(got)
    only_source = sorted(want - have, key=repr)[:3]
    only_iceberg = sorted(have - want, key=repr)[:3]
    return (
        f"{len(expected)} source rows, {len(got)} Iceberg rows; only in the source: "
        f"{only_source}; only in Iceberg: {only_iceberg}"
    )


async def _end_offsets(bootstrap: str, topics: Sequence[str]) -> dict[str, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        parts = [TopicPartition(t, 0) for t in topics]
        ends = await consumer.end_offsets(parts)
        return {tp.topic: ends[tp] for tp in parts}
    finally:
        await consumer.stop()


# ------------------------------------------------------------------ the run


def _config(home: DaemonDir, name: str, broker: Broker, source: DebeziumPostgres) -> None:
    blocks = []
    for table, (key, columns) in ICEBERG.items():
        schema = ",\n".join(
            f'  {{ name = "{n}", type = "{t}"' + (", required = true }" if r else " }")
            for n, t, r in columns
        )
        blocks.append(
            f"""
[[tables]]
name = "{NAMESPACE}.{table}"
create = true
key = {json.dumps(key)}
evolve = "add-and-widen"
schema = [
{schema},
]
"""
        )
    for table in ICEBERG:
        topic = source.topic(table)
        blocks.append(
            f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{NAMESPACE}.{table}"
changes = "debezium"
offset_commit_interval = "1s"
session_timeout = "6s"
"""
        )
    home.write_config(batch_timeout="1s", extra="".join(blocks))
    # A catalog name of its own: Spark sees a SQL catalog only under it, and caches it.
    text = home.config_path.read_text()
    home.config_path.write_text(text.replace(f'name = "{CATALOG_NAME}"', f'name = "{name}"', 1))


async def _until(condition: Callable[[], bool], within: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(what())
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Outcome:
    """What `run_debezium` did: the daemon's home and catalog name, the source's final
    rows by table (column names, typed rows), the loaded Iceberg tables, a summary."""

    home: DaemonDir
    catalog: str
    expected: dict[str, tuple[list[str], Rows]]
    tables: dict[str, Any]
    summary: str


async def run_debezium(
    broker: Broker,
    debezium: DebeziumPostgres,
    root: Path,
    *,
    statements: int,
    kills: Sequence[float],
    seed: int = SEED,
) -> Outcome:
    """See the module's doc; ``kills``: fractions of the workload at which the daemon
    is killed -9 (and started again)."""
    began = time.monotonic()
    conn = debezium.connect()
    try:
        with conn.cursor() as cursor:
            for ddl in DDL.values():
                cursor.execute(ddl)
        conn.commit()
    finally:
        conn.close()
    topics = [debezium.topic(t) for t in DDL]
    for topic in topics:
        await create_topic(broker.bootstrap, topic, 1)
    await asyncio.to_thread(debezium.start, list(DDL))

    home = DaemonDir(root)
    name = f"dbz_{uuid.uuid4().hex[:10]}"
    _config(home, name, broker, debezium)
    daemon = Daemon(home)
    workload = Workload(
        debezium,
        random.Random(seed),
        statements,
        columns={t: [n for n, _, _ in ICEBERG[t][1]] for t in DDL},
        alive={t: set() for t in DDL},
        gates=[int(at * statements) for at in kills],
    )
    try:
        daemon.start()
        await daemon.wait_ready()
        thread = threading.Thread(target=workload.run, name="workload", daemon=True)
        thread.start()
        killed = 0
        for _ in kills:
            await _until(
                lambda: workload.waiting.is_set() or not thread.is_alive(),
                120,
                lambda: f"the workload stalled at {workload.done} statements",
            )
            assert thread.is_alive(), f"the workload ended early: {workload.error!r}"
            assert daemon.kill() == -9
            killed += 1
            # The source goes on while the daemon is down, as Debezium's would.
            workload.waiting.clear()
            workload.go.set()
            daemon.start()
            await daemon.wait_ready()
        await asyncio.to_thread(thread.join, 300)
        assert workload.error is None, repr(workload.error)
        assert not thread.is_alive()
        workload_done = time.monotonic()

        expected = {t: await asyncio.to_thread(_source_rows, debezium, t) for t in DDL}
        got: dict[str, Rows] = {}
        loaded: dict[str, Any] = {}
        deadline = time.monotonic() + CONVERGE_WITHIN
        while True:
            for table, (names, rows) in expected.items():
                if got.get(table) != rows:
                    got[table], loaded[table] = await asyncio.to_thread(
                        _iceberg_rows, home, name, table, names
                    )
            if all(got[t] == expected[t][1] for t in DDL) or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        converged = time.monotonic()
        for table, (_, rows) in expected.items():
            assert got[table] == rows, (
                f"{table}: {_first_difference(rows, got[table])}\n{daemon.tail(30)}"
            )

        # Every Debezium record was consumed once: each table claims its topic's offsets
        # 0..end-1 as one range, and nothing became a dead letter.
        ends = await _end_offsets(broker.bootstrap, topics)
        for table, topic in zip(DDL, topics, strict=True):
            catalog = _catalog(home, name)
            try:
                current = catalog.load_table(f"{NAMESPACE}.{table}")
                spans = ranges_from_properties(current.properties, f"g-{topic}", topic, 0).spans
                assert list(spans) == [(0, ends[topic] - 1)], (table, spans, ends[topic])
                dead = f"{NAMESPACE}.{table}_dead_letter"
                if catalog.table_exists(dead):
                    letters = catalog.load_table(dead).scan().to_arrow().to_pylist()
                    assert letters == [], letters[:3]
            finally:
                catalog.engine.dispose()
        assert killed == len(kills) and workload.done == statements
        summary = (
            f"real Debezium: {statements} statements in {workload.transactions} transactions "
            f"({workload.kinds}), {sum(ends.values())} Kafka records, {killed} kill -9, "
            f"rows {[len(expected[t][1]) for t in DDL]}; connect started in "
            f"{debezium.started_in:.1f} s; workload {workload_done - began:.1f} s, "
            f"converged {converged - workload_done:.1f} s after it"
        )
        return Outcome(home, name, expected, loaded, summary)
    finally:
        daemon.cleanup()
