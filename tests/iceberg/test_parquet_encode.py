"""Parquet encoding of flushes into Iceberg data files (real SQLite catalog, local FileIO)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    FixedType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.iceberg._parquet import encode_data_files, partition_transform
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

MB = 1024 * 1024
DAY_US = 86_400_000_000
BASE_US = 1_714_521_600_000_000  # 2024-05-01T00:00:00Z


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return load_catalog(
        "enc",
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse",
        },
    )


def _table(
    catalog: Catalog,
    columns: list[dict[str, object]],
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
    name: str = "demo.events",
) -> Table:
    schema = parse_schema(columns)
    spec = parse_partition_spec(schema, partition_by)
    return ensure_table(catalog, name, schema, spec, properties or {}, create=True)


_DOUBLES: list[dict[str, object]] = [{"name": f"x{i}", "type": "double"} for i in range(6)]
WIDE: list[dict[str, object]] = [{"name": "id", "type": "long", "required": True}, *_DOUBLES]


def _wide_batch(table: Table, rows: int, start: int = 0) -> pa.RecordBatch:
    # Uniform random doubles do not compress, so on-disk size is predictable (~8 B/value).
    columns: dict[str, Any] = {"id": pc.add(_range(rows), start)}
    for i in range(6):
        columns[f"x{i}"] = pc.random(rows)
    return conform(pa.table(columns), arrow_schema_for(table))


def _range(rows: int) -> pa.Array:
    return pc.indices_nonzero(pc.fill_null(pa.nulls(rows, pa.bool_()), True)).cast(pa.int64())


def _bound(iceberg_type: IcebergType, raw: bytes) -> Any:
    return from_bytes(iceberg_type, raw)  # type: ignore[arg-type]


def _metadata(table: Table, data_file: DataFile) -> pq.FileMetaData:
    with table.io.new_input(data_file.file_path).open() as stream:
        return pq.read_metadata(stream)


def _read(table: Table, data_file: DataFile) -> pa.Table:
    with table.io.new_input(data_file.file_path).open() as stream:
        return pq.read_table(stream)


def test_large_flush_rolls_files_at_target_size(catalog: Catalog) -> None:
    table = _table(catalog, WIDE)
    rows = 1_100_000
    batches = [_wide_batch(table, 100_000, start=i * 100_000) for i in range(rows // 100_000)]
    target = 8 * MB
    files = encode_data_files(
        table,
        batches,
        target_file_size=target,
        row_group_records=64_000,
        compression="zstd",
        file_prefix="seg-42",
    )
    sizes = [f.file_size_in_bytes for f in files]
    assert sum(sizes) > 40 * MB and len(files) >= 5  # enough files to see the rolling
    assert len(files) == -(-sum(sizes) // target)  # ceil: no file is wasted
    for size in sizes[:-1]:
        assert 0.95 * target <= size <= 1.02 * target, sizes
    assert sizes[-1] <= 1.02 * target
    assert sum(f.record_count for f in files) == rows
    assert [f.file_path.rsplit("/", 1)[1] for f in files] == [
        f"seg-42-00000-{n:05d}.parquet" for n in range(len(files))
    ]
    ids: list[pa.Array] = []
    for data_file in files:
        meta = _metadata(table, data_file)
        assert meta.num_rows == data_file.record_count
        assert all(meta.row_group(i).num_rows <= 64_000 for i in range(meta.num_row_groups))
        assert data_file.file_size_in_bytes == Path(data_file.file_path[7:]).stat().st_size
        ids.append(_read(table, data_file).column("id").combine_chunks())
    assert pa.concat_arrays(ids).equals(_range(rows))


@pytest.mark.parametrize(
    ("codec", "expected"),
    [
        ("zstd", "ZSTD"),
        ("snappy", "SNAPPY"),
        ("lz4_raw", "LZ4"),
        ("gzip", "GZIP"),
        ("none", "UNCOMPRESSED"),
    ],
)
def test_codec_is_honoured(catalog: Catalog, codec: str, expected: str) -> None:
    table = _table(catalog, WIDE)
    files = encode_data_files(
        table,
        [_wide_batch(table, 1000)],
        target_file_size=128 * MB,
        row_group_records=400,
        compression=codec,
        file_prefix="s1",
    )
    assert len(files) == 1
    meta = _metadata(table, files[0])
    assert meta.num_row_groups == 3
    codecs = {
        meta.row_group(r).column(c).compression
        for r in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    }
    assert codecs == {expected}


def test_table_write_properties_win(catalog: Catalog) -> None:
    table = _table(
        catalog,
        WIDE,
        properties={
            "write.parquet.compression-codec": "gzip",
            "write.parquet.row-group-limit": "300",
            "write.target-file-size-bytes": str(20_000),
        },
    )
    files = encode_data_files(
        table,
        [_wide_batch(table, 2000)],
        target_file_size=128 * MB,
        row_group_records=100_000,
        compression="zstd",
        file_prefix="s1",
    )
    assert len(files) > 1
    for data_file in files:
        meta = _metadata(table, data_file)
        assert meta.row_group(0).column(0).compression == "GZIP"
        assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) <= 300
    assert sum(f.record_count for f in files) == 2000


def test_day_partitions_split_with_partition_values_and_stats(catalog: Catalog) -> None:
    table = _table(
        catalog,
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "ts", "type": "timestamptz"},
            {"name": "kind", "type": "string"},
        ],
        ["day(ts)"],
    )
    rows = 3000
    ids = _range(rows)
    # Rows of the three days interleave, so the split must really regroup them.
    ts = pc.add(pc.multiply(pc.subtract(ids, pc.multiply(pc.divide(ids, 3), 3)), DAY_US), ids)
    kinds = pa.array(["a", "b", None] * (rows // 3))
    batch = conform(
        pa.table({"id": ids, "ts": ts.cast(pa.timestamp("us", tz="UTC")), "kind": kinds}),
        arrow_schema_for(table),
    )
    files = encode_data_files(
        table,
        [batch.slice(0, 1000), batch.slice(1000)],
        target_file_size=128 * MB,
        row_group_records=10_000,
        compression="zstd",
        file_prefix="seg-7",
    )
    # Groups come in order of first appearance: row 0 is day 0, row 1 day 1, ...
    assert [f.partition for f in files] == [Record(0), Record(1), Record(2)]
    by_day = {f.partition[0]: f for f in files}
    for day, data_file in sorted(by_day.items()):
        assert f"/ts_day=1970-01-0{day + 1}/" in data_file.file_path
        assert data_file.spec_id == table.spec().spec_id
        content = _read(table, data_file)
        expected_ids = [i for i in range(rows) if i % 3 == day]
        assert content.column("id").to_pylist() == expected_ids
        assert data_file.record_count == 1000
        # Column statistics: value and null counts, typed lower/upper bounds.
        assert data_file.value_counts == {1: 1000, 2: 1000, 3: 1000}
        assert data_file.null_value_counts == {1: 0, 2: 0, 3: 1000 if day == 2 else 0}
        assert _bound(LongType(), data_file.lower_bounds[1]) == expected_ids[0]
        assert _bound(LongType(), data_file.upper_bounds[1]) == expected_ids[-1]
        assert _bound(TimestamptzType(), data_file.lower_bounds[2]) == (
            day * DAY_US + expected_ids[0]
        )
        assert _bound(TimestamptzType(), data_file.upper_bounds[2]) == (
            day * DAY_US + expected_ids[-1]
        )
        if day < 2:
            letter = "ab"[day]
            assert _bound(StringType(), data_file.lower_bounds[3]) == letter
            assert _bound(StringType(), data_file.upper_bounds[3]) == letter
        else:
            assert 3 not in data_file.lower_bounds
        assert data_file.column_sizes is not None
        assert set(data_file.column_sizes) == {1, 2, 3}
        assert data_file.split_offsets == [4]


def test_field_ids_are_written_to_the_parquet_schema(catalog: Catalog) -> None:
    table = _table(catalog, WIDE)
    (data_file,) = encode_data_files(
        table,
        [_wide_batch(table, 10)],
        target_file_size=MB,
        row_group_records=10,
        compression="zstd",
        file_prefix="ids",
    )
    schema = _metadata(table, data_file).schema.to_arrow_schema()
    assert [f.metadata[b"PARQUET:field_id"] for f in schema] == [
        str(n).encode() for n in range(1, 8)
    ]
    assert not schema.field("id").nullable


def test_names_are_deterministic_and_prefixed(catalog: Catalog) -> None:
    table = _table(
        catalog,
        [{"name": "id", "type": "long"}, {"name": "kind", "type": "string"}],
        ["kind"],
    )
    batch = conform(pa.table({"id": [1, 2, 3], "kind": ["b", "a", "b"]}), arrow_schema_for(table))
    settings: dict[str, Any] = {
        "target_file_size": MB,
        "row_group_records": 100,
        "compression": "zstd",
    }
    first = encode_data_files(table, [batch], file_prefix="seg-1", **settings)
    again = encode_data_files(table, [batch], file_prefix="seg-1", **settings)
    other = encode_data_files(table, [batch], file_prefix="seg-2", **settings)
    assert [f.file_path for f in first] == [f.file_path for f in again]
    assert [f.file_path.split("/data/")[1] for f in first] == [
        "kind=b/seg-1-00000-00000.parquet",
        "kind=a/seg-1-00001-00000.parquet",
    ]
    assert not {f.file_path for f in first} & {f.file_path for f in other}
    assert [f.partition for f in first] == [Record("b"), Record("a")]


def test_empty_input_and_bad_arguments(catalog: Catalog) -> None:
    table = _table(catalog, WIDE)
    empty = _wide_batch(table, 0)
    settings: dict[str, Any] = {
        "target_file_size": MB,
        "row_group_records": 100,
        "compression": "zstd",
    }
    assert encode_data_files(table, [empty], file_prefix="x", **settings) == []
    with pytest.raises(ValueError, match=r"file_prefix '\.\./x'"):
        encode_data_files(table, [empty], file_prefix="../x", **settings)
    with pytest.raises(ValueError, match="unknown compression codec 'lzo'"):
        encode_data_files(
            table,
            [empty],
            file_prefix="x",
            target_file_size=MB,
            row_group_records=100,
            compression="lzo",
        )
    with pytest.raises(ValueError, match="target_file_size must be positive"):
        encode_data_files(
            table,
            [empty],
            file_prefix="x",
            target_file_size=0,
            row_group_records=100,
            compression="zstd",
        )


def _scalar_reference(
    transform: Transform[Any, Any], source: IcebergType, values: list[Any]
) -> list[Any]:
    function = transform.transform(source)
    return [None if v is None else function(v) for v in values]


_TS = [
    None,
    0,
    1,
    -1,
    BASE_US,
    BASE_US + 3_599_999_999,
    -DAY_US - 1,
    -86_400_000_000 * 366 * 3 + 17,
    253_402_300_799_999_999,  # 9999-12-31T23:59:59.999999
    -62_135_596_800_000_000,  # 0001-01-01
]
_DAYS = [None, 0, 1, -1, 19844, -719162, 2932896, 59, 60, -306]
_LONGS = [None, 0, 1, -1, 34, -34, 2**63 - 1, -(2**63), 123456789012, -9876543210]
_INTS = [None, 0, 1, -1, 34, -34, 2**31 - 1, -(2**31), 1234567, -7654321]
_STRINGS = [None, "", "iceberg", "ab", "héllo wörld", "😀😀😀x", "a" * 40, "iceberg"]
_UUIDS = [None, uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"), uuid.UUID(int=0)]
_DECIMALS = [None, decimal.Decimal("14.20"), decimal.Decimal("-0.05"), decimal.Decimal("99999.99")]


def _arrow(source: IcebergType, values: list[Any]) -> pa.Array:
    if isinstance(source, (TimestampType, TimestamptzType, TimestampNanoType)):
        unit = "ns" if isinstance(source, TimestampNanoType) else "us"
        tz = "UTC" if isinstance(source, TimestamptzType) else None
        return pa.array(values, pa.int64()).cast(pa.timestamp(unit, tz=tz))
    if isinstance(source, DateType):
        return pa.array(values, pa.int32()).cast(pa.date32())
    if isinstance(source, TimeType):
        return pa.array(values, pa.int64()).cast(pa.time64("us"))
    if isinstance(source, UUIDType):
        storage = pa.array([None if v is None else v.bytes for v in values], pa.binary(16))
        return pa.ExtensionArray.from_storage(pa.uuid(), storage)
    if isinstance(source, DecimalType):
        return pa.array(values, pa.decimal128(source.precision, source.scale))
    if isinstance(source, IntegerType):
        return pa.array(values, pa.int32())
    if isinstance(source, FixedType):
        return pa.array(values, pa.binary(len(source)))
    if isinstance(source, BinaryType):
        return pa.array(values, pa.binary())
    if isinstance(source, StringType):
        return pa.array(values, pa.string())
    return pa.array(values, pa.int64())


_CASES: list[tuple[Transform[Any, Any], IcebergType, list[Any]]] = [
    (YearTransform(), TimestamptzType(), _TS),
    (MonthTransform(), TimestamptzType(), _TS),
    (DayTransform(), TimestamptzType(), _TS),
    (HourTransform(), TimestamptzType(), _TS),
    (HourTransform(), TimestampType(), _TS),
    (YearTransform(), DateType(), _DAYS),
    (MonthTransform(), DateType(), _DAYS),
    (DayTransform(), DateType(), _DAYS),
    (BucketTransform(16), LongType(), _LONGS),
    (BucketTransform(7), IntegerType(), _INTS),
    (BucketTransform(1000), TimestamptzType(), _TS),
    (BucketTransform(5), TimestampNanoType(), [None, 1_000, -1_001, 1_714_521_600_123_456_789]),
    (BucketTransform(3), DateType(), _DAYS),
    (BucketTransform(9), TimeType(), [None, 0, 1, 86_399_999_999, 43_200_000_000]),
    (BucketTransform(16), StringType(), _STRINGS),
    (BucketTransform(16), UUIDType(), _UUIDS),
    (BucketTransform(16), DecimalType(7, 2), _DECIMALS),
    (BucketTransform(4), BinaryType(), [None, b"", b"\x00\x01", b"abc"]),
    (BucketTransform(4), FixedType(3), [None, b"\x00\x01\x02", b"abc"]),
    (TruncateTransform(10), LongType(), [*_LONGS[:6], 123456789012, -9876543210]),
    (TruncateTransform(10), IntegerType(), [*_INTS[:6], 1234567, -7654321]),
    (TruncateTransform(3), StringType(), _STRINGS),
    (TruncateTransform(2), BinaryType(), [None, b"", b"\x00\x01\x02", b"a"]),
    (TruncateTransform(50), DecimalType(7, 2), _DECIMALS),
]


@pytest.mark.parametrize(
    ("transform", "source", "values"),
    _CASES,
    ids=[f"{t}-{s}" for t, s, _ in _CASES],
)
def test_vectorized_transforms_match_pyiceberg_reference(
    transform: Transform[Any, Any], source: IcebergType, values: list[Any]
) -> None:
    got = partition_transform(transform, source, _arrow(source, values)).to_pylist()
    assert got == _scalar_reference(transform, source, values)


@pytest.mark.parametrize(
    ("source", "values", "physical"),
    [
        (DateType(), [None, 19844], [None, 19844]),
        (TimestamptzType(), [5, None], [5, None]),
        (TimeType(), [7], [7]),
        (UUIDType(), [uuid.UUID(int=5)], [uuid.UUID(int=5).bytes]),
        (StringType(), ["x"], ["x"]),
    ],
)
def test_identity_returns_physical_values(
    source: IcebergType, values: list[Any], physical: list[Any]
) -> None:
    got = partition_transform(IdentityTransform(), source, _arrow(source, values)).to_pylist()
    assert got == physical


def test_all_partition_transforms_write_readable_files(catalog: Catalog) -> None:
    table = _table(
        catalog,
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "ts", "type": "timestamp"},
            {"name": "d", "type": "date"},
            {"name": "kind", "type": "string"},
            {"name": "u", "type": "uuid"},
        ],
        ["bucket(4, id)", "hour(ts)", "month(d)", "truncate(2, kind)", "bucket(2, u)"],
    )
    u = uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")
    batch = conform(
        pa.table(
            {
                "id": [1, 2, 3, 4],
                "ts": [dt.datetime(2024, 5, 1, 10, 30)] * 2 + [dt.datetime(1969, 12, 31, 23)] * 2,
                "d": [dt.date(2024, 5, 1), None, dt.date(1969, 1, 31), dt.date(2024, 5, 1)],
                "kind": ["alpha", "alps", None, "beta"],
                "u": pa.array([u.bytes, None, u.bytes, None], pa.binary(16)),
            }
        ),
        arrow_schema_for(table),
    )
    files = encode_data_files(
        table,
        [batch],
        target_file_size=MB,
        row_group_records=100,
        compression="snappy",
        file_prefix="mix",
    )
    assert sum(f.record_count for f in files) == 4
    spec = table.spec()
    for data_file in files:
        content = _read(table, data_file)
        for row in content.to_pylist():
            expected = []
            for field in spec.fields:
                source = table.schema().find_field(field.source_id)
                value = _physical(source.field_type, row[source.name])
                expected.append(_scalar_reference(field.transform, source.field_type, [value])[0])
            assert Record(*expected) == data_file.partition, (row, data_file.partition)


def _physical(source: IcebergType, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(source, DateType):
        return (value - dt.date(1970, 1, 1)).days
    if isinstance(source, TimestampType):
        return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    return value


def test_mostly_distinct_columns_skip_the_dictionary_and_repeated_ones_keep_it(
    catalog: Catalog,
) -> None:
    columns: list[dict[str, object]] = [
        {"name": "id", "type": "long", "required": True},
        {"name": "kind", "type": "string"},
        {"name": "note", "type": "string"},
        {"name": "st", "type": "struct<tag: string, n: long>"},
    ]
    table = _table(catalog, columns)
    rows = 5_000
    data = pa.table(
        {
            "id": _range(rows),
            "kind": pa.array(["click", "view", "buy"] * (rows // 3) + ["click"] * (rows % 3)),
            "note": pa.array([f"note {i}" for i in range(rows)]),
            "st": pa.array([{"tag": "a", "n": i} for i in range(rows)]),
        }
    )
    files = encode_data_files(
        table,
        [conform(data, arrow_schema_for(table))],
        target_file_size=128 * MB,
        row_group_records=1 << 20,
        compression="zstd",
        file_prefix="dict",
    )
    meta = _metadata(table, files[0])
    group = meta.row_group(0)
    dictionary = {
        group.column(i).path_in_schema: group.column(i).dictionary_page_offset is not None
        for i in range(group.num_columns)
    }
    # Unique ids and notes: plain. Three kinds and the nested leaves: dictionary.
    assert dictionary == {"id": False, "kind": True, "note": False, "st.tag": True, "st.n": True}
    assert _read(table, files[0]).to_pylist() == data.to_pylist()
