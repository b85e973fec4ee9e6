"""Last change per key wins, whole-batch: icespool.cdc.last_changes and
apply_equality_deletes against a per-record reference computed here."""

from __future__ import annotations

import random
import time
from typing import Any

import pyarrow as pa
import pytest

from icespool.cdc import (
    DELETE,
    OP_COLUMN,
    UPSERT,
    apply_equality_deletes,
    change_schema,
    conform_changes,
    last_changes,
    with_ops,
)
from icespool.errors import BadInputError, SchemaError

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "1"}),
        pa.field("region", pa.string(), nullable=False, metadata={"PARQUET:field_id": "2"}),
        pa.field("name", pa.string(), nullable=False, metadata={"PARQUET:field_id": "3"}),
        pa.field("score", pa.int64(), metadata={"PARQUET:field_id": "4"}),
    ]
)
KEY = ("id", "region")


def changes(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """A change batch from dicts with an "op" entry ("u" or "d")."""
    ops = pa.array([UPSERT if r["op"] == "u" else DELETE for r in rows], pa.int8())
    data = pa.Table.from_pylist(
        [{k: v for k, v in r.items() if k != "op"} for r in rows],
        schema=change_schema(SCHEMA, KEY).remove(4),
    )
    return with_ops(data, ops, KEY)


def state(resolved_upserts: pa.Table) -> dict[tuple[int, str], tuple[str, int | None]]:
    return {(r["id"], r["region"]): (r["name"], r["score"]) for r in resolved_upserts.to_pylist()}


def test_delete_then_insert_of_one_key_in_one_chunk_keeps_the_insert() -> None:
    batch = changes(
        [
            {"op": "u", "id": 1, "region": "eu", "name": "old", "score": 1},
            {"op": "d", "id": 1, "region": "eu", "name": None, "score": None},
            {"op": "u", "id": 1, "region": "eu", "name": "new", "score": 2},
        ]
    )
    resolved = last_changes([batch], SCHEMA, KEY)
    assert state(resolved.upserts) == {(1, "eu"): ("new", 2)}
    assert resolved.keys.to_pylist() == [{"id": 1, "region": "eu"}]
    assert resolved.changes == 3


def test_insert_then_delete_of_one_key_in_one_chunk_leaves_only_the_delete() -> None:
    first = changes([{"op": "u", "id": 7, "region": "us", "name": "x", "score": None}])
    second = changes([{"op": "d", "id": 7, "region": "us", "name": None, "score": None}])
    resolved = last_changes([first, second], SCHEMA, KEY)
    assert resolved.upserts.num_rows == 0
    assert resolved.keys.to_pylist() == [{"id": 7, "region": "us"}]
    assert OP_COLUMN not in resolved.upserts.schema.names


def test_multi_column_keys_are_distinct_per_combination() -> None:
    batch = changes(
        [
            {"op": "u", "id": 1, "region": "eu", "name": "a", "score": 1},
            {"op": "u", "id": 1, "region": "us", "name": "b", "score": 2},
            {"op": "u", "id": 2, "region": "eu", "name": "c", "score": 3},
            {"op": "d", "id": 1, "region": "us", "name": None, "score": None},
            {"op": "u", "id": 1, "region": "eu", "name": "a2", "score": 4},
        ]
    )
    resolved = last_changes([batch], SCHEMA, KEY)
    assert state(resolved.upserts) == {(1, "eu"): ("a2", 4), (2, "eu"): ("c", 3)}
    assert sorted((k["id"], k["region"]) for k in resolved.keys.to_pylist()) == [
        (1, "eu"),
        (1, "us"),
        (2, "eu"),
    ]


def test_plain_rows_are_upserts_and_mix_with_change_batches_in_spool_order() -> None:
    plain = pa.RecordBatch.from_pylist(
        [{"id": 1, "region": "eu", "name": "plain", "score": 1}], schema=SCHEMA
    )
    delete = changes([{"op": "d", "id": 1, "region": "eu", "name": None, "score": None}])
    again = pa.RecordBatch.from_pylist(
        [{"id": 1, "region": "eu", "name": "again", "score": 2}], schema=SCHEMA
    )
    assert state(last_changes([plain, delete], SCHEMA, KEY).upserts) == {}
    assert state(last_changes([plain, delete, again], SCHEMA, KEY).upserts) == {
        (1, "eu"): ("again", 2)
    }


def test_a_batch_spooled_before_a_column_was_added_resolves_with_newer_ones() -> None:
    old_schema = SCHEMA.remove(3)  # before "score" was added
    old = pa.RecordBatch.from_pylist([{"id": 5, "region": "eu", "name": "o"}], schema=old_schema)
    new = changes([{"op": "u", "id": 6, "region": "eu", "name": "n", "score": 9}])
    resolved = last_changes([old, new], SCHEMA, KEY)
    assert state(resolved.upserts) == {(5, "eu"): ("o", None), (6, "eu"): ("n", 9)}


def test_ten_thousand_changes_over_a_hundred_keys_match_a_per_record_reference() -> None:
    rng = random.Random(100)
    rows: list[dict[str, Any]] = []
    for i in range(10_000):
        key = rng.randrange(100)
        region = "eu" if key % 2 else "us"
        if rng.random() < 0.35:
            rows.append({"op": "d", "id": key, "region": region, "name": None, "score": None})
        else:
            rows.append({"op": "u", "id": key, "region": region, "name": f"v{i}", "score": i})
    batches = [changes(rows[i : i + 1_000]) for i in range(0, len(rows), 1_000)]
    expected: dict[tuple[int, str], tuple[str, int | None]] = {}
    for row in rows:  # the reference: one record at a time, in order
        if row["op"] == "d":
            expected.pop((row["id"], row["region"]), None)
        else:
            expected[(row["id"], row["region"])] = (row["name"], row["score"])
    started = time.perf_counter()
    resolved = last_changes(batches, SCHEMA, KEY)
    elapsed = time.perf_counter() - started
    assert state(resolved.upserts) == expected
    assert resolved.upserts.num_rows == len(expected)  # one row per surviving key
    touched = {(r["id"], r["region"]) for r in rows}
    assert {(k["id"], k["region"]) for k in resolved.keys.to_pylist()} == touched
    assert resolved.keys.num_rows == len(touched) == 100
    assert resolved.changes == 10_000
    assert elapsed < 1.0, f"{elapsed:.3f}s for 10,000 changes: not whole-batch any more?"


def test_apply_equality_deletes_drops_matching_keys_and_keeps_order() -> None:
    data = pa.Table.from_pylist(
        [
            {"id": 3, "region": "eu", "name": "c", "score": 1},
            {"id": 1, "region": "eu", "name": "a", "score": 2},
            {"id": 1, "region": "us", "name": "b", "score": 3},
            {"id": 2, "region": "eu", "name": "d", "score": 4},
        ],
        schema=SCHEMA,
    )
    deletes = pa.table({"id": pa.array([1, 2, 9], pa.int32()), "region": ["eu", "eu", "eu"]})
    kept = apply_equality_deletes(data, deletes, KEY)
    assert [(r["id"], r["region"]) for r in kept.to_pylist()] == [(3, "eu"), (1, "us")]
    assert apply_equality_deletes(data, deletes.slice(0, 0), KEY) is data


def test_conform_changes_rejects_a_null_key_naming_the_column() -> None:
    rows = pa.table({"id": [1, None], "region": ["eu", "eu"], "name": ["a", "b"]})
    with pytest.raises(BadInputError, match="key column 'id' is null in 1 of 2 rows"):
        conform_changes(rows, SCHEMA, KEY)
    batch = changes([{"op": "d", "id": 1, "region": "eu", "name": None, "score": None}])
    nulled = batch.set_column(1, "region", pa.array([None], pa.string()))
    with pytest.raises(BadInputError, match="key column 'region'"):
        conform_changes(nulled, SCHEMA, KEY)


def test_conform_changes_rejects_an_upsert_without_a_required_column_and_bad_ops() -> None:
    batch = changes([{"op": "u", "id": 1, "region": "eu", "name": "x", "score": None}])
    no_name = batch.set_column(2, "name", pa.array([None], pa.string()))
    with pytest.raises(SchemaError, match=r"column 'name'.*upsert at row 0"):
        conform_changes(no_name, SCHEMA, KEY)
    # The same row as a delete is fine: deletes carry only their key.
    as_delete = no_name.set_column(4, OP_COLUMN, pa.array([DELETE], pa.int8()))
    assert conform_changes(as_delete, SCHEMA, KEY).num_rows == 1
    bad_op = batch.set_column(4, OP_COLUMN, pa.array([2], pa.int8()))
    with pytest.raises(BadInputError, match="holds 2 at row 0"):
        conform_changes(bad_op, SCHEMA, KEY)
