"""Property-based round trip through Spark (issue #7): hypothesis generates records for
every primitive type Spark can load (all but ``time``) plus a nested struct holding a
list and a map; the in-process daemon takes them as NDJSON over real HTTP and as Arrow
through ``writer.append``, commits them in one snapshot, and the shared local Spark
session reads them back through the catalog, compared exactly."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import itertools
from typing import Any

import aiohttp
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from support.json_values import b64_json, decimal_json, dumps, storage_type

from icespool.http import NDJSON
from icespool.schema import arrow_schema_for, parse_schema

D = decimal.Decimal
TABLE = "h.matrix"


def _micros(value: dt.datetime) -> int:
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (value - epoch) // dt.timedelta(microseconds=1)


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_INSTANTS = st.datetimes(min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9000, 1, 1))
_OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_DEC_10_2 = st.decimals(min_value=D("-99999999.99"), max_value=D("99999999.99"), places=2)
_DEC_38_0 = st.decimals(min_value=D(-(10**38) + 1), max_value=D(10**38 - 1), places=0)
_DEC_38_38 = st.decimals(min_value=D("-0." + "9" * 38), max_value=D("0." + "9" * 38), places=38)
_STRUCT = st.fixed_dictionaries(
    {
        "a": st.integers(-(2**31), 2**31 - 1),
        "tags": st.none() | st.lists(st.none() | _TEXT, max_size=3),
        "m": st.dictionaries(_TEXT, st.none() | _DEC_10_2, max_size=3),
    }
)


def _struct_text(value: dict[str, Any]) -> str:
    entries = ",".join(
        f'{{"key":{dumps(k)},"value":{"null" if v is None else decimal_json(v)}}}'
        for k, v in value["m"].items()
    )
    return f'{{"a":{value["a"]},"tags":{dumps(value["tags"])},"m":[{entries}]}}'


def _ident(value: Any) -> Any:
    return value


# column -> (type, strategy, JSON text, Arrow value, what Spark returns, SELECT expression)
MATRIX: dict[str, tuple[str, Any, Any, Any, Any, str]] = {
    "b": ("boolean", st.booleans(), dumps, _ident, _ident, "b"),
    "i": ("int", st.integers(-(2**31), 2**31 - 1), dumps, _ident, _ident, "i"),
    "l": ("long", st.integers(-(2**63), 2**63 - 1), dumps, _ident, _ident, "l"),
    "f": (
        "float",
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        dumps,
        _ident,
        _ident,
        "f",
    ),
    "d": ("double", st.floats(allow_nan=False, allow_infinity=False), dumps, _ident, _ident, "d"),
    "dec": ("decimal(10,2)", _DEC_10_2, decimal_json, _ident, _ident, "dec"),
    "dec38": ("decimal(38,0)", _DEC_38_0, decimal_json, _ident, _ident, "dec38"),
    "frac38": ("decimal(38,38)", _DEC_38_38, decimal_json, _ident, _ident, "frac38"),
    "day": ("date", st.dates(), lambda v: dumps(v.isoformat()), _ident, _ident, "day"),
    # timestamp (no zone) is Spark's TIMESTAMP_NTZ: a naive datetime, wall clock as sent.
    "ts": ("timestamp", _INSTANTS, lambda v: dumps(v.isoformat()), _ident, _ident, "ts"),
    # timestamptz is an instant: compared as microseconds since the epoch (PySpark would
    # otherwise shift it into the Python process's zone).
    "tstz": (
        "timestamptz",
        st.builds(lambda d, tz: d.replace(tzinfo=tz), _INSTANTS, _OFFSETS),
        lambda v: dumps(v.isoformat()),
        _ident,
        _micros,
        "unix_micros(tstz)",
    ),
    "s": ("string", _TEXT, dumps, _ident, _ident, "s"),
    "u": ("uuid", st.uuids(), lambda v: dumps(str(v)), lambda v: v.bytes, str, "u"),
    "fx": ("fixed[5]", st.binary(min_size=5, max_size=5), b64_json, _ident, bytearray, "fx"),
    "bin": ("binary", st.binary(max_size=20), b64_json, _ident, bytearray, "bin"),
    "st": (
        "struct<a: int not null, tags: list<string>, m: map<string, decimal(10,2)>>",
        _STRUCT,
        _struct_text,
        lambda v: {**v, "m": list(v["m"].items())},
        lambda v: Row(a=v["a"], tags=v["tags"], m=v["m"]),
        "st",
    ),
}
COLUMNS: list[dict[str, object]] = [{"name": "id", "type": "long", "required": True}] + [
    {"name": name, "type": spec[0]} for name, spec in MATRIX.items()
]
SELECT = ", ".join(["id", *(spec[5] for spec in MATRIX.values())])
ROWS = st.lists(
    st.fixed_dictionaries({name: st.none() | spec[1] for name, spec in MATRIX.items()}),
    min_size=1,
    max_size=4,
)
ARROW_SCHEMA = arrow_schema_for(parse_schema(COLUMNS))


def _ndjson(first_id: int, rows: list[dict[str, Any]]) -> bytes:
    lines = []
    for offset, row in enumerate(rows):
        parts = [f'"id":{first_id + offset}']
        parts += [f'"{name}":{MATRIX[name][2](v)}' for name, v in row.items() if v is not None]
        lines.append("{" + ",".join(parts) + "}\n")
    return "".join(lines).encode()


def _arrow(first_id: int, rows: list[dict[str, Any]]) -> pa.Table:
    data = {"id": pa.array(range(first_id, first_id + len(rows)), pa.int64())}
    for name, spec in MATRIX.items():
        values = [None if row[name] is None else spec[3](row[name]) for row in rows]
        data[name] = pa.array(values, storage_type(ARROW_SCHEMA.field(name).type))
    return pa.table(data)


def _expected(first_id: int, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            first_id + offset,
            *(None if row[name] is None else spec[4](row[name]) for name, spec in MATRIX.items()),
        )
        for offset, row in enumerate(rows)
    ]


_examples = itertools.count()


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=ROWS)
def test_every_spark_type_round_trips_through_the_daemon_into_spark(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
    rows: list[dict[str, Any]],
) -> None:
    # One catalog and table for every example (a daemon starts per example); each
    # example owns an id range: NDJSON rows from base, Arrow rows from base + 100.
    base = next(_examples) * 1000
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": TABLE, "create": True, "schema": COLUMNS}],
    )

    async def write() -> int:
        async with run_daemon(config) as (service, url), aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/v1/tables/{TABLE}/records",
                data=_ndjson(base, rows),
                headers={"Content-Type": NDJSON},
            ) as response:
                assert response.status == 200, await response.text()
            await service.writer(TABLE).append(_arrow(base + 100, rows))
            result = await service.flush(TABLE)
            return result.records

    assert asyncio.run(write()) == 2 * len(rows)

    name = register(config)
    got = spark.sql(
        f"SELECT {SELECT} FROM {name}.{TABLE} WHERE id >= {base} AND id < {base + 1000} ORDER BY id"
    ).collect()
    assert [tuple(r) for r in got] == _expected(base, rows) + _expected(base + 100, rows)
    # Row equality ignores the struct's field names: check them too.
    assert [r.st.asDict() if r.st else None for r in got] == [
        None if row["st"] is None else row["st"] for row in rows + rows
    ]
