"""Equality deletes turned into position deletes by maintenance (icespool.maintenance
plan/write/commit_conversion): the merged state is exactly the same after, no equality
delete is left, and a rewrite by another writer in between makes the conversion wait.

Real SQLite SQL catalog, local warehouse; change sets committed as equality-delete
upserts (support/cdc_tables.py); the state read by the test's row-by-row reader.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table
from support.cdc_tables import commit_changes, delete_files, merged_rows
from support.maintenance_helpers import INCARNATION, sql_catalog

from icespool.cdc import read_merged
from icespool.iceberg import ReplaceConflictError
from icespool.iceberg._catalog import ensure_table
from icespool.maintenance import (
    IoBudget,
    commit_conversion,
    commit_rewrite,
    plan_compaction,
    plan_conversion,
    rewrite,
    write_conversion,
)
from icespool.schema import parse_partition_spec, parse_schema
from icespool.spool import new_uuid7

KEY = ("region", "id")
COLUMNS: list[dict[str, object]] = [
    {"name": "region", "type": "string", "required": True},
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
]


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return sql_catalog(tmp_path)


def _table(catalog: Catalog, partition_by: list[str]) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, partition_by)
    return ensure_table(catalog, "m.conv", schema, spec, {}, create=True)


def _changes(table: Table, rounds: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    universe = [(r, i) for r in ("eu", "us") for i in range(80)]
    for n in range(rounds):
        touched = rng.sample(universe, 30)
        cut = rng.randrange(len(touched) + 1)
        ups, dels = touched[:cut], touched[cut:]
        commit_changes(
            table,
            pa.table(
                {
                    "region": [r for r, _ in ups],
                    "id": [i for _, i in ups],
                    "payload": [f"{r}{i}-{n}" for r, i in ups],
                }
            )
            if ups
            else None,
            pa.table({"region": [r for r, _ in dels], "id": [i for _, i in dels]})
            if dels
            else None,
            KEY,
        )


def _convert(table: Table) -> Any:
    table.refresh()
    conversion = plan_conversion(table, budget=IoBudget(None))
    assert conversion is not None
    files = write_conversion(
        table, conversion, file_prefix=f"c-{new_uuid7()}-{INCARNATION}-pos", compression="zstd"
    )
    return conversion, files


@pytest.mark.parametrize("partition_by", [[], ["bucket(4, id)", "region"]])
def test_equality_deletes_become_position_deletes_and_the_state_stays(
    catalog: Catalog, partition_by: list[str]
) -> None:
    table = _table(catalog, partition_by)
    _changes(table, 12)
    before = merged_rows(table, KEY)
    spark_like = read_merged(table).sort_by([("region", "ascending"), ("id", "ascending")])
    assert any(f.content == DataFileContent.EQUALITY_DELETES for f in delete_files(table))
    conversion, files = _convert(table)
    result = commit_conversion(table, conversion, files)
    snapshot = table.metadata.snapshot_by_id(result.snapshot_id)
    assert snapshot is not None and snapshot.summary.operation.value == "replace"
    kinds = {f.content for f in delete_files(table)}
    assert kinds == {DataFileContent.POSITION_DELETES}
    assert merged_rows(table, KEY) == before
    after = read_merged(table).sort_by([("region", "ascending"), ("id", "ascending")])
    assert after.equals(spark_like)
    # Nothing left to convert.
    assert plan_conversion(table, budget=IoBudget(None)) is None


def test_a_rewrite_in_between_makes_the_conversion_wait(catalog: Catalog) -> None:
    table = _table(catalog, [])
    _changes(table, 6)
    before = merged_rows(table, KEY)
    conversion, files = _convert(table)
    # Another writer compacts the files the equality deletes applied to.
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
    compacted = table.metadata.current_snapshot()
    with pytest.raises(ReplaceConflictError):
        commit_conversion(table, conversion, files)
    table.refresh()
    assert table.metadata.current_snapshot() == compacted  # nothing committed
    assert merged_rows(table, KEY) == before


def test_equality_deletes_that_delete_nothing_live_are_just_removed(catalog: Catalog) -> None:
    table = _table(catalog, [])
    commit_changes(table, None, pa.table({"region": ["eu"], "id": [1]}), KEY)
    commit_changes(table, pa.table({"region": ["eu"], "id": [2], "payload": ["x"]}), None, KEY)
    conversion, files = _convert(table)
    assert files == [] and conversion.located.rows == 0
    commit_conversion(table, conversion, files)
    assert delete_files(table) == []
    assert set(merged_rows(table, KEY)) == {("eu", 2)}
