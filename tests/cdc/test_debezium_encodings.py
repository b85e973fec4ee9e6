"""icespool.decode._connect: Debezium's default encodings, read from each value's Kafka
Connect schema, at the type edges.

Values are built as Debezium 3.6 with JsonConverter (schemas enabled) writes them:
decimals as base64 of Java's ``BigInteger.toByteArray`` with ``scale`` and
``connect.decimal.precision`` parameters, MicroTimestamp / Timestamp / NanoTimestamp
epochs, Date as days, MicroTime, ZonedTimestamp as ISO text. Each test asserts the
exact rows, ops and dead letters of `decode_changes`.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.connect_json import DECIMAL, b64
from support.connect_json import envelope as connect_envelope

from icespool.cdc import OP_COLUMN, UPSERT
from icespool.decode import DeadRecord, JsonOptions
from icespool.decode._connect import ConnectTypes, decimal_from_base64
from icespool.decode._keyed import decode_changes
from icespool.decode._keyed_rows import json_envelopes, json_keys

UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1)
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("amount", pa.decimal128(12, 3)),
        pa.field("whole", pa.decimal128(38, 0)),
        pa.field("ts", pa.timestamp("us")),
        pa.field("ts_ms", pa.timestamp("us")),
        pa.field("ts_ns", pa.timestamp("us")),
        pa.field("tstz", pa.timestamp("us", tz="UTC")),
        pa.field("day", pa.date32()),
        pa.field("clock", pa.time64("us")),
        pa.field("n", pa.int32()),
    ]
)
FIELDS: dict[str, dict[str, Any]] = {
    "id": {"type": "int64", "optional": False},
    "amount": {
        "type": "bytes",
        "name": DECIMAL,
        "version": 1,
        "parameters": {"scale": "3", "connect.decimal.precision": "12"},
    },
    "whole": {
        "type": "bytes",
        "name": DECIMAL,
        "version": 1,
        "parameters": {"scale": "0", "connect.decimal.precision": "38"},
    },
    "ts": {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
    "ts_ms": {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1},
    "ts_ns": {"type": "int64", "name": "io.debezium.time.NanoTimestamp", "version": 1},
    "tstz": {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
    "day": {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
    "clock": {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1},
    "n": {"type": "int32"},
}


def micros(stamp: datetime.datetime) -> int:
    delta = stamp - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def days(day: datetime.date) -> int:
    return (day - EPOCH.date()).days


def envelope(
    after: Mapping[str, Any] | None,
    op: str = "c",
    *,
    fields: Mapping[str, Mapping[str, Any]] = FIELDS,
    before: Mapping[str, Any] | None = None,
) -> bytes:
    return connect_envelope(after, op, fields=fields, before=before)


def decode(
    values: Sequence[bytes | None], schema: pa.Schema = SCHEMA
) -> tuple[list[dict[str, Any]], list[int], list[DeadRecord], ConnectTypes]:
    options = JsonOptions()
    connect = ConnectTypes(json_envelopes(options, ignore_unknown=True), options)
    decoded = decode_changes(
        pa.array(values, pa.binary()),
        pa.array([None] * len(values), pa.binary()),
        schema,
        ["id"],
        mode="debezium",
        envelopes=connect,
        key_rows=json_keys(["id"], schema, options),
    )
    rows = decoded.batch.to_pylist() if decoded.batch is not None else []
    return rows, decoded.rows.tolist(), decoded.dead, connect


def row(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(SCHEMA.names)
    out.update(values)
    out[OP_COLUMN] = UPSERT
    return out


# ------------------------------------------------------------------ base64 decimals

EDGES = [
    0,
    1,
    -1,
    127,
    128,
    -128,
    -129,
    255,
    -256,
    2**63,
    -(2**63) - 1,
    10**38 - 1,
    -(10**38 - 1),
    2**127 - 1,
    -(2**127),
]


@pytest.mark.parametrize("scale", [0, 3, 10])
def test_base64_decimals_decode_exactly_at_every_width_and_sign(scale: int) -> None:
    values = pa.array([b64(v) for v in EDGES] + [None], pa.string())
    decoded, bad = decimal_from_base64(values, scale)
    assert decoded.type == pa.decimal128(38, scale)
    assert not bad.any()
    expected = [Decimal(v).scaleb(-scale) for v in EDGES] + [None]
    # decimal128(38, s) holds at most 38 digits: the two 2^127 edges are read as
    # their exact bits (they only fit no column; `ConnectTypes` refuses them by precision).
    got = [_exact(decoded, i) for i in range(len(decoded))]
    assert got == expected


def _exact(array: pa.Array, i: int) -> Decimal | None:
    """The unscaled 128-bit integer of row ``i`` (as_py would refuse 39 digits)."""
    if not array[i].is_valid:
        return None
    raw = array.buffers()[1].to_pybytes()[16 * i : 16 * (i + 1)]
    return Decimal(int.from_bytes(raw, "little", signed=True)).scaleb(-array.type.scale)


def test_base64_decimals_that_are_not_connect_decimals_are_flagged_and_null() -> None:
    too_wide = base64.b64encode((2**130).to_bytes(17, "big", signed=True)).decode()
    values = pa.array(
        ["", "AA", "@@@@", "A===", "=AAA", "AA=A", "AAAAA", too_wide, None, b64(-5)], pa.string()
    )
    decoded, bad = decimal_from_base64(values, 2)
    assert bad.tolist() == [True] * 8 + [False, False]
    assert decoded.to_pylist() == [None] * 9 + [Decimal("-0.05")]


def test_a_sliced_array_reads_its_own_rows() -> None:
    values = pa.array([b64(1), b64(-2), b64(300), None], pa.string()).slice(1, 3)
    decoded, bad = decimal_from_base64(values, 1)
    assert decoded.to_pylist() == [Decimal("-0.2"), Decimal("30.0"), None]
    assert bad.tolist() == [False, False, False]


# ------------------------------------------------------------------ whole envelopes


def test_default_encodings_become_the_table_types_at_the_edges() -> None:
    first = datetime.datetime(1, 1, 1)
    last = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
    before_epoch = datetime.datetime(1969, 12, 31, 23, 59, 59, 999999)
    values = [
        envelope(
            {
                "id": 1,
                "amount": b64(-123_456_789_012),
                "whole": b64(10**38 - 1),
                "ts": micros(first),
                "ts_ms": -1,
                "ts_ns": -1000,
                "tstz": "0001-01-01T00:00:00Z",
                "day": days(datetime.date(1, 1, 1)),
                "clock": 0,
                "n": -(2**31),
            },
            "r",
        ),
        envelope(
            {
                "id": 2,
                "amount": b64(999_999_999_999),
                "whole": b64(0),
                "ts": micros(last),
                "ts_ms": 253402300799999,
                "ts_ns": 1_500_000_000_123_000,
                "tstz": "9999-12-31T23:59:59.999999Z",
                "day": days(datetime.date(9999, 12, 31)),
                "clock": 86_399_999_999,
                "n": 2**31 - 1,
            },
            "u",
        ),
        envelope(
            {
                "id": 3,
                "amount": b64(-1),
                "whole": b64(-(10**38 - 1)),
                "ts": -1,
                "ts_ms": 0,
                "ts_ns": 0,
                "tstz": "1969-12-31T23:59:59.999999Z",
                "day": -1,
                "clock": 1,
                "n": 0,
            }
        ),
        envelope({"id": 4}),  # every other column null
    ]
    rows, at, dead, connect = decode(values)
    assert dead == []
    assert at == [0, 1, 2, 3]
    assert rows == [
        row(
            id=1,
            amount=Decimal("-123456789.012"),
            whole=Decimal(10**38 - 1),
            ts=first,
            ts_ms=before_epoch.replace(microsecond=999000),
            ts_ns=before_epoch,
            tstz=datetime.datetime(1, 1, 1, tzinfo=UTC),
            day=datetime.date(1, 1, 1),
            clock=datetime.time(0, 0),
            n=-(2**31),
        ),
        row(
            id=2,
            amount=Decimal("999999999.999"),
            whole=Decimal(0),
            ts=last,
            ts_ms=last.replace(microsecond=999000),
            ts_ns=datetime.datetime(1970, 1, 18, 8, 40, 0, 123),
            tstz=last.replace(tzinfo=UTC),
            day=datetime.date(9999, 12, 31),
            clock=datetime.time(23, 59, 59, 999999),
            n=2**31 - 1,
        ),
        row(
            id=3,
            amount=Decimal("-0.001"),
            whole=Decimal(-(10**38 - 1)),
            ts=before_epoch,
            ts_ms=EPOCH,
            ts_ns=EPOCH,
            tstz=before_epoch.replace(tzinfo=UTC),
            day=datetime.date(1969, 12, 31),
            clock=datetime.time(0, 0, 0, 1),
            n=0,
        ),
        row(id=4),
    ]
    assert connect.wanted is None  # the table has every column, as wide


def test_values_that_do_not_fit_are_dead_letters_naming_the_column() -> None:
    good = {"id": 9, "amount": b64(5)}
    values = [
        envelope({"id": 1, "amount": b64(10**12)}),  # 10 integer digits in decimal(12,3)
        envelope({"id": 2, "amount": "not base64!"}),
        envelope({"id": 3, "day": days(datetime.date(9999, 12, 31)) + 1}),
        envelope({"id": 4, "ts": micros(datetime.datetime(9999, 12, 31)) + 86_400_000_000}),
        envelope({"id": 5, "ts": micros(datetime.datetime(1, 1, 1)) - 1}),
        envelope({"id": 6, "ts_ns": 1_001}),  # not whole microseconds
        envelope({"id": 7, "clock": 86_400_000_000}),  # 24:00:00
        envelope({"id": 8, "n": 2**31}, fields={**FIELDS, "n": {"type": "int64"}}),
        envelope({"id": 10, "whole": b64(-(2**127))}),  # 16 bytes, 39 digits
        envelope(good),
    ]
    rows, at, dead, _ = decode(values)
    assert rows == [row(id=9, amount=Decimal("0.005"))]
    assert at == [9]
    assert [(d.index, d.reason, d.column) for d in dead] == [
        (0, "out_of_range", "amount"),
        (1, "invalid", "amount"),
        (2, "out_of_range", "day"),
        (3, "out_of_range", "ts"),
        (4, "out_of_range", "ts"),
        (5, "out_of_range", "ts_ns"),
        (6, "out_of_range", "clock"),
        (7, "out_of_range", "n"),
        (8, "out_of_range", "whole"),
    ]
    errors = [d.error for d in dead]
    assert errors[0] == (
        "column 'amount': 1000000000.000 (decimal with scale 3 (Kafka Connect Decimal)) "
        "does not fit the column (decimal128(12, 3))"
    )
    assert errors[1] == (
        "column 'amount': expected a Kafka Connect Decimal (base64 of at most 16 bytes, "
        "scale 3), got 'not base64!'"
    )
    assert errors[2] == (
        "column 'day': 2932897 (date as days since 1970-01-01 (io.debezium.time.Date)) is "
        "out of range: the column holds a date from 0001-01-01 to 9999-12-31"
    )
    assert errors[7] == (
        "column 'n': 2147483648 (Kafka Connect int64) does not fit the column (int32)"
    )


def test_deletes_read_their_key_from_before_and_nulls_stay_null() -> None:
    values = [
        envelope({"id": 1, "amount": None, "ts": None, "day": None}),
        envelope(None, "d", before={"id": 1, "amount": None, "ts": None}),
        None,  # the tombstone: a delete by the Kafka key (none here: missing_key)
    ]
    rows, at, dead, _ = decode(values)
    assert at == [0, 1]
    assert rows[0] == row(id=1)
    assert rows[1] == {**dict.fromkeys(SCHEMA.names), "id": 1, OP_COLUMN: 1}
    assert [(d.index, d.reason) for d in dead] == [(2, "missing_key")]


def test_schema_shapes_mixed_in_one_fetch_keep_their_order_and_say_what_to_evolve() -> None:
    narrow = {"id": FIELDS["id"], "amount": FIELDS["amount"], "n": FIELDS["n"]}
    wide = {
        **narrow,
        "amount": {
            **FIELDS["amount"],
            "parameters": {"scale": "3", "connect.decimal.precision": "18"},
        },
        "n": {"type": "int64"},
        "extra": {"type": "string"},
        "seen": {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        "born": {"type": "int32", "name": "io.debezium.time.Date"},
        "price": {
            "type": "bytes",
            "name": DECIMAL,
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        "at": {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        "flag": {"type": "boolean"},
        "geo": {"type": "struct", "name": "io.debezium.data.geometry.Point", "fields": []},
    }
    values = [
        envelope({"id": 1, "amount": b64(1), "n": 1}, fields=narrow),
        envelope({"id": 2, "amount": b64(-2), "n": 5, "extra": "x"}, fields=wide),
        json.dumps({"op": "c", "after": {"id": 3, "amount": "4.5", "n": 7}}).encode(),
        envelope({"id": 4, "amount": b64(3), "n": 2}, fields=narrow),
    ]
    rows, at, dead, connect = decode(values)
    assert dead == []
    assert at == [0, 1, 2, 3]
    assert [(r["id"], r["amount"], r["n"]) for r in rows] == [
        (1, Decimal("0.001"), 1),
        (2, Decimal("-0.002"), 5),
        (3, Decimal("4.500"), 7),  # no schema: the table's JSON rules
        (4, Decimal("0.003"), 2),
    ]
    assert connect.wanted == pa.schema(
        [
            ("amount", pa.decimal128(18, 3)),
            ("n", pa.int64()),
            ("extra", pa.string()),
            ("seen", pa.timestamp("us", tz="UTC")),
            ("born", pa.date32()),
            ("price", pa.decimal128(10, 2)),
            ("at", pa.timestamp("us")),
            ("flag", pa.bool_()),
        ]
    )


def test_values_without_a_schema_envelope_skip_the_schema_read() -> None:
    plain = [
        json.dumps({"op": "c", "after": {"id": i, "day": f"2024-01-0{i}"}}).encode() for i in (1, 2)
    ]
    rows, at, dead, connect = decode(plain)
    assert [(r["id"], r["day"]) for r in rows] == [
        (1, datetime.date(2024, 1, 1)),
        (2, datetime.date(2024, 1, 2)),
    ]
    assert (at, dead, connect.wanted) == ([0, 1], [], None)


def test_a_broken_schema_part_leaves_the_record_to_the_envelope_decode() -> None:
    values = [
        json.dumps(
            {"schema": {"fields": "nope"}, "payload": {"op": "c", "after": {"id": 1}}}
        ).encode(),
        b'{"schema": {"fields": [',
        envelope({"id": 3, "day": 0}),
    ]
    rows, at, dead, _ = decode(values)
    assert [r["id"] for r in rows] == [1, 3]
    assert rows[1]["day"] == datetime.date(1970, 1, 1)
    assert at == [0, 2]
    assert [(d.index, d.reason) for d in dead] == [(1, "invalid")]


def test_bad_and_good_groups_in_large_fetches_stay_vectorized() -> None:
    """10,000 records of two shapes decode with every value exact (no per-record path)."""
    rng = np.random.default_rng(7)
    unscaled = [int(v) for v in rng.integers(-(10**12) + 1, 10**12, 10_000)]
    values = [
        envelope({"id": i, "amount": b64(u), "day": int(u % 2_000_000) - 700_000})
        for i, u in enumerate(unscaled)
    ]
    rows, at, dead, _ = decode(values)
    assert dead == []
    assert at == list(range(10_000))
    assert [r["amount"] for r in rows] == [Decimal(u).scaleb(-3) for u in unscaled]
    assert [r["day"] for r in rows] == [
        datetime.date(1970, 1, 1) + datetime.timedelta(days=int(u % 2_000_000) - 700_000)
        for u in unscaled
    ]


def test_tombstones_delete_by_kafka_keys_in_debezium_encodings() -> None:
    """A key of a date and a decimal (composite): the tombstone after a delete, and a
    delete without ``before``, take it from the Kafka key's own Connect schema."""
    schema = pa.schema(
        [
            pa.field("day", pa.date32(), nullable=False),
            pa.field("amount", pa.decimal128(12, 3), nullable=False),
            pa.field("v", pa.string()),
        ]
    )
    key_fields = [
        {"type": "int32", "optional": False, "name": "io.debezium.time.Date", "field": "day"},
        {
            "type": "bytes",
            "optional": False,
            "name": DECIMAL,
            "parameters": {"scale": "3", "connect.decimal.precision": "12"},
            "field": "amount",
        },
    ]

    def key(day: int, unscaled: int) -> bytes:
        payload = {"day": day, "amount": b64(unscaled)}
        return json.dumps(
            {"schema": {"type": "struct", "fields": key_fields}, "payload": payload}
        ).encode()

    fields = {
        "day": {"type": "int32", "optional": False, "name": "io.debezium.time.Date"},
        "amount": {
            "type": "bytes",
            "optional": False,
            "name": DECIMAL,
            "parameters": {"scale": "3"},
        },
        "v": {"type": "string"},
    }
    values = [
        connect_envelope({"day": 1, "amount": b64(-1500), "v": "a"}, fields=fields),
        None,
        connect_envelope(None, "d", fields=fields),
        None,
    ]
    keys = [key(1, -1500), key(-719162, -1500), key(2932896, 0), key(2932897, 1)]
    options = JsonOptions()
    decoded = decode_changes(
        pa.array(values, pa.binary()),
        pa.array(keys, pa.binary()),
        schema,
        ["day", "amount"],
        mode="debezium",
        envelopes=ConnectTypes(json_envelopes(options, ignore_unknown=True), options),
        key_rows=json_keys(["day", "amount"], schema, options, connect=True),
    )
    assert decoded.batch is not None
    assert decoded.batch.to_pylist() == [
        {"day": datetime.date(1970, 1, 2), "amount": Decimal("-1.500"), "v": "a", OP_COLUMN: 0},
        {"day": datetime.date(1, 1, 1), "amount": Decimal("-1.500"), "v": None, OP_COLUMN: 1},
        {"day": datetime.date(9999, 12, 31), "amount": Decimal("0.000"), "v": None, OP_COLUMN: 1},
    ]
    assert decoded.rows.tolist() == [0, 1, 2]
    assert [(d.index, d.reason) for d in decoded.dead] == [(3, "bad_key")]
    assert decoded.dead[0].error == (
        "Kafka key: column 'payload.day': 2932897 (date as days since 1970-01-01 "
        "(io.debezium.time.Date)) is out of range: the column holds a date from 0001-01-01 "
        "to 9999-12-31"
    )


def test_schema_texts_are_parsed_once_per_shape_and_any_layout_reads() -> None:
    """The compact layout (schema first) is cut before the payload; a schema holding
    ``,"payload":`` itself (a parameter of that name), spaced JSON, or the payload first
    are parsed whole: every one decodes the same."""
    odd = {**FIELDS, "amount": {**FIELDS["amount"], "parameters": {
        "scale": "3", "payload": "x", "connect.decimal.precision": "12"}}}  # fmt: skip
    after = {"id": 1, "amount": b64(-7), "day": 3}
    compact = envelope(after)
    spaced = json.dumps(json.loads(compact)).encode()
    payload_first = json.dumps({"payload": json.loads(compact)["payload"],
                                "schema": json.loads(compact)["schema"]}).encode()  # fmt: skip
    values = [compact, envelope(after, fields=odd), spaced, payload_first, compact]
    rows, at, dead, _ = decode(values)
    assert dead == []
    assert at == [0, 1, 2, 3, 4]
    assert rows == [row(id=1, amount=Decimal("-0.007"), day=datetime.date(1970, 1, 4))] * 5
