"""icespool.decode._keyed: Kafka records -> one change batch per table, unit level.

Every Debezium variant (JSON with and without Kafka Connect's schema envelope, Avro
through a real schema registry, Apicurio's Confluent-compatible API), keyed records,
tombstones, key type edges and poison; each test asserts the exact rows, ops, positions
and dead letters.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry
from support.kafka_harness import unique_name

from icespool.cdc import DELETE, OP_COLUMN, UPSERT, change_schema
from icespool.config import Config
from icespool.decode import Decoded, JsonOptions, Target, decoder_for
from icespool.decode._avro import avro_rows
from icespool.decode._avro_registry import RegistrySchemas
from icespool.decode._keyed import decode_changes
from icespool.decode._keyed_rows import json_envelopes, json_keys, string_keys
from icespool.errors import ConfigError
from icespool.kafka._fetch import Fetch

U, D = UPSERT, DELETE
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("qty", pa.int32(), nullable=False),
    ]
)
KEY = ("id",)


def j(value: Any) -> bytes:
    return json.dumps(value).encode()


def decode(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    *,
    schema: pa.Schema = SCHEMA,
    key: Sequence[str] = KEY,
    mode: str = "debezium",
    key_format: str = "json",
    max_record_bytes: int = 2**20,
    options: JsonOptions | None = None,
) -> Decoded:
    options = options or JsonOptions()
    keys = keys if keys is not None else [None] * len(values)
    key_rows = json_keys(key, schema, options) if key_format == "json" else string_keys(key, schema)
    return decode_changes(
        pa.array(values, pa.binary()),
        pa.array(keys, pa.binary()),
        schema,
        key,
        mode=mode,  # type: ignore[arg-type]
        envelopes=json_envelopes(options, ignore_unknown=mode == "debezium"),
        key_rows=key_rows,
        max_record_bytes=max_record_bytes,
    )


def rows(decoded: Decoded) -> list[dict[str, Any]]:
    assert decoded.batch is not None
    return decoded.batch.to_pylist()


def dead(decoded: Decoded) -> list[tuple[int, str]]:
    return [(d.index, d.reason) for d in decoded.dead]


def change(id_: int, name: str | None, qty: int | None, op: int) -> dict[str, Any]:
    return {"id": id_, "name": name, "qty": qty, OP_COLUMN: op}


# ------------------------------------------------------------------ Debezium JSON


def test_debezium_ops_c_r_u_d_and_tombstones_in_offset_order() -> None:
    source = {"version": "2.7", "connector": "postgresql", "lsn": 123, "db": "shop"}
    values = [
        j({"op": "r", "before": None, "after": {"id": 1, "name": "a", "qty": 1}, "source": source}),
        j({"op": "c", "after": {"id": 2, "name": "b", "qty": 2}, "ts_ms": 1, "transaction": None}),
        j({"op": "u", "before": {"id": 1}, "after": {"id": 1, "name": "a2", "qty": 3}}),
        j({"op": "d", "before": {"id": 2, "name": "b", "qty": 2}, "after": None}),
        None,  # Debezium's tombstone after the delete: a second delete of key 2
        j({"op": "d", "before": None}),  # before without the key: the Kafka key says
        b"",  # an empty value is a tombstone too
    ]
    keys = [j({"id": 1}), j({"id": 2}), j({"id": 1}), j({"id": 2}), j({"id": 2}), b"3", b"4"]
    decoded = decode(values, keys)
    assert rows(decoded) == [
        change(1, "a", 1, U),
        change(2, "b", 2, U),
        change(1, "a2", 3, U),
        change(2, None, None, D),  # a delete carries only its key
        change(2, None, None, D),
        change(3, None, None, D),
        change(4, None, None, D),
    ]
    assert decoded.rows.tolist() == list(range(7))
    assert decoded.dead == []
    assert decoded.batch is not None
    assert decoded.batch.schema == change_schema(SCHEMA, KEY)


def test_schema_envelope_is_detected_per_record_in_values_and_keys() -> None:
    schema_doc = {"type": "struct", "fields": [{"field": "id", "type": "int64"}], "name": "x"}
    values = [
        j({"schema": schema_doc, "payload": {"op": "c", "after": {"id": 5, "qty": 1}}}),
        j({"op": "c", "after": {"id": 6, "qty": 2}}),  # the plain form in the same fetch
        j({"schema": schema_doc, "payload": {"op": "d", "before": {"id": 5}, "source": {}}}),
        None,
        j({"schema": schema_doc, "payload": {"op": "d", "before": None}}),
    ]
    keys = [None, None, None, j({"schema": schema_doc, "payload": {"id": 6}}), j({"id": 7})]
    decoded = decode(values, keys)
    assert rows(decoded) == [
        change(5, None, 1, U),
        change(6, None, 2, U),
        change(5, None, None, D),
        change(6, None, None, D),
        change(7, None, None, D),
    ]
    assert decoded.dead == []


def test_before_is_read_for_its_key_only() -> None:
    """A delete needs only ``before``'s key columns: the rest of ``before`` is not
    parsed, so a value there the table could not hold harms nothing."""
    values = [
        j({"op": "u", "before": {"id": 1, "name": 5, "qty": "x"}, "after": {"id": 1, "qty": 2}}),
        j({"op": "d", "before": {"id": 1, "name": [1], "qty": None}}),
        j({"op": "d", "before": {"id": "one"}}),  # the key itself must convert
    ]
    decoded = decode(values)
    assert rows(decoded) == [change(1, None, 2, U), change(1, None, None, D)]
    assert dead(decoded) == [(2, "invalid")]
    assert decoded.dead[0].column == "id"


@pytest.mark.parametrize(
    ("value", "reason", "fragment"),
    [
        (j({"op": "t"}), "bad_change", "unknown op 't'"),
        (j({"op": "m", "after": {"id": 1, "qty": 1}}), "bad_change", "unknown op 'm'"),
        (j({"after": {"id": 1, "qty": 1}}), "bad_change", "has no 'op'"),
        (j({"op": "u", "before": {"id": 1}}), "bad_change", "without an 'after'"),
        (j({"op": "c", "after": "text"}), "bad_change", "'after' has the wrong type"),
        (j({"op": 3, "after": {"id": 1, "qty": 1}}), "bad_change", "'op' has the wrong type"),
        (j({"payload": [1]}), "bad_change", "'payload' has the wrong type"),
        (j([1, 2]), "invalid", "expected a JSON object"),
        (j("c"), "invalid", "expected a JSON object"),
        (b'{"op": "c", "after": {"id": 1', "invalid", ""),
        (b"   ", "invalid", "empty value"),
        (j({"op": "c", "after": {"id": "x", "qty": 1}}), "invalid", "column 'id'"),
        (j({"op": "c", "after": {"id": 1}}), "invalid", "column 'qty': required column"),
        (j({"op": "c", "after": {"id": 1, "qty": 2**40}}), "invalid", ""),
        (j({"op": "c", "after": {"qty": 1}}), "missing_key", "key column 'id'"),
    ],
)
def test_malformed_envelopes_are_dead_letters_naming_the_problem(
    value: bytes, reason: str, fragment: str
) -> None:
    good = j({"op": "c", "after": {"id": 9, "qty": 9}})
    decoded = decode([good, value, good])
    assert dead(decoded) == [(1, reason)]
    assert fragment in decoded.dead[0].error
    assert rows(decoded) == [change(9, None, 9, U)] * 2
    assert decoded.rows.tolist() == [0, 2]


def test_poison_values_oversized_deep_and_bad_utf8() -> None:
    good = j({"op": "c", "after": {"id": 1, "name": "ok", "qty": 1}})
    deep = b'{"op":"c","after":{"id":2,"qty":1,"name":' + b"[" * 200 + b"]" * 200 + b"}}"
    values = [
        good,
        j({"op": "c", "after": {"id": 3, "name": "x" * 600, "qty": 1}}),
        deep,
        b'{"op":"c","after":{"id":4,"name":"\xff\xfe","qty":1}}',
        b'{"op":"c","after":{"id":5,"name":"ok","qty":1},"source":{"db":"\xff"}}',
        good,
    ]
    decoded = decode(values, max_record_bytes=500, options=JsonOptions(max_depth=32))
    assert dead(decoded) == [(1, "oversized"), (2, "too_deep"), (3, "bad_utf8")]
    assert (
        decoded.dead[0].error == f"value of {len(values[1])} bytes exceeds max_record_bytes (500)"
    )
    # A bad byte inside a field no table column reads is skipped with that field.
    assert [r["id"] for r in rows(decoded)] == [1, 5, 1]


def test_nested_values_and_their_required_children() -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("point", pa.struct([pa.field("x", pa.int32(), nullable=False)])),
            pa.field("tags", pa.list_(pa.string())),
            pa.field("attrs", pa.map_(pa.string(), pa.int64())),
            pa.field("ts", pa.timestamp("us", "UTC")),
        ]
    )
    after = {
        "id": "k1",
        "point": {"x": 1},
        "tags": ["a", "b"],
        "attrs": [{"key": "n", "value": 1}],  # the daemon's JSON spelling of a map
        "ts": "2026-01-02T03:04:05.123456Z",
    }
    values = [
        j({"op": "c", "after": after}),
        j({"op": "u", "after": {"id": "k2", "point": {}}}),  # required child missing
        j({"op": "u", "after": {"id": "k3", "tags": [1]}}),
        j({"op": "d", "before": {"id": "k1", "point": None}}),
    ]
    decoded = decode(values, schema=schema)
    assert dead(decoded) == [(1, "invalid"), (2, "invalid")]
    assert decoded.dead[0].column == "point.x"
    assert decoded.dead[1].column is not None and decoded.dead[1].column.startswith("tags")
    got = rows(decoded)
    assert [(r["id"], r[OP_COLUMN]) for r in got] == [("k1", U), ("k1", D)]
    assert got[0]["point"] == {"x": 1} and got[0]["attrs"] == [("n", 1)]
    assert got[0]["ts"].isoformat() == "2026-01-02T03:04:05.123456+00:00"
    assert got[1]["point"] is None and got[1]["tags"] is None


# ------------------------------------------------------------------ keys


def test_key_type_edges_and_multi_column_keys() -> None:
    schema = pa.schema(
        [
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("n", pa.int32(), nullable=False),
            pa.field("v", pa.string()),
        ]
    )
    key = ("tenant", "n")
    values: list[bytes | None] = [None] * 9
    keys = [
        j({"tenant": "a", "n": 1}),
        b'  {"n": 2, "tenant": "b", "extra": true}',  # order, whitespace, extra field
        j({"tenant": "a"}),  # lacks n
        j({"tenant": "a", "n": 2**31}),  # beyond int32
        j({"tenant": "a", "n": "1"}),  # a string for an int
        b"7",  # a scalar cannot be a two-column key
        None,  # a tombstone without a key
        b'{"tenant": "a", "n": ',  # not JSON
        j({"schema": {}, "payload": {"tenant": "c", "n": -(2**31)}}),
    ]
    decoded = decode(values, keys, schema=schema, key=key)
    assert [(r["tenant"], r["n"], r[OP_COLUMN]) for r in rows(decoded)] == [
        ("a", 1, D),
        ("b", 2, D),
        ("c", -(2**31), D),
    ]
    assert decoded.rows.tolist() == [0, 1, 8]
    assert dead(decoded) == [
        (2, "missing_key"),
        (3, "bad_key"),
        (4, "bad_key"),
        (5, "bad_key"),
        (6, "missing_key"),
        (7, "bad_key"),
    ]
    assert "'n'" in decoded.dead[0].error
    assert "needs an object of them" in decoded.dead[3].error


def test_scalar_and_string_keys_of_one_column() -> None:
    values: list[bytes | None] = [None] * 6
    json_keys_ = [b"1", b' "2"', b"-9223372036854775808", b"1.5", b"true", b"1 2"]
    decoded = decode(values, json_keys_)
    assert [r["id"] for r in rows(decoded)] == [1, -(2**63)]
    assert dead(decoded) == [(1, "bad_key"), (3, "bad_key"), (4, "bad_key"), (5, "bad_key")]
    assert all(d.column == "id" for d in decoded.dead[:3])
    string = [b"42", b"x", b"\xff", b"9223372036854775808", b"-0", b""]
    decoded = decode(values, string, key_format="string")
    assert [r["id"] for r in rows(decoded)] == [42, 0]
    assert dead(decoded) == [(1, "bad_key"), (2, "bad_key"), (3, "bad_key"), (5, "bad_key")]
    text_schema = pa.schema([pa.field("id", pa.string(), nullable=False)])
    decoded = decode([None, None], [b"\xc3\xa9t\xc3\xa9", b"\xff"], schema=text_schema,
                     key_format="string")  # fmt: skip
    assert [r["id"] for r in rows(decoded)] == ["été"]
    assert dead(decoded) == [(1, "bad_key")]


def test_a_deep_or_huge_key_is_a_bad_key_not_a_crash() -> None:
    deep = b'{"id":' + b"[" * 5000 + b"]" * 5000 + b"}"
    decoded = decode([None, None, None], [deep, b"1" * 400, b"3"])
    assert dead(decoded) == [(0, "bad_key"), (1, "bad_key")]
    assert [r["id"] for r in rows(decoded)] == [3]


# ------------------------------------------------------------------ keyed records


def test_keyed_rows_upsert_and_null_values_delete_by_kafka_key() -> None:
    values = [
        j({"id": 1, "name": "a", "qty": 1}),
        j({"name": "b", "qty": 2}),  # the key from the Kafka key
        None,
        j({"id": 3, "name": "c", "qty": 3, "unknown": 1}),  # a column the table lacks
        j({"id": 4, "name": "d"}),  # a required column missing
        None,
    ]
    keys = [b"1", b"2", b"1", b"3", b"4", None]
    decoded = decode(values, keys, mode="keyed", key_format="string")
    assert rows(decoded) == [change(1, "a", 1, U), change(2, "b", 2, U), change(1, None, None, D)]
    assert dead(decoded) == [(3, "invalid"), (4, "invalid"), (5, "missing_key")]
    # Named, so the way in can evolve the table for it where its policy allows.
    assert decoded.dead[0].column == "unknown"
    assert decoded.dead[1].column == "qty"


def test_an_append_table_takes_upserts_as_rows_and_refuses_deletes() -> None:
    values = [
        j({"op": "c", "after": {"id": 1, "name": "a", "qty": 1}}),
        j({"op": "d", "before": {"id": 1}}),
        None,
        j({"op": "u", "after": {"id": 1, "name": "b", "qty": 2}}),
    ]
    decoded = decode(values, [None, None, b"1", None], key=())
    assert decoded.batch is not None and decoded.batch.schema == SCHEMA
    assert rows(decoded) == [{"id": 1, "name": "a", "qty": 1}, {"id": 1, "name": "b", "qty": 2}]
    assert dead(decoded) == [(1, "not_upsert"), (2, "not_upsert")]


def test_a_whole_fetch_decodes_in_one_batch_with_a_few_poison_records() -> None:
    n = 20_000
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    for i in range(n):
        if i % 997 == 0:
            values.append(j({"op": "x", "after": {"id": i, "qty": 0}}))
        elif i % 10 == 0:
            values.append(None)
        else:
            values.append(j({"op": "u", "after": {"id": i % 500, "name": str(i), "qty": i}}))
        keys.append(j({"id": i % 500}))
    decoded = decode(values, keys)
    bad = [i for i in range(n) if i % 997 == 0]
    assert dead(decoded) == [(i, "bad_change") for i in bad]
    assert decoded.rows.tolist() == [i for i in range(n) if i % 997 != 0]
    ops = np.asarray(rows(decoded) and decoded.batch.column(OP_COLUMN))  # type: ignore[union-attr]
    assert int((ops == D).sum()) == sum(1 for i in range(n) if i % 10 == 0 and i % 997)


# ------------------------------------------------------------------ one fetch


def test_fetch_entry_fills_metadata_columns_and_maps_subset_positions(
    make_config: Callable[..., Config],
) -> None:
    config = make_config(
        tables=[{"name": "demo.t", "create": True, "schema": [{"name": "a", "type": "long"}]}],
        kafka=[
            {
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["t"],
                "table": "demo.t",
                "changes": "keyed",
                "metadata_columns": ["_kafka_offset", "_kafka_key"],
            }
        ],
    ).kafka[0]
    schema = SCHEMA.append(pa.field("_kafka_offset", pa.int64())).append(
        pa.field("_kafka_key", pa.binary())
    )
    values = [j({"id": 1, "qty": 1}), None, b"[", None]
    fetch = Fetch(
        "t", 0, np.arange(100, 104, dtype=np.int64), values, [b"1", b"2", b"3", None],
        [0] * 4, [[]] * 4,
    )  # fmt: skip
    subset = np.asarray([1, 2, 3], dtype=np.int64)
    decoder = decoder_for(config.format, changes=config.changes, source=config)
    decoded = decoder.decode(fetch.take(subset), Target("demo.t", schema, KEY)).placed(subset)
    assert decoded.rows.tolist() == [1]
    assert rows(decoded) == [
        {"id": 2, "name": None, "qty": None, "_kafka_offset": 101, "_kafka_key": b"2",
         OP_COLUMN: D},
    ]  # fmt: skip
    assert dead(decoded) == [(2, "invalid"), (3, "missing_key")]


# ------------------------------------------------------------------ Avro (registry)

_ROW = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.items",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": "int"},
    ],
}
_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.items",
    "fields": [
        {"name": "before", "type": ["null", _ROW], "default": None},
        {"name": "after", "type": ["null", "shop.public.items.Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "fields": [{"name": "db", "type": "string"}, {"name": "lsn", "type": "long"}],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
_KEY = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
_WRONG = {"type": "record", "name": "Other", "fields": [{"name": "op", "type": "long"}]}


def _avro(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


async def test_debezium_avro_envelopes_and_keys_through_the_registry(
    schema_registry: ApicurioRegistry,
) -> None:
    # Debezium's Avro converter registers the topic's key and value subjects.
    topic = unique_name("cdc-avro")
    envelope_id = schema_registry.register(f"{topic}-value", _ENVELOPE)
    key_id = schema_registry.register(f"{topic}-key", _KEY)
    wrong_id = schema_registry.register(f"{unique_name('cdc-wrong')}-value", _WRONG)
    unknown_id = 2**31 - 1  # a registry's ids count up from 1
    schemas = RegistrySchemas(schema_registry.url, USERNAME, PASSWORD, timeout=2.0)
    source = {"db": "shop", "lsn": 7}

    def env(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
        record = {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1}
        return _avro(envelope_id, _ENVELOPE, record)

    row = {"id": 1, "name": "a", "qty": 1}
    values = [
        env("r", None, row),
        env("u", row, {"id": 1, "name": None, "qty": 2}),
        env("d", row, None),
        None,  # tombstone: the key (Avro, the key subject's id)
        env("t", None, None),
        b"\x01\x00\x00\x00\x01xx",  # not the Confluent wire format
        _avro(unknown_id, _KEY, {"id": 1}),  # a schema id the registry does not know
        env("c", None, row)[:-3],  # cut short
        _avro(wrong_id, _WRONG, {"op": 1}),  # a schema whose op is not a string
        None,  # tombstone whose key is not Avro
    ]
    keys = [None, None, None, _avro(key_id, _KEY, {"id": 8}), None, None, None, None, None, b"8"]
    envelopes = avro_rows(schemas, ignore_unknown=True)
    decoded = await asyncio.to_thread(
        decode_changes,
        pa.array(values, pa.binary()),
        pa.array(keys, pa.binary()),
        SCHEMA,
        KEY,
        mode="debezium",
        envelopes=envelopes,
        key_rows=envelopes,
        payload=False,
        before_row=True,
    )
    assert rows(decoded) == [
        change(1, "a", 1, U),
        change(1, None, 2, U),
        change(1, None, None, D),
        change(8, None, None, D),
    ]
    assert dead(decoded) == [
        (4, "bad_change"),
        (5, "invalid"),
        (6, "schema_unavailable"),
        (7, "invalid"),
        (8, "invalid"),
        (9, "bad_key"),
    ]
    unknown = next(d for d in decoded.dead if d.index == 6)
    assert unknown.error == (
        f"schema id {unknown_id} unavailable after 3 tries: the registry answered 404: "
        f"Schema {unknown_id} not found."
    )


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("kafka", "key", "fragment"),
    [
        ({"changes": "debezium", "format": "raw"}, "kafka[0].changes", "format 'raw'"),
        ({"key_format": "string"}, "kafka[0].key_format", "only used with changes"),
        ({"changes": "keyed", "key_format": "avro"}, "kafka[0].key_format", "schema registry"),
        ({"changes": "keyed", "key_format": "xml"}, "kafka[0].key_format", "'json'"),
        ({"changes": "upsert"}, "kafka[0].changes", "'debezium'"),
        (
            {
                "changes": "keyed",
                "table": None,
                "route_field": "kind",
                "table_template": "demo.{value}",
            },
            "kafka[0].route_field",
            "route by 'route_header'",
        ),
    ],
)
def test_config_cross_checks_name_the_key(
    make_config: Callable[..., Config], kafka: dict[str, Any], key: str, fragment: str
) -> None:
    source = {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "table": "demo.t"} | kafka
    source = {k: v for k, v in source.items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        make_config(
            tables=[{"name": "demo.t", "create": True, "schema": [{"name": "a", "type": "long"}]}],
            kafka=[source],
        )
    assert any(p.key == key and fragment in p.problem for p in caught.value.problems), str(
        caught.value
    )


def test_a_key_column_cannot_be_a_metadata_column(make_config: Callable[..., Config]) -> None:
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "_kafka_offset", "type": "long", "required": True},
    ]
    with pytest.raises(ConfigError) as caught:
        make_config(
            tables=[
                {"name": "demo.t", "create": True, "schema": columns, "key": ["_kafka_offset"]}
            ],
            kafka=[
                {
                    "bootstrap_servers": "127.0.0.1:9092",
                    "topics": ["t"],
                    "table": "demo.t",
                    "changes": "keyed",
                    "metadata_columns": ["_kafka_offset"],
                }
            ],
        )
    (problem,) = caught.value.problems
    assert problem.key == "kafka[0].metadata_columns"
    assert "'_kafka_offset' is a key column of 'demo.t'" in problem.problem


def test_debezium_refuses_auto_create(make_config: Callable[..., Config]) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(
            kafka=[
                {
                    "bootstrap_servers": "127.0.0.1:9092",
                    "topics": ["t"],
                    "changes": "debezium",
                    "auto_create": True,
                    "route_header": "table",
                    "table_template": "demo.{value}",
                }
            ]
        )
    assert any(p.key == "kafka[0].auto_create" for p in caught.value.problems)


def test_keyed_avro_rows_from_a_schema_file(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    """``changes = "keyed"`` with ``format = "avro"`` (a fixed .avsc, plain Avro
    binary): rows upsert, a null value deletes by the (string) Kafka key, an Avro
    field the table lacks is a dead letter naming it."""
    row = {
        "type": "record",
        "name": "Item",
        "fields": [
            {"name": "id", "type": ["null", "long"], "default": None},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "qty", "type": "int"},
        ],
    }
    path = tmp_path / "item.avsc"
    path.write_text(json.dumps(row))
    config = make_config(
        tables=[{"name": "demo.t", "create": True, "schema": [{"name": "a", "type": "long"}]}],
        kafka=[
            {
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["t"],
                "table": "demo.t",
                "changes": "keyed",
                "key_format": "string",
                "format": "avro",
                "avro_schema_file": str(path),
            }
        ],
    ).kafka[0]

    def avro(record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(row), record)
        return out.getvalue()

    values = [
        avro({"id": 1, "name": "a", "qty": 1}),
        avro({"id": None, "name": "b", "qty": 2}),  # the key from the Kafka key
        None,
        b"\x02",  # cut short
    ]
    fetch = Fetch(
        "t", 0, np.arange(4, dtype=np.int64), values, [b"1", b"2", b"1", b"3"], [0] * 4,
        [[]] * 4,
    )  # fmt: skip
    decoder = decoder_for(config.format, changes=config.changes, source=config)
    decoded = decoder.decode(fetch, Target("t", SCHEMA, KEY))
    assert rows(decoded) == [change(1, "a", 1, U), change(2, "b", 2, U), change(1, None, None, D)]
    assert dead(decoded) == [(3, "invalid")]
    narrow = pa.schema([SCHEMA.field("id"), SCHEMA.field("qty")])
    decoded = decoder.decode(fetch, Target("t", narrow, KEY))
    assert [d.reason for d in decoded.dead] == ["invalid"] * 3
    assert "column 'name': Avro field is not a column of the table" in decoded.dead[0].error
    assert decoded.rows.tolist() == [2]  # the tombstone needs no value


def test_an_update_that_changes_the_key_is_a_bad_change_not_a_stale_row() -> None:
    # Applied as an upsert of the new key, key 1's row would stay live for ever.
    values = [
        j({"op": "c", "after": {"id": 1, "name": "a", "qty": 1}}),
        j({"op": "u", "before": {"id": 1}, "after": {"id": 10, "name": "a", "qty": 1}}),
        j(
            {
                "payload": {
                    "op": "u",
                    "before": {"id": 1},
                    "after": {"id": 11, "name": "b", "qty": 2},
                }
            }
        ),
        j({"op": "u", "before": {"id": 1}, "after": {"id": 1, "name": "same", "qty": 2}}),
        j({"op": "u", "before": None, "after": {"id": 12, "name": "x", "qty": 3}}),
        j({"op": "u", "after": {"id": 13, "name": "y", "qty": 4}}),
    ]
    decoded = decode(values, [j({"id": 1})] * 6)
    assert dead(decoded) == [(1, "bad_change"), (2, "bad_change")]
    assert all("changes the key" in d.error for d in decoded.dead)
    assert rows(decoded) == [
        change(1, "a", 1, U),
        change(1, "same", 2, U),  # same key: an update
        change(12, "x", 3, U),  # no before (REPLICA IDENTITY without the key): upsert
        change(13, "y", 4, U),
    ]
    assert decoded.rows.tolist() == [0, 3, 4, 5]
