"""Spark reads what the daemon wrote: every type, partition pruning, time travel,
incremental reads, metadata tables. The daemon runs in-process behind real HTTP; Spark is a
real local session reading the same SQLite catalog through Iceberg's JdbcCatalog."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import struct
import uuid
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from support.spark_helpers import rows, scan_metrics

from icespool.iceberg import SEGMENTS_SUMMARY_KEY

NDJSON = {"Content-Type": "application/x-ndjson"}


async def post(session: aiohttp.ClientSession, url: str, table: str, body: str) -> None:
    async with session.post(f"{url}/v1/tables/{table}/records", data=body, headers=NDJSON) as r:
        assert r.status == 200, await r.text()


async def flush(session: aiohttp.ClientSession, url: str, table: str) -> dict[str, Any]:
    async with session.post(f"{url}/v1/tables/{table}/flush") as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


def ndjson(records: list[dict[str, Any]]) -> str:
    import json

    return "".join(json.dumps(r) + "\n" for r in records)


def f32(value: float) -> float:
    """The float Spark returns for a float (32-bit) column holding ``value``."""
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


# ------------------------------------------------------------------ every supported type

ALL_TYPES_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "dec", "type": "decimal(12,3)"},
    {"name": "day", "type": "date"},
    {"name": "ts", "type": "timestamp"},
    {"name": "tstz", "type": "timestamptz"},
    {"name": "s", "type": "string"},
    {"name": "u", "type": "uuid"},
    {"name": "bin", "type": "binary"},
    {"name": "fx", "type": "fixed[4]"},
]
U1 = uuid.UUID("12345678-1234-5678-9abc-def012345678")
U2 = uuid.UUID("ffffffff-0000-4000-8000-000000000001")
ALL_TYPES_RECORDS: list[dict[str, Any]] = [
    {
        "id": 1,
        "b": True,
        "i": 2**31 - 1,
        "f": 1.5,
        "d": 1e300,
        "dec": "123456789.125",
        "day": "2024-02-29",
        "ts": "2024-02-29T23:59:59.999999",
        "tstz": "2024-02-29T23:30:00.000001+02:00",
        "s": "héllo ✓",
        "u": str(U1),
        "bin": base64.b64encode(b"\x00\xffbin").decode(),
        "fx": base64.b64encode(b"\x01\x02\x03\x04").decode(),
    },
    {
        "id": -(2**63),
        "b": False,
        "i": -(2**31),
        "f": 0.1,
        "d": -0.0,
        "dec": -0.5,
        "day": "1970-01-01",
        "ts": "1900-01-01 00:00:00",
        "tstz": "1970-01-01T00:00:00Z",
        "s": "",
        "u": str(U2).upper(),
        "bin": "",
        "fx": base64.b64encode(b"\xff\xff\xff\xff").decode(),
    },
    {"id": 2**63 - 1},  # every optional column null
]
# What Spark returns for each record, column by column (Spark's Python values): uuid is a
# string, fixed is binary, timestamp (no zone) is TIMESTAMP_NTZ (naive), timestamptz is
# read as microseconds since the epoch to compare the instant exactly.
ALL_TYPES_EXPECTED = [
    (
        1,
        True,
        2**31 - 1,
        1.5,
        1e300,
        Decimal("123456789.125"),
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
        int(dt.datetime(2024, 2, 29, 21, 30, 0, 1, tzinfo=dt.UTC).timestamp() * 1_000_000),
        "héllo ✓",
        str(U1),
        bytearray(b"\x00\xffbin"),
        bytearray(b"\x01\x02\x03\x04"),
    ),
    (
        -(2**63),
        False,
        -(2**31),
        f32(0.1),
        -0.0,
        Decimal("-0.500"),
        dt.date(1970, 1, 1),
        dt.datetime(1900, 1, 1),
        0,
        "",
        str(U2),
        bytearray(b""),
        bytearray(b"\xff\xff\xff\xff"),
    ),
    (2**63 - 1, *([None] * 12)),
]
ALL_TYPES_SPARK_SCHEMA = [
    ("id", "bigint"),
    ("b", "boolean"),
    ("i", "int"),
    ("f", "float"),
    ("d", "double"),
    ("dec", "decimal(12,3)"),
    ("day", "date"),
    ("ts", "timestamp_ntz"),
    ("tstz", "timestamp"),
    ("s", "string"),
    ("u", "string"),
    ("bin", "binary"),
    ("fx", "binary"),
]


async def test_spark_reads_every_type_the_daemon_wrote_over_http(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": "types.all", "create": True, "schema": ALL_TYPES_SCHEMA}],
    )
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as session:
        await post(session, url, "types.all", ndjson(ALL_TYPES_RECORDS))
        result = await flush(session, url, "types.all")
    assert result["records"] == 3

    name = register(config)
    df = spark.table(f"{name}.types.all")
    assert df.dtypes == ALL_TYPES_SPARK_SCHEMA
    got = rows(
        spark.sql(
            f"SELECT id, b, i, f, d, dec, day, ts, unix_micros(tstz), s, u, bin, fx "
            f"FROM {name}.types.all ORDER BY id DESC"
        )
    )
    expected = sorted(ALL_TYPES_EXPECTED, key=lambda r: r[0], reverse=True)
    assert got == expected
    # -0.0 == 0.0 in Python: check the sign bit survived too.
    assert str(spark.sql(f"SELECT d FROM {name}.types.all WHERE id < 0").first()[0]) == "-0.0"
    # Spark shows timestamptz in the session zone (UTC here), exactly as sent.
    assert rows(spark.sql(f"SELECT CAST(tstz AS STRING) FROM {name}.types.all WHERE id = 1")) == [
        ("2024-02-29 21:30:00.000001",)
    ]


async def test_a_time_column_makes_the_table_unreadable_by_spark(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    """Iceberg 1.11's Spark integration has no TIME type (Spark 4.1's TIME is not mapped):
    it refuses to load the table's schema at all (not just the column). This pins the
    limit; see the README."""
    config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {
                "name": "types.with_time",
                "create": True,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "t", "type": "time"},
                ],
            }
        ],
    )
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as session:
        await post(session, url, "types.with_time", '{"id": 1, "t": "12:34:56.789012"}\n')
        assert (await flush(session, url, "types.with_time"))["records"] == 1

    name = register(config)
    with pytest.raises(Exception, match="Spark does not support time fields"):
        spark.sql(f"SELECT id FROM {name}.types.with_time").collect()


# ------------------------------------------------------------------ partition pruning


PRUNING_METRICS = (
    "totalDataManifest",
    "skippedDataManifests",
    "resultDataFiles",
    "skippedDataFiles",
    "numOutputRows",
)


def _events(day: int, ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "ts": f"2026-01-0{day}T{i % 24:02d}:00:00Z", "v": f"d{day}-{i}"} for i in ids]


async def test_partition_pruning_reads_only_matching_files(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {
                "name": "p.events",
                "create": True,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "ts", "type": "timestamptz"},
                    {"name": "v", "type": "string"},
                ],
                "partition_by": ["day(ts)", "bucket(4, id)"],
            }
        ],
    )
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as session:
        for day in (1, 2, 3):
            await post(
                session, url, "p.events", ndjson(_events(day, range(100 * day, 100 * day + 40)))
            )
            await flush(session, url, "p.events")

    name = register(config)
    table = f"{name}.p.events"
    files = spark.sql(
        f"SELECT file_path, partition.ts_day AS d, partition.id_bucket AS b, record_count "
        f"FROM {table}.files"
    ).collect()
    # 3 days x 4 buckets, every bucket of every day holds rows: one file per partition.
    assert len(files) == 12
    assert sum(f.record_count for f in files) == 120

    everything = scan_metrics(spark.table(table))
    assert {k: everything[k] for k in PRUNING_METRICS} == {
        "totalDataManifest": 3,
        "skippedDataManifests": 0,
        "resultDataFiles": 12,
        "skippedDataFiles": 0,
        "numOutputRows": 120,
    }

    one_day = spark.table(table).where(
        "ts >= TIMESTAMP '2026-01-02 00:00:00' AND ts < TIMESTAMP '2026-01-03 00:00:00'"
    )
    assert one_day.count() == 40
    metrics = scan_metrics(one_day)
    # Each flush (one day here) wrote one manifest: the two other days' manifests are
    # skipped by their partition bounds, the matching one yields its four files.
    assert {k: metrics[k] for k in PRUNING_METRICS} == {
        "totalDataManifest": 3,
        "skippedDataManifests": 2,
        "resultDataFiles": 4,
        "skippedDataFiles": 0,
        "numOutputRows": 40,
    }

    one_id = spark.table(table).where("id = 205")
    assert rows(one_id.select("v")) == [("d2-205",)]
    metrics = scan_metrics(one_id)
    # bucket(4, id) leaves one file per day; the daemon's column statistics (id min/max per
    # file) rule out the other two days: exactly one file is read, the 11 others skipped.
    bucket = spark.sql(f"SELECT {name}.system.bucket(4, 205L)").first()[0]
    (target,) = [f for f in files if f.b == bucket and f.d == dt.date(2026, 1, 2)]
    assert {k: metrics[k] for k in PRUNING_METRICS} == {
        "totalDataManifest": 3,
        "skippedDataManifests": 0,
        "resultDataFiles": 1,
        "skippedDataFiles": 11,
        "numOutputRows": target.record_count,
    }


# ------------------------------------------------------------ time travel, incremental, metadata

KV_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "v", "type": "string"},
]


async def _three_commits(
    make_config: Any, run_daemon: Any, catalog_name: str
) -> tuple[Any, list[Any]]:
    """Three flushes of 10 rows each (ids 0-9, 10-19, 20-29); returns config, FlushResults."""
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": "tt.kv", "create": True, "schema": KV_SCHEMA}],
    )
    results = []
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as session:
        for batch in range(3):
            ids = range(10 * batch, 10 * batch + 10)
            await post(session, url, "tt.kv", ndjson([{"id": i, "v": f"b{batch}"} for i in ids]))
            results.append(await service.flush("tt.kv"))
            await asyncio.sleep(0.01)  # distinct commit timestamps (milliseconds)
    assert [r.records for r in results] == [10, 10, 10]
    return config, results


def _ids(df: Any) -> list[int]:
    return sorted(row[0] for row in df.select("id").collect())


async def test_time_travel_and_incremental_reads_return_exactly_those_commits(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config, results = await _three_commits(make_config, run_daemon, catalog_name)
    s1, s2, s3 = (r.snapshot_id for r in results)
    name = register(config)
    table = f"{name}.tt.kv"

    assert _ids(spark.sql(f"SELECT id FROM {table} VERSION AS OF {s1}")) == list(range(10))
    assert _ids(spark.sql(f"SELECT id FROM {table} VERSION AS OF {s2}")) == list(range(20))
    assert _ids(spark.table(table)) == list(range(30))

    committed = {
        row.snapshot_id: row.at
        for row in spark.sql(
            f"SELECT snapshot_id, CAST(committed_at AS STRING) AS at FROM {table}.snapshots"
        ).collect()
    }
    assert set(committed) == {s1, s2, s3}
    at_s2 = spark.sql(f"SELECT id FROM {table} TIMESTAMP AS OF '{committed[s2]}'")
    assert _ids(at_s2) == list(range(20))
    at_s1 = spark.sql(f"SELECT id FROM {table} TIMESTAMP AS OF '{committed[s1]}'")
    assert _ids(at_s1) == list(range(10))

    def incremental(start: int, end: int | None = None) -> list[int]:
        reader = spark.read.format("iceberg").option("start-snapshot-id", str(start))
        if end is not None:
            reader = reader.option("end-snapshot-id", str(end))
        return _ids(reader.load(table))

    # start is exclusive, end inclusive (default: the current snapshot).
    assert incremental(s1, s2) == list(range(10, 20))
    assert incremental(s2, s3) == list(range(20, 30))
    assert incremental(s1) == list(range(10, 30))


async def test_metadata_tables_show_the_daemons_commits_and_summaries(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config, results = await _three_commits(make_config, run_daemon, catalog_name)
    name = register(config)
    table = f"{name}.tt.kv"

    snapshots = spark.sql(
        f"SELECT snapshot_id, parent_id, operation, summary FROM {table}.snapshots "
        "ORDER BY committed_at"
    ).collect()
    assert [s.snapshot_id for s in snapshots] == [r.snapshot_id for r in results]
    assert [s.parent_id for s in snapshots] == [None] + [r.snapshot_id for r in results[:2]]
    assert [s.operation for s in snapshots] == ["append"] * 3
    for snapshot, result in zip(snapshots, results, strict=True):
        summary = snapshot.summary
        assert summary[SEGMENTS_SUMMARY_KEY] == ",".join(result.segments)
        assert summary["icespool.reason"] == "manual"
        assert summary["added-records"] == "10"
        assert summary["added-data-files"] == str(result.files)
    assert snapshots[-1].summary["total-records"] == "30"

    history = spark.sql(
        f"SELECT snapshot_id, parent_id, is_current_ancestor FROM {table}.history "
        "ORDER BY made_current_at"
    ).collect()
    assert [tuple(h) for h in history] == [
        (results[0].snapshot_id, None, True),
        (results[1].snapshot_id, results[0].snapshot_id, True),
        (results[2].snapshot_id, results[1].snapshot_id, True),
    ]

    files = spark.sql(f"SELECT file_format, record_count FROM {table}.files").collect()
    assert len(files) == sum(r.files for r in results)
    assert {f.file_format for f in files} == {"PARQUET"}
    assert sum(f.record_count for f in files) == 30
    # Which commit added which file: the entries table ties files to snapshots.
    added = spark.sql(
        f"SELECT snapshot_id, sum(data_file.record_count) FROM {table}.entries "
        "WHERE status = 1 GROUP BY snapshot_id"
    ).collect()
    assert dict(tuple(a) for a in added) == {r.snapshot_id: 10 for r in results}
