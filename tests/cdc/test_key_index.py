"""The key index (icespool.cdc.KeyIndex) against real tables: after every kind of change
another writer makes (upserts with equality deletes, position deletes, appends of
duplicate keys, compactions that rewrite files at an older sequence number, rollbacks,
a table replaced under the same name), it names exactly the live rows of each key,
checked against the test's own row-by-row reader and by reading each named row back
from its data file.

Real SQLite SQL catalog and local warehouse.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from support.cdc_tables import (
    assert_index_exact,
    commit_changes,
    commit_position_deletes,
    merged_rows,
)
from support.maintenance_helpers import INCARNATION, local_path, sql_catalog

from icespool.cdc import IndexUnavailableError, KeyIndex, key_values, read_merged
from icespool.iceberg import commit_files, encode_position_deletes
from icespool.iceberg._catalog import ensure_table
from icespool.maintenance import IoBudget, commit_rewrite, plan_compaction, rewrite
from icespool.schema import parse_partition_spec, parse_schema
from icespool.spool import new_uuid7

COLUMNS: list[dict[str, object]] = [
    {"name": "region", "type": "string", "required": True},
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
]
KEY = ("region", "id")


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return sql_catalog(tmp_path)


def _table(
    catalog: Catalog, partition_by: list[str] | None = None, key: tuple[str, ...] = KEY
) -> Table:
    columns = COLUMNS
    schema = parse_schema(columns)
    spec = parse_partition_spec(schema, partition_by or [])
    return ensure_table(catalog, "k.users", schema, spec, {}, create=True)


def _index(tmp_path: Path, table: Table, key: tuple[str, ...] = KEY, name: str = "idx") -> KeyIndex:
    schema = table.metadata.schema()
    ids = [schema.find_field(column).field_id for column in key]
    return KeyIndex(tmp_path / f"{name}.sqlite3", ids, cache_bytes=1 << 20)


_ARROW = pa.schema(
    [
        pa.field("region", pa.string(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("payload", pa.string()),
    ]
)


def _rows(keys: list[tuple[str, int]], tag: str) -> pa.Table:
    return pa.table(
        {
            "region": [r for r, _ in keys],
            "id": [i for _, i in keys],
            "payload": [f"{r}-{i}-{tag}" for r, i in keys],
        },
        schema=_ARROW,
    )


def _keys(keys: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"region": [r for r, _ in keys], "id": [i for _, i in keys]})


def test_follows_upserts_position_deletes_and_rewrites(catalog: Catalog, tmp_path: Path) -> None:
    table = _table(catalog)
    index = _index(tmp_path, table)
    rng = random.Random(3)
    universe = [(r, i) for r in ("eu", "us") for i in range(60)]
    for n in range(12):
        touched = rng.sample(universe, 25)
        cut = rng.randrange(len(touched) + 1)
        commit_changes(
            table,
            _rows(touched[:cut], f"v{n}") if cut else None,
            _keys(touched[cut:]) if cut < len(touched) else None,
            KEY,
        )
        if n % 3 == 2:
            # Another engine's merge-on-read delete: a position delete of a live row.
            table.refresh()
            located = index.locate(key_values([pa.array(["eu"]), pa.array([n])]))
            if located.rows:
                commit_position_deletes(table, dict(located.positions))
        if n % 4 == 3:
            # A compaction: every file rewritten with the deletes applied (removed and
            # added, at the sequence number it started from), the delete files dropped.
            table.refresh()
            (plan,) = plan_compaction(table, target_file_size=1 << 20, max_bytes=1 << 30)
            new = rewrite(
                table,
                plan,
                budget=IoBudget(None),
                row_group_records=10_000,
                compression="zstd",
                incarnation=INCARNATION,
            )
            commit_rewrite(table, plan, new)
        assert_index_exact(index, table, KEY)


def test_a_restarted_index_catches_up_from_its_file(catalog: Catalog, tmp_path: Path) -> None:
    table = _table(catalog, ["bucket(4, id)"])
    index = _index(tmp_path, table)
    commit_changes(table, _rows([("eu", i) for i in range(50)], "a"), None, KEY)
    assert_index_exact(index, table, KEY)
    at = index.snapshot_id
    index.close()
    commit_changes(table, _rows([("eu", i) for i in range(0, 50, 2)], "b"), _keys([("eu", 1)]), KEY)
    reopened = _index(tmp_path, table)
    assert reopened.snapshot_id == at  # kept on disk: only the new snapshot is read
    assert_index_exact(reopened, table, KEY)


def test_a_rollback_or_another_table_rebuilds(catalog: Catalog, tmp_path: Path) -> None:
    table = _table(catalog)
    index = _index(tmp_path, table)
    first = commit_changes(table, _rows([("eu", i) for i in range(20)], "a"), None, KEY)
    commit_changes(table, _rows([("us", i) for i in range(20)], "b"), None, KEY)
    assert_index_exact(index, table, KEY)
    table.refresh()
    table.manage_snapshots().rollback_to_snapshot(first).commit()
    assert_index_exact(index, table, KEY)  # the index's snapshot is no ancestor: rebuilt
    catalog.drop_table("k.users")
    other = _table(catalog)
    commit_changes(other, _rows([("ap", 1)], "c"), None, KEY)
    assert_index_exact(index, other, KEY)  # another table under the same name


def test_duplicate_keys_written_by_another_engine_are_all_named(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = _table(catalog)
    index = _index(tmp_path, table)
    table.append(_rows([("eu", 1), ("eu", 2)], "a"))
    table.append(_rows([("eu", 1)], "b"))  # no delete: the key is live twice
    table.refresh()
    index.sync(table)
    located = index.locate(key_values([pa.array(["eu"]), pa.array([1])]))
    assert located.rows == 2 and len(located.positions) == 2


def test_an_unreadable_data_file_makes_the_index_unavailable(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = _table(catalog)
    index = _index(tmp_path, table)
    commit_changes(table, _rows([("eu", 1)], "a"), None, KEY)
    table.refresh()
    index.sync(table)
    table.append(_rows([("eu", 2)], "b"))
    table.refresh()
    added = list(local_path(table.location()).rglob("*.parquet"))
    newest = max(added, key=lambda p: p.stat().st_mtime_ns)
    good = newest.read_bytes()
    newest.write_bytes(b"not parquet")
    before = index.snapshot_id
    with pytest.raises(IndexUnavailableError, match="cannot read the keys"):
        index.sync(table)
    # Nothing half-applied: the index is still at the snapshot it had.
    assert (index.snapshot_id, index.rows()) == (before, 1)
    newest.write_bytes(good)
    assert_index_exact(index, table, KEY)


_SAMPLES: dict[str, list[Any]] = {
    "uuid": [uuid.UUID(int=i * 7919) for i in range(40)],
    "decimal(20, 3)": [Decimal(i * 1001).scaleb(-3) - Decimal("17.5") for i in range(40)],
    "date": [dt.date(1, 1, 1) + dt.timedelta(days=i * 9000) for i in range(40)],
    "timestamptz": [
        dt.datetime(1969, 12, 31, tzinfo=dt.UTC) + dt.timedelta(microseconds=i * 977)
        for i in range(40)
    ],
    "fixed(3)": [bytes([i, 255 - i, 7]) for i in range(40)],
    "binary": [bytes(range(i)) for i in range(40)],
    "string": ["", *(f"k{i}\u00e9" for i in range(39))],
    "int": [-(2**31), 2**31 - 1, *range(38)],
}


@pytest.mark.parametrize("kind", sorted(_SAMPLES))
def test_every_key_type_is_found_again(catalog: Catalog, tmp_path: Path, kind: str) -> None:
    schema = parse_schema(
        [{"name": "k", "type": kind, "required": True}, {"name": "v", "type": "long"}]
    )
    table = ensure_table(
        catalog, "k.typed", schema, parse_partition_spec(schema, []), {}, create=True
    )
    samples = _SAMPLES[kind]
    arrow = pa.table({"k": samples, "v": list(range(len(samples)))})
    commit_changes(table, arrow, None, ("k",))
    commit_changes(table, arrow.slice(0, 10), arrow.slice(30).select(["k"]), ("k",))
    index = _index(tmp_path, table, ("k",), name="typed")
    assert_index_exact(index, table, ("k",))


@pytest.mark.parametrize("partition_by", [[], ["bucket(3, id)", "region"]])
def test_position_deletes_of_located_rows_delete_exactly_them(
    catalog: Catalog, tmp_path: Path, partition_by: list[str]
) -> None:
    table = _table(catalog, partition_by)
    index = _index(tmp_path, table)
    every = [(r, i) for r in ("eu", "us") for i in range(40)]
    commit_changes(table, _rows(every, "a"), None, KEY)
    commit_changes(table, _rows(every[::3], "b"), None, KEY)
    table.refresh()
    index.sync(table)
    gone = every[::2]
    located = index.locate(
        key_values([pa.array([r for r, _ in gone]), pa.array([i for _, i in gone])])
    )
    files = encode_position_deletes(
        table, located, file_prefix=f"{new_uuid7()}-pos0", compression="zstd"
    )
    # One file per data file named, file-scoped: its file_path bounds are that whole
    # path, and it carries that data file's partition.
    assert set(files) == set(located.positions)
    for path, delete_file in files.items():
        assert delete_file.lower_bounds[2147483546].decode() == path
        assert delete_file.upper_bounds[2147483546].decode() == path
        assert delete_file.partition == located.files[path].file.partition
        assert delete_file.record_count == len(located.positions[path])
    commit_files(table, list(files.values()), segment_ids=[new_uuid7()], summary={})
    expected = {(r, i) for r, i in every if (r, i) not in set(gone)}
    assert set(merged_rows(table, KEY)) == expected
    assert {(r["region"], r["id"]) for r in read_merged(table).to_pylist()} == expected
    assert_index_exact(index, table, KEY)


@given(
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=12), st.text(max_size=6)),
        max_size=60,
    )
)
def test_key_values_are_one_per_key(rows: list[tuple[int, bytes, str]]) -> None:
    """Distinct keys get distinct values, equal keys equal ones (composite keys are
    joined with their lengths, so no two run together)."""
    columns = [
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1] for r in rows], pa.binary()),
        pa.array([r[2] for r in rows], pa.string()),
    ]
    values = key_values(columns)
    assert len(values) == len(rows)
    assert len(set(values)) == len(set(rows))
    by_key = dict(zip(rows, values, strict=True))
    assert all(by_key[r] == v for r, v in zip(rows, values, strict=True))


def test_key_values_do_not_depend_on_the_arrow_type_of_a_column() -> None:
    ints = [-(2**31), 0, 256, 2**31 - 1]
    assert key_values([pa.array(ints, pa.int32())]) == key_values([pa.array(ints, pa.int64())])
    text = ["", "a", "\u00e9"]
    assert key_values([pa.array(text, pa.string())]) == key_values(
        [pa.array(text, pa.large_string())]
    )
    raw = [uuid.UUID(int=7).bytes]
    assert key_values([pa.array(raw, pa.binary(16))]) == key_values(
        [pa.ExtensionArray.from_storage(pa.uuid(), pa.array(raw, pa.binary(16)))]
    )
