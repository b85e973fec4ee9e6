"""Table declarations -> Iceberg schema/spec, Arrow schema, and batch conformance."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from daemon.catalogs import ensure_table, load_catalog
from daemon.errors import CatalogError, SchemaError
from daemon.table_schema import (
    FIELD_ID_KEY,
    arrow_schema_for,
    conform,
    parse_partition_spec,
    parse_schema,
    parse_type,
)

ALL_TYPES: list[dict[str, object]] = [
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long", "required": True, "doc": "the id"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "dec", "type": "decimal(10, 2)"},
    {"name": "day", "type": "date"},
    {"name": "t", "type": "time"},
    {"name": "ts", "type": "timestamp"},
    {"name": "tstz", "type": "timestamptz"},
    {"name": "s", "type": "string"},
    {"name": "u", "type": "uuid"},
    {"name": "fx", "type": "fixed(4)"},
    {"name": "bin", "type": "binary"},
]


def test_parse_schema_assigns_ids_types_required_and_doc() -> None:
    schema = parse_schema(ALL_TYPES)
    assert [(f.field_id, f.name) for f in schema.fields] == [
        (n, str(c["name"])) for n, c in enumerate(ALL_TYPES, start=1)
    ]
    assert [f.field_type for f in schema.fields] == [
        BooleanType(),
        IntegerType(),
        LongType(),
        FloatType(),
        DoubleType(),
        DecimalType(10, 2),
        DateType(),
        TimeType(),
        TimestampType(),
        TimestamptzType(),
        StringType(),
        UUIDType(),
        FixedType(4),
        BinaryType(),
    ]
    assert schema.find_field("l") == NestedField(3, "l", LongType(), required=True, doc="the id")
    assert [f.name for f in schema.fields if f.required] == ["l"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("LONG", LongType()),
        ("decimal(38,0)", DecimalType(38, 0)),
        (" decimal( 5 , 5 ) ", DecimalType(5, 5)),
        ("fixed[16]", FixedType(16)),
    ],
)
def test_parse_type_spellings(text: str, expected: object) -> None:
    assert parse_type(text) == expected


@pytest.mark.parametrize(
    ("columns", "column", "fragment"),
    [
        ([{"name": "a", "type": "text"}], "a", "unknown type 'text'"),
        ([{"name": "a", "type": "decimal(39,2)"}], "a", "precision must be 1..38"),
        ([{"name": "a", "type": "decimal(4,5)"}], "a", "scale 5 exceeds precision 4"),
        ([{"name": "a", "type": "fixed(0)"}], "a", "fixed length"),
        ([{"name": "a", "type": "struct<x: int>"}], "a", "nested type"),
        ([{"name": "a", "type": 3}], "a", "'type' must be"),
        ([{"name": "a", "type": "long", "required": "yes"}], "a", "'required' must be"),
        ([{"name": "a", "type": "long", "nullable": True}], "a", "unknown key(s) ['nullable']"),
        ([{"name": "a", "type": "long"}, {"name": "A", "type": "int"}], "A", "duplicate"),
        ([{"type": "long"}], "#1", "non-empty string 'name'"),
        ([], "?", "at least one column"),
    ],
)
def test_parse_schema_errors_name_the_column(
    columns: list[dict[str, object]], column: str, fragment: str
) -> None:
    with pytest.raises(SchemaError) as info:
        parse_schema(columns)
    assert info.value.column == column
    assert fragment in info.value.problem


def test_parse_partition_spec_all_transforms() -> None:
    schema = parse_schema(
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "ts", "type": "timestamptz"},
            {"name": "d", "type": "date"},
            {"name": "kind", "type": "string"},
            {"name": "region", "type": "string"},
            {"name": "t2", "type": "timestamp"},
            {"name": "d2", "type": "date"},
        ]
    )
    spec = parse_partition_spec(
        schema,
        [
            "day(ts)",
            "bucket(16, id)",
            "truncate(3,kind)",
            "region",
            "year(d)",
            "hour(t2)",
            "identity( d2 )",
        ],
    )
    assert list(spec.fields) == [
        PartitionField(2, 1000, DayTransform(), "ts_day"),
        PartitionField(1, 1001, BucketTransform(16), "id_bucket"),
        PartitionField(4, 1002, TruncateTransform(3), "kind_trunc"),
        PartitionField(5, 1003, IdentityTransform(), "region"),
        PartitionField(3, 1004, YearTransform(), "d_year"),
        PartitionField(6, 1005, HourTransform(), "t2_hour"),
        PartitionField(7, 1006, IdentityTransform(), "d2"),
    ]
    month = parse_partition_spec(schema, ["month(ts)"])
    assert list(month.fields) == [PartitionField(2, 1000, MonthTransform(), "ts_month")]
    assert parse_partition_spec(schema, []).is_unpartitioned()


@pytest.mark.parametrize(
    ("expression", "column", "fragment"),
    [
        ("nope", "nope", "no such column"),
        ("day(nope)", "nope", "no such column"),
        ("hour(d)", "d", "cannot be applied to date"),
        ("day(kind)", "kind", "cannot be applied to string"),
        ("bucket(0, id)", "bucket(0, id)", "bucket needs a positive number first"),
        ("bucket(x, id)", "bucket(x, id)", "not a partition field"),
        ("bucket(id)", "bucket(id)", "e.g. 'bucket(16, id)'"),
        ("truncate(-1, kind)", "truncate(-1, kind)", "not a partition field"),
        ("week(ts)", "week(ts)", "unknown transform 'week'"),
        ("day(ts, id)", "day(ts, id)", "not a partition field"),
        ("a b", "a b", "not a partition field"),
        ("", "", "not a partition field"),
    ],
)
def test_parse_partition_errors_name_column_or_expression(
    expression: str, column: str, fragment: str
) -> None:
    schema = parse_schema(
        [
            {"name": "id", "type": "long"},
            {"name": "ts", "type": "timestamptz"},
            {"name": "d", "type": "date"},
            {"name": "kind", "type": "string"},
        ]
    )
    with pytest.raises(SchemaError) as info:
        parse_partition_spec(schema, [expression])
    assert info.value.column == column
    assert fragment in info.value.problem


def test_parse_partition_rejects_redundant_transforms_of_one_column() -> None:
    schema = parse_schema([{"name": "ts", "type": "timestamptz"}])
    with pytest.raises(SchemaError) as info:
        parse_partition_spec(schema, ["day(ts)", "hour(ts)"])
    assert info.value.column == "ts"
    assert "already partitioned by 'day(ts)'" in info.value.problem


def test_arrow_schema_plain_types_ids_and_nullability() -> None:
    arrow = arrow_schema_for(parse_schema(ALL_TYPES))
    assert [(f.name, f.type, f.nullable) for f in arrow] == [
        ("b", pa.bool_(), True),
        ("i", pa.int32(), True),
        ("l", pa.int64(), False),
        ("f", pa.float32(), True),
        ("d", pa.float64(), True),
        ("dec", pa.decimal128(10, 2), True),
        ("day", pa.date32(), True),
        ("t", pa.time64("us"), True),
        ("ts", pa.timestamp("us"), True),
        ("tstz", pa.timestamp("us", tz="UTC"), True),
        ("s", pa.string(), True),
        ("u", pa.uuid(), True),
        ("fx", pa.binary(4), True),
        ("bin", pa.binary(), True),
    ]
    assert [f.metadata[FIELD_ID_KEY] for f in arrow] == [
        str(n).encode() for n in range(1, len(ALL_TYPES) + 1)
    ]


def _event_schema() -> pa.Schema:
    return arrow_schema_for(
        parse_schema(
            [
                {"name": "id", "type": "long", "required": True},
                {"name": "ts", "type": "timestamptz"},
                {"name": "kind", "type": "string"},
                {"name": "amount", "type": "decimal(10,2)"},
                {"name": "u", "type": "uuid"},
            ]
        )
    )


def test_conform_reorders_casts_and_fills_missing_optionals() -> None:
    target = _event_schema()
    u = uuid.UUID("0f0e0d0c-0b0a-0908-0706-050403020100")
    source = pa.table(
        {
            "kind": pa.array(["a", None], pa.large_string()),
            "u": pa.array([u.bytes, None], pa.binary(16)),
            "ts": pa.array([dt.datetime(2024, 5, 1, 12, 0), None], pa.timestamp("ms")),
            "id": pa.array([1, 2], pa.int32()),
        }
    )
    out = conform(source, target)
    assert out.schema == target
    assert out.schema.equals(target, check_metadata=True)
    assert out.to_pydict() == {
        "id": [1, 2],
        "ts": [dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC), None],
        "kind": ["a", None],
        "amount": [None, None],
        "u": [u, None],
    }


def test_conform_accepts_an_already_conforming_batch_unchanged() -> None:
    target = _event_schema()
    batch = pa.RecordBatch.from_pylist(
        [{"id": 7, "ts": None, "kind": "x", "amount": decimal.Decimal("1.25"), "u": None}],
        schema=target,
    )
    out = conform(batch, target)
    assert out.equals(batch)
    assert out.num_rows == 1


@pytest.mark.parametrize(
    ("columns", "column", "fragment"),
    [
        ({"kind": ["a"]}, "id", "required column is missing"),
        ({"id": [1], "extra": [1]}, "extra", "not in the table schema"),
        ({"id": pa.array([1, None], pa.int64())}, "id", "1 null value(s) (first at row 1)"),
        ({"id": ["x"]}, "id", "cannot convert string to int64"),
        ({"id": [2**40], "amount": [decimal.Decimal("123456789.5")]}, "amount", "cannot convert"),
        ({"id": [1], "kind": [1.5]}, "kind", "cannot convert double to string: only text"),
        ({"id": [1], "ts": ["2024-01-02T03:04:05Z"], "kind": [True]}, "kind", "only text"),
        ({"id": [1], "ts": ["not a time"]}, "ts", "cannot convert string to timestamp"),
        (
            {
                "id": [1],
                "ts": pa.array([1], pa.timestamp("us", tz="Europe/Paris")).cast(pa.int64()),
            },
            "ts",
            "cannot convert int64",
        ),
    ],
)
def test_conform_errors_name_the_column(
    columns: dict[str, object], column: str, fragment: str
) -> None:
    with pytest.raises(SchemaError) as info:
        conform(pa.table(columns), _event_schema())
    assert info.value.column == column
    assert fragment in info.value.problem


def test_conform_int_overflow_is_an_error_not_a_wrap() -> None:
    target = arrow_schema_for(parse_schema([{"name": "n", "type": "int"}]))
    with pytest.raises(SchemaError) as info:
        conform(pa.table({"n": [2**40]}), target)
    assert info.value.column == "n"
    assert "cannot convert int64 to int32" in info.value.problem


def test_conform_by_field_id_follows_a_rename() -> None:
    old = arrow_schema_for(
        parse_schema([{"name": "id", "type": "long"}, {"name": "a", "type": "string"}])
    )
    new = arrow_schema_for(
        parse_schema([{"name": "id", "type": "long"}, {"name": "b", "type": "string"}])
    )
    batch = pa.RecordBatch.from_pydict({"id": [1], "a": ["v"]}, schema=old)
    assert conform(batch, new, match_field_ids=True).to_pydict() == {"id": [1], "b": ["v"]}
    with pytest.raises(SchemaError) as info:
        conform(batch, new)
    assert info.value.column == "a"


def test_ensure_table_creates_then_validates(tmp_path: Path) -> None:
    catalog = load_catalog(
        "c",
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/deep/dir/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse",
        },
    )
    assert (tmp_path / "deep" / "dir" / "catalog.db").exists()
    declared: list[dict[str, object]] = [
        {"name": "id", "type": "long", "required": True},
        {"name": "n", "type": "int"},
        {"name": "ts", "type": "timestamptz"},
    ]
    schema = parse_schema(declared)
    spec = parse_partition_spec(schema, ["day(ts)"])
    with pytest.raises(CatalogError, match="does not exist"):
        ensure_table(catalog, "demo.events", schema, spec, {}, create=False)
    table = ensure_table(catalog, "demo.events", schema, spec, {"owner": "me"}, create=True)
    assert table.schema() == schema
    assert table.spec().fields == spec.fields
    assert table.properties["owner"] == "me"
    again = ensure_table(catalog, "demo.events", schema, spec, {}, create=False)
    assert again.metadata.table_uuid == table.metadata.table_uuid

    # A narrower declared type is fine (values are widened); a different type is not.
    narrower = parse_schema([{"name": "id", "type": "int", "required": True}])
    ensure_table(catalog, "demo.events", narrower, spec, {}, create=False)
    mismatches: list[tuple[list[dict[str, object]], str, str]] = [
        (
            [{"name": "id", "type": "string", "required": True}],
            "id",
            "declared as string but table demo.events has long",
        ),
        ([{"name": "id", "type": "long"}], "id", "declared optional but required"),
        ([{"name": "ts", "type": "timestamptz"}], "id", "required in table demo.events"),
        (
            [*declared, {"name": "new", "type": "string"}],
            "new",
            "missing from existing table demo.events",
        ),
    ]
    for columns, column, fragment in mismatches:
        with pytest.raises(SchemaError) as info:
            ensure_table(catalog, "demo.events", parse_schema(columns), spec, {}, create=True)
        assert info.value.column == column
        assert fragment in info.value.problem


def test_load_catalog_errors_are_catalog_errors() -> None:
    with pytest.raises(CatalogError, match="check the \\[catalog\\] settings"):
        load_catalog("c", {"type": "sql"})
