"""Encode works for every type at every volume (issue 11, item 3 and its class).

The property: whatever Iceberg schema hypothesis draws from the whole type matrix
(every primitive, decimals up to precision 38, fixed lengths, uuids, structs, lists and
maps nested in each other, required or optional, temporal range edges), rows sent to a
real in-process daemon as NDJSON over HTTP *and* as an Arrow stream over HTTP, then
flushed over HTTP, are committed and read back exactly as sent, value for value (the
files pyiceberg's scan plans, read by pyarrow: see ``_committed_rows``). The volume
is above every heuristic threshold of the encoder: ``2 x ICESPOOL_ENCODE_ROWS`` rows (default
2 x 11,000, more than the 20,000-row dictionary sample and its 1,000-row minimum) with
all-distinct, all-equal and pooled columns, 2,000-row row groups and 128 KiB target
files so every flush writes several row groups and rolls files.

``ICESPOOL_ENCODE_EXAMPLES`` (default 4, plus one explicit example holding every type)
sets how many generated schemas run; raise it for a longer search.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import tempfile
import tomllib
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from support.fixture_types import MakeConfig, RunDaemon
from support.matrix_values import (
    Column,
    column_values,
    columns,
    every_type,
    http_bodies,
    nodes,
    post_and_flush,
)

from icespool.config import Config
from icespool.errors import SchemaError
from icespool.http import NDJSON
from icespool.iceberg import commit_files
from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.iceberg._parquet import encode_data_files
from icespool.lifecycle.service import Icespool
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

ROWS = int(os.environ.get("ICESPOOL_ENCODE_ROWS", "11000"))  # per transport
EXAMPLES = int(os.environ.get("ICESPOOL_ENCODE_EXAMPLES", "4"))
TABLE = "matrix.t"
WRITER_SETTINGS = {"target_file_size": "128KiB", "row_group_records": 2_000}
# The configuration page of the docs holds the table examples.
CONFIG_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


# ------------------------------------------------------------------ through a real daemon


def _send_flush_read(
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    table: dict[str, Any],
    bodies: list[tuple[bytes, str]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start a daemon for ``table``, POST ``bodies``, flush over HTTP, read the table back.

    Each call has a catalog and spool of its own: hypothesis runs many examples in one
    test function, and a table left from one must not meet the next one's schema.
    """
    name = table["name"]

    async def run(config: Config) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with run_daemon(config) as (service, url), aiohttp.ClientSession() as http:
            flushed = await post_and_flush(http, url, name, bodies)
            rows = await asyncio.to_thread(_committed_rows, service, name)
        return flushed, sorted(rows, key=lambda r: r["id"])

    with tempfile.TemporaryDirectory() as directory:
        config = make_config(
            catalog={
                "uri": f"sqlite:///{directory}/catalog.db",
                "warehouse": f"file://{directory}/warehouse",
            },
            spool={"dir": f"{directory}/spool"},
            defaults=WRITER_SETTINGS,
            tables=[{"create": True, **table}],
        )
        return asyncio.run(run(config))


def _committed_rows(service: Icespool, name: str) -> list[dict[str, Any]]:
    """Every row of the data files pyiceberg plans for a scan of ``name``, read by pyarrow.

    Not ``scan().to_arrow()`` for the values: pyiceberg 0.12 reads a null list or map of
    structs back as an empty one (its projection drops the validity), which would hide
    whether the encoder kept the null. Its scan must still see every row.
    """
    assert service._catalog is not None
    table = service._catalog.load_table(name)
    rows: list[dict[str, Any]] = []
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            rows += pq.read_table(stream).to_pylist()
    scanned = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert sorted(scanned) == sorted(row["id"] for row in rows)
    return rows


def _assert_rows_equal(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    # The first differing row, not a diff of 20,000 rows.
    assert len(got) == len(expected), f"{len(got)} rows read back, {len(expected)} sent"
    for row, want in zip(got, expected, strict=True):
        assert row == want, f"row {want['id']}: read back {row!r}, sent {want!r}"


_SHAPES = st.lists(nodes(), min_size=1, max_size=5).map(
    lambda found: [Column(f"c{i}", node) for i, node in enumerate(found)]
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # No shrinking: every example is 20,000+ rows, and shrinking one took minutes.
    # The failing shape is reported as drawn.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(shape=every_type(), partitioned=True)
@given(shape=_SHAPES, partitioned=st.booleans())
def test_every_type_at_volume_round_trips_through_http_ndjson_and_arrow(
    make_config: MakeConfig, run_daemon: RunDaemon, shape: list[Column], partitioned: bool
) -> None:
    ids = range(2 * ROWS)
    values = {column.name: column_values(column.node, list(ids)) for column in shape}
    table = {
        "name": TABLE,
        "schema": columns(shape),
        # bucket(id) scatters rows: partitions are taken, not sliced.
        "partition_by": ["bucket(3, id)"] if partitioned else [],
    }
    flushed, got = _send_flush_read(make_config, run_daemon, table, http_bodies(shape, values))

    assert flushed["records"] == 2 * ROWS
    _assert_rows_equal(
        got, [{"id": i} | {name: column[i] for name, column in values.items()} for i in ids]
    )


# ------------------------------------------------------------------ the documented shop.orders


def _readme_table(name: str) -> dict[str, Any]:
    """The ``[[tables]]`` entry named ``name`` from the configuration page's TOML examples."""
    text = CONFIG_DOC.read_text()
    for block in text.split("```toml")[1:]:
        parsed = tomllib.loads(block.split("```")[0])
        for table in parsed.get("tables", []):
            if table["name"] == name:
                return dict(table)
    raise AssertionError(f"docs/configuration.md has no [[tables]] example named {name}")


def test_readme_shop_orders_flush_of_2000_mostly_distinct_rows(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    """Issue 11 item 3 as reported: the documented shop.orders (a uuid inside a struct)
    and a flush of >= 1,000 rows with mostly distinct columns answered 500 forever."""
    table = _readme_table("shop.orders")
    assert "uuid not null" in str(table["schema"])  # the shape the bug needs
    count = 2_000
    base_ms = 1_714_521_600_000  # 2024-05-01T00:00:00Z
    lines, expected = [], []
    for i in range(count):
        buyer = uuid.UUID(int=i * 0x9E3779B97F4A7C15 % 2**128)
        lines.append(
            f'{{"id":{i},"ts":{base_ms + i * 97_000},"amount":"{i}.{i % 100:02d}",'
            f'"tags":["t{i % 5}","n{i}"],"attrs":[{{"key":"k","value":{i}}}],'
            f'"buyer":{{"id":"{buyer}","name":"buyer {i}","addr":{{"city":"c{i % 7}"}}}}}}\n'
        )
        expected.append(
            {
                "id": i,
                "ts": dt.datetime.fromtimestamp((base_ms + i * 97_000) / 1000, dt.UTC),
                "amount": Decimal(f"{i}.{i % 100:02d}"),
                "tags": [f"t{i % 5}", f"n{i}"],
                "attrs": [("k", i)],
                "buyer": {"id": buyer, "name": f"buyer {i}", "addr": {"city": f"c{i % 7}"}},
            }
        )
    flushed, got = _send_flush_read(
        make_config, run_daemon, table, [("".join(lines).encode(), NDJSON)]
    )
    assert flushed["records"] == count and flushed["snapshot_id"] is not None
    _assert_rows_equal(got, expected)


# ------------------------------------------------------------------ defence in depth


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    warehouse = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": tmp_path.as_uri()}
    return load_catalog("outside", {"type": "sql", **warehouse})


_OUTSIDE: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "local", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "t", "type": "time"},
]


def _encode(table: Table, batch: pa.Table) -> list[DataFile]:
    return encode_data_files(
        table,
        [conform(batch, arrow_schema_for(table))],
        target_file_size=1 << 20,
        row_group_records=1000,
        compression="zstd",
        file_prefix="seg",
    )


def _table(catalog: Catalog, name: str, partition_by: list[str]) -> Table:
    schema = parse_schema(_OUTSIDE)
    spec = parse_partition_spec(schema, partition_by)
    return ensure_table(catalog, name, schema, spec, {}, create=True)


_MICROS = [-(2**62), 0, 2**62, -62_167_219_200_000_000]  # the last: 0000-01-01T00:00:00
_DAYS = [-(2**30), 0, 2**30, -719_528]
_TIMES = [0, 2**40, 86_399_999_999, 1]
_BEYOND = pa.table(
    {
        "id": pa.array(range(4), pa.int64()),
        "ts": pa.array(_MICROS, pa.int64()).cast(pa.timestamp("us", "UTC")),
        "local": pa.array(_MICROS, pa.int64()).cast(pa.timestamp("us")),
        "day": pa.array(_DAYS, pa.int32()).cast(pa.date32()),
        "t": pa.array(_TIMES, pa.int64()).cast(pa.time64("us")),
    }
)


def test_values_outside_pythons_calendar_lose_their_bounds_not_the_commit(
    catalog: Catalog,
) -> None:
    """Decode refuses such values; if one gets through anyway (an old spool, a future
    decode bug), the encoder still writes and commits it, without the statistics
    bounds that Python cannot compute (year 0, -2**62 us) or would get wrong (a time
    past midnight wraps around)."""
    table = _table(catalog, "x.outside", [])
    (data_file,) = _encode(table, _BEYOND)
    commit_files(table, [data_file], segment_ids=["seg"], summary={})

    ids = {field.name: field.field_id for field in table.schema().fields}
    assert set(data_file.lower_bounds) == set(data_file.upper_bounds) == {ids["id"]}
    assert data_file.value_counts == dict.fromkeys(ids.values(), 4)
    assert data_file.null_value_counts == dict.fromkeys(ids.values(), 0)
    read = catalog.load_table("x.outside").scan().to_arrow().sort_by("id")
    assert read.column("id").to_pylist() == list(range(4))
    assert pc.cast(read.column("ts"), pa.int64()).to_pylist() == _MICROS
    assert pc.cast(read.column("local"), pa.int64()).to_pylist() == _MICROS
    assert pc.cast(read.column("day"), pa.int32()).to_pylist() == _DAYS
    assert pc.cast(read.column("t"), pa.int64()).to_pylist() == _TIMES


def test_a_partition_value_pyiceberg_cannot_commit_is_a_schema_error_naming_the_column(
    catalog: Catalog,
) -> None:
    """pyiceberg writes every partition value as text (paths, snapshot summary): a day
    in year 0 can never be committed. The encoder says so, naming the column, instead
    of an OverflowError out of every commit attempt."""
    table = _table(catalog, "x.partitioned", ["day(ts)"])
    with pytest.raises(SchemaError) as info:
        _encode(table, _BEYOND)
    assert info.value.column == "ts"
    assert info.value.problem.startswith(
        "partition value ts_day=-53375996 cannot be committed by pyiceberg"
    )
    # Nothing half-written is left behind.
    assert not list(Path(table.location().removeprefix("file://")).rglob("*.parquet"))


def test_in_range_temporal_edges_keep_exact_bounds(catalog: Catalog) -> None:
    """The guard above costs nothing at the range edges decode accepts: year 1 and
    9999, negative epochs and the last microsecond of a day keep exact bounds."""
    table = _table(catalog, "x.edges", [])
    schema = table.schema()
    low = dt.datetime(1, 1, 1)
    high = dt.datetime(9999, 12, 31, 23, 59, 59, 999_999)
    batch = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "ts": pa.array(
                [low.replace(tzinfo=dt.UTC), high.replace(tzinfo=dt.UTC), None],
                pa.timestamp("us", "UTC"),
            ),
            "local": pa.array(
                [low, dt.datetime(1969, 12, 31, 23, 59, 59), high], pa.timestamp("us")
            ),
            "day": pa.array([dt.date.min, dt.date(1969, 12, 31), dt.date.max], pa.date32()),
            "t": pa.array([dt.time(0), dt.time(23, 59, 59, 999_999), None], pa.time64("us")),
        }
    )
    (data_file,) = _encode(table, batch)

    def bound(bounds: dict[int, bytes], name: str) -> int:
        return int.from_bytes(bounds[schema.find_field(name).field_id], "little", signed=True)

    us_low, us_high = -62_135_596_800_000_000, 253_402_300_799_999_999
    assert [bound(data_file.lower_bounds, n) for n in ("ts", "local", "day", "t")] == [
        us_low,
        us_low,
        -719_162,
        0,
    ]
    assert [bound(data_file.upper_bounds, n) for n in ("ts", "local", "day", "t")] == [
        us_high,
        us_high,
        2_932_896,
        86_399_999_999,
    ]
