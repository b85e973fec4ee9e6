"""A sample of the generated type matrix (tests/iceberg/test_encode_matrix.py) read through Spark.

The explicit shape with every type Spark can load (all but ``time``), nested uuids and
the temporal range edges, and a few shapes hypothesis draws from the same generator
(map keys Spark can hand to Python as dict keys: no binaries): the
in-process daemon takes 4,000 rows of each as NDJSON and Arrow over HTTP (above the
encoder's 1,000-row dictionary heuristic, several row groups and files), and the
shared Spark session reads each table back through the Iceberg runtime.

Temporal values are compared as numbers computed by Spark (``unix_micros``,
``unix_date``), nested ones too: pyspark's own conversion to ``datetime`` fails for
year 1 (``datetime.fromtimestamp`` raises), which is a pyspark limit, not the table's.
``ICESPOOL_SPARK_ENCODE_EXAMPLES`` (default 2) sets how many drawn tables.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import os
from typing import Any

import aiohttp
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from support.fixture_types import MakeConfig, RunDaemon
from support.matrix_values import (
    MAP_KEYS,
    PRIMITIVES,
    Column,
    Node,
    column_values,
    columns,
    every_type,
    http_bodies,
    nodes,
    post_and_flush,
)

ROWS = 4_000
EXAMPLES = int(os.environ.get("ICESPOOL_SPARK_ENCODE_EXAMPLES", "2"))
_KINDS = tuple(kind for kind in PRIMITIVES if kind != "time")
_KEYS = tuple(kind for kind in MAP_KEYS if kind != "fixed")
_SHAPES = st.lists(nodes(_KINDS, _KEYS), min_size=1, max_size=5).map(
    lambda found: [Column(f"c{i}", node) for i, node in enumerate(found)]
)
_EPOCH = dt.datetime(1970, 1, 1)
_tables = itertools.count()


def _select(node: Node, expression: str, depth: int = 0) -> str:
    """A Spark SQL expression of ``expression`` with every temporal value, at any
    depth, turned into its number (micros or days since the epoch)."""
    kind, var = node.kind, f"x{depth}"
    if kind == "timestamptz":
        return f"unix_micros({expression})"
    if kind == "timestamp":  # TIMESTAMP_NTZ: its wall clock read as UTC (session zone)
        return f"unix_micros(cast({expression} AS TIMESTAMP))"
    if kind == "date":
        return f"unix_date({expression})"
    if kind == "struct":
        fields = ", ".join(
            f"'{name}', {_select(child, f'{expression}.{name}', depth + 1)}"
            for name, child in node.children
        )
        return f"if({expression} IS NULL, NULL, named_struct({fields}))"
    if kind == "list":
        element = _select(node.children[0][1], var, depth + 1)
        return f"transform({expression}, {var} -> {element})"
    if kind == "map":
        key = _select(node.children[0][1], f"{var}.key", depth + 1)
        value = _select(node.children[1][1], f"{var}.value", depth + 1)
        entries = f"transform(map_entries({expression}), {var} -> struct({key}, {value}))"
        return f"if({expression} IS NULL, NULL, map_from_entries({entries}))"
    return expression


def _expected(node: Node, value: Any) -> Any:
    """``value`` (as pyiceberg reads it) in the form the ``_select`` row holds."""
    if value is None:
        return None
    kind = node.kind
    if kind == "timestamptz":
        return (value - _EPOCH.replace(tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    if kind == "timestamp":
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    if kind == "date":
        return (value - _EPOCH.date()).days
    if kind == "uuid":
        return str(value)
    if kind in ("fixed", "binary"):
        return bytearray(value)
    if kind == "struct":
        return {name: _expected(child, value[name]) for name, child in node.children}
    if kind == "list":
        return [_expected(node.children[0][1], v) for v in value]
    if kind == "map":
        key, item = node.children[0][1], node.children[1][1]
        return {_expected(key, k): _expected(item, v) for k, v in value}
    return value


def _plain(value: Any) -> Any:
    """A Spark value with Rows as dicts (Row equality ignores field names)."""
    if isinstance(value, Row):
        return {name: _plain(v) for name, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # No shrinking: each example is a table read by Spark.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(shape=every_type(_KINDS))
@given(shape=_SHAPES)
def test_generated_schemas_at_volume_read_back_through_spark(
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    spark: Any,
    register: Any,
    catalog_name: str,
    shape: list[Column],
) -> None:
    table = f"matrix.t{next(_tables)}"
    config = make_config(
        catalog={"name": catalog_name},
        defaults={"target_file_size": "128KiB", "row_group_records": 1_000},
        tables=[{"name": table, "create": True, "schema": columns(shape)}],
    )
    values = {column.name: column_values(column.node, list(range(ROWS))) for column in shape}

    async def write() -> dict[str, Any]:
        async with run_daemon(config) as (_, url), aiohttp.ClientSession() as http:
            return await post_and_flush(http, url, table, http_bodies(shape, values))

    assert asyncio.run(write())["records"] == ROWS

    name = register(config)
    selected = ", ".join(["id", *(f"{_select(c.node, c.name)} AS {c.name}" for c in shape)])
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        got = spark.sql(f"SELECT {selected} FROM {name}.{table} ORDER BY id").collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone)

    assert len(got) == ROWS
    for row in got:
        want = {"id": row.id} | {c.name: _expected(c.node, values[c.name][row.id]) for c in shape}
        assert _plain(row) == want, f"row {row.id}"
    assert [row.id for row in got] == list(range(ROWS))
