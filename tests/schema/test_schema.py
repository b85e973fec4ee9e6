"""Table declarations -> Iceberg schema/spec, Arrow schema, and batch conformance."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField
from pyiceberg.table.sorting import NullOrder, SortDirection
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
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icespool.errors import CatalogError, SchemaError
from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.schema import (
    FIELD_ID_KEY,
    SchemaDifference,
    arrow_schema_for,
    conform,
    infer_schema,
    parse_partition_spec,
    parse_schema,
    parse_sort_order,
    parse_type,
    schema_diff,
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
        ([{"name": "a", "type": "decimal(39,2)"}], "a", "needs 1 <= P <= 38"),
        ([{"name": "a", "type": "decimal(4,5)"}], "a", "0 <= S <= P"),
        ([{"name": "a", "type": "fixed(0)"}], "a", "fixed length"),
        ([{"name": "a", "type": "struct<x int>"}], "a", "expected ':', found 'int'"),
        ([{"name": "a", "type": "list<int"}], "a", "the type ends too early"),
        ([{"name": "a", "type": "timestamp_ns"}], "a", "format version 3"),
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
        (
            [{"name": "id", "type": "long"}],
            "id",
            "id: declared optional but table demo.events has required",
        ),
        (
            [{"name": "ts", "type": "timestamptz"}],
            "id",
            "id: table demo.events has long not null, which is not declared",
        ),
        (
            [*declared, {"name": "new", "type": "string"}],
            "new",
            "new: declared as string but missing from table demo.events",
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


# ------------------------------------------------------------------ nested, sort, diff, infer


def test_nested_types_get_ids_after_the_top_level_columns() -> None:
    schema = parse_schema(
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "tags", "type": "list<string not null>"},
            {"name": "attrs", "type": "map<string, struct<a: int not null, b: double>>"},
        ]
    )
    assert [f.field_id for f in schema.fields] == [1, 2, 3]
    tags = schema.find_field("tags").field_type
    assert isinstance(tags, ListType) and tags.element_id == 4 and tags.element_required
    attrs = schema.find_field("attrs").field_type
    assert isinstance(attrs, MapType) and (attrs.key_id, attrs.value_id) == (5, 6)
    assert str(attrs.value_type) == "struct<7: a: required int, 8: b: optional double>"
    arrow = arrow_schema_for(schema)
    assert not arrow.field("tags").type.value_field.nullable


def test_sort_order_directions_nulls_and_transforms() -> None:
    schema = parse_schema(ALL_TYPES)
    order = parse_sort_order(schema, ["tstz", "l desc", "day(ts) asc nulls last"])
    assert [(f.source_id, str(f.transform), f.direction, f.null_order) for f in order.fields] == [
        (10, "identity", SortDirection.ASC, NullOrder.NULLS_FIRST),
        (3, "identity", SortDirection.DESC, NullOrder.NULLS_LAST),
        (9, "day", SortDirection.ASC, NullOrder.NULLS_LAST),
    ]
    with pytest.raises(SchemaError) as info:
        parse_sort_order(schema, ["nope desc"])
    assert info.value.column == "nope" and "no such column" in info.value.problem


def test_sort_order_and_properties_are_set_at_creation(tmp_path: Path) -> None:
    catalog = load_catalog(
        "c", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}"}
    )
    schema = parse_schema(ALL_TYPES)
    table = ensure_table(
        catalog,
        "ns.sorted",
        schema,
        parse_partition_spec(schema, []),
        {"write.parquet.compression-codec": "snappy"},
        create=True,
        sort_order=parse_sort_order(schema, ["l desc"]),
    )
    assert table.properties["write.parquet.compression-codec"] == "snappy"
    (field,) = table.sort_order().fields
    assert table.schema().find_column_name(field.source_id) == "l"
    assert field.direction == SortDirection.DESC


def test_schema_diff_reports_every_difference_with_its_path() -> None:
    existing = parse_schema(
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "n", "type": "long"},
            {"name": "st", "type": "struct<a: int not null, b: string>"},
            {"name": "gone", "type": "string"},
        ]
    )
    declared = parse_schema(
        [
            {"name": "id", "type": "long"},
            {"name": "n", "type": "int"},
            {"name": "st", "type": "struct<a: int, c: list<long>>"},
            {"name": "new", "type": "date", "required": True},
        ]
    )
    assert schema_diff(existing, declared) == [
        SchemaDifference("id", "required", "optional", "required", False),
        SchemaDifference("n", "type", "int", "long", True),
        SchemaDifference("st.a", "required", "optional", "required", False),
        SchemaDifference("st.c", "missing", "list<long>", None, False),
        SchemaDifference("st.b", "extra", None, "string", True),
        SchemaDifference("new", "missing", "date not null", None, False),
        SchemaDifference("gone", "extra", None, "string", True),
    ]
    assert schema_diff(existing, existing) == []


def test_infer_schema_from_arrow_types() -> None:
    arrow = pa.schema(
        [
            ("i8", pa.int8()),
            ("u32", pa.uint32()),
            ("f", pa.float32()),
            ("dec", pa.decimal128(12, 3)),
            ("ts", pa.timestamp("ms", "UTC")),
            ("u", pa.uuid()),
            ("fx", pa.binary(3)),
            ("s", pa.large_string()),
            ("l", pa.list_(pa.struct([("x", pa.int64())]))),
            ("m", pa.map_(pa.string(), pa.float64())),
        ]
    )
    schema = infer_schema(arrow)
    assert [str(f.field_type) for f in schema.fields] == [
        "int",
        "long",
        "float",
        "decimal(12, 3)",
        "timestamptz",
        "uuid",
        "fixed[3]",
        "string",
        "list<struct<12: x: optional long>>",
        "map<string, double>",
    ]
    assert not any(f.required for f in schema.fields)
    # The inferred schema is usable as is: arrow_schema_for and conform accept the batch.
    batch = pa.table({"l": [[{"x": 1}]], "m": pa.array([[("k", 1.5)]], arrow.field("m").type)})
    assert conform(batch, arrow_schema_for(schema)).column("l").to_pylist() == [[{"x": 1}]]
    for bad, fragment in [
        (pa.uint64(), "decimal(20,0)"),
        (pa.null(), "every value of the first batch is null"),
        (pa.timestamp("ns"), "format version 3"),
    ]:
        with pytest.raises(SchemaError) as info:
            infer_schema(pa.schema([("c", bad)]))
        assert info.value.column == "c" and fragment in info.value.problem


def test_conform_checks_nested_fields_by_path() -> None:
    target = arrow_schema_for(
        parse_schema([{"name": "st", "type": "struct<a: int not null, b: list<string>>"}])
    )
    ok = conform(pa.table({"st": [{"a": 1, "b": ["x"]}, None]}), target)
    assert ok.column("st").to_pylist() == [{"a": 1, "b": ["x"]}, None]
    for value, column, fragment in [
        ({"a": None}, "st.a", "required field is null"),
        ({"a": 1, "zz": 2}, "st.zz", "not in the table schema"),
        ({"a": 1, "b": [5]}, "st.b.element", "only text converts"),
    ]:
        with pytest.raises(SchemaError) as info:
            conform(pa.table({"st": [value]}), target)
        assert info.value.column == column and fragment in info.value.problem
