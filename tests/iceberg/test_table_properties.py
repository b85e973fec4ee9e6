"""Integer table properties: one parser, a warning and the default for tuning properties,
the table held back (TablePropertyError) for write properties."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from pyiceberg.table import TableProperties
from support.maintenance_helpers import append_daemon_files, rows, sql_catalog, table_ids

from icespool.config import embedded_default, validate_config
from icespool.errors import TablePropertyError
from icespool.iceberg import commit_properties
from icespool.iceberg._catalog import ensure_table
from icespool.iceberg._properties import int_property, parse_int_property, write_int_property
from icespool.maintenance import MIN_SNAPSHOTS_PROPERTY, resolve
from icespool.schema import parse_partition_spec, parse_schema

LOGGER = "icespool.table"
KEY = "some.integer-property"


def _label() -> str:
    # Warnings are given once per (table, key, value) per process: a table of its own.
    return f"t.{uuid.uuid4().hex[:8]}"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize(
    ("value", "minimum", "expected"),
    [("42", 1, 42), (" 7 ", 1, 7), ("1", 1, 1), ("0", 0, 0), ("-3", None, -3)],
)
def test_an_integer_in_range_is_read(value: str, minimum: int | None, expected: int) -> None:
    assert parse_int_property(KEY, value, minimum=minimum) == expected
    assert int_property({KEY: value}, KEY, 5, table=_label(), minimum=minimum) == expected
    assert write_int_property({KEY: value}, KEY, 5, minimum=minimum) == expected


@pytest.mark.parametrize(
    ("value", "minimum", "problem"),
    [
        ("512MB", 1, "table property some.integer-property='512MB' is not an integer"),
        ("1.5", 1, "table property some.integer-property='1.5' is not an integer"),
        ("0", 1, "table property some.integer-property='0' must be positive"),
        ("-5", 1, "table property some.integer-property='-5' must be positive"),
        ("1", 2, "table property some.integer-property='1' must be at least 2"),
    ],
)
def test_a_tuning_property_that_is_no_value_warns_once_naming_table_key_and_value(
    caplog: pytest.LogCaptureFixture, value: str, minimum: int, problem: str
) -> None:
    table = _label()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):  # read at every commit: one warning, not one per read
            assert int_property({KEY: value}, KEY, 20, table=table, minimum=minimum) == 20
        assert int_property({KEY: value}, KEY, None, table=table, minimum=minimum) is None
    assert _warnings(caplog) == [f"{problem}; table {table} uses 20 until it is fixed"]


def test_a_tuning_property_warns_again_for_another_value_or_table(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = _label(), _label()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert int_property({KEY: "x"}, KEY, None, table=first) is None
        assert int_property({KEY: "y"}, KEY, None, table=first) is None
        assert int_property({KEY: "x"}, KEY, None, table=second) is None
    assert _warnings(caplog) == [
        f"table property {KEY}='x' is not an integer; table {first} uses the daemon's "
        "setting until it is fixed",
        f"table property {KEY}='y' is not an integer; table {first} uses the daemon's "
        "setting until it is fixed",
        f"table property {KEY}='x' is not an integer; table {second} uses the daemon's "
        "setting until it is fixed",
    ]


def test_an_unset_or_empty_tuning_property_is_the_default_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert int_property({}, KEY, 9, table=_label()) == 9
        assert int_property({KEY: ""}, KEY, 9, table=_label()) == 9
        assert int_property({"other": "x"}, KEY, None, table=_label()) is None
    assert _warnings(caplog) == []


@pytest.mark.parametrize(
    ("value", "minimum", "message"),
    [
        (
            "512MB",
            1,
            "table property some.integer-property='512MB' is not an integer; fix the table",
        ),
        ("", 1, "table property some.integer-property='' is not an integer; fix the table"),
        ("-5", 1, "table property some.integer-property='-5' must be positive; fix the table"),
        (
            "abc",
            None,
            "table property some.integer-property='abc' is not an integer; fix the table",
        ),
    ],
)
def test_a_write_property_that_is_no_value_is_the_tables_fault(
    value: str, minimum: int | None, message: str
) -> None:
    with pytest.raises(TablePropertyError) as caught:
        write_int_property({KEY: value}, KEY, 5, minimum=minimum)
    assert str(caught.value) == message
    assert write_int_property({}, KEY, 5) == 5
    assert write_int_property({}, KEY, None) is None


def test_a_garbage_retention_property_warns_naming_the_table_and_uses_the_section(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = validate_config(embedded_default(tmp_path))
    name = _label()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = resolve(config, None, {MIN_SNAPSHOTS_PROPERTY: "junk"}, name=name)
    assert settings.min_snapshots == 10  # [maintenance] min_snapshots
    assert _warnings(caplog) == [
        f"table property {MIN_SNAPSHOTS_PROPERTY}='junk' is not an integer; table {name} "
        "uses the daemon's setting until it is fixed"
    ]


def test_a_garbage_merge_property_warns_naming_the_table_and_commits_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    columns: list[dict[str, object]] = [
        {"name": "id", "type": "long", "required": True},
        {"name": "payload", "type": "string"},
    ]
    schema = parse_schema(columns)
    table = ensure_table(
        sql_catalog(tmp_path),
        f"m.{uuid.uuid4().hex[:8]}",
        schema,
        parse_partition_spec(schema, []),
        {},
        create=True,
    )
    key = TableProperties.MANIFEST_MIN_MERGE_COUNT
    commit_properties(table, lambda _: {key: "lots"})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for n in range(3):
            append_daemon_files(table, [rows(range(n * 2, n * 2 + 2))])
    assert table_ids(table) == list(range(6))
    assert _warnings(caplog) == [
        f"table property {key}='lots' is not an integer; table {table.metadata.location} "
        f"uses {TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT} until it is fixed"
    ]
