"""`[[tables]] key`: check-config refuses a key Iceberg cannot use, naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from icespool.config import redacted, validate_config
from icespool.errors import ConfigError

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "region", "type": "string", "required": True},
    {"name": "score", "type": "double", "required": True},
    {"name": "tags", "type": "list<string>", "required": True},
    {"name": "note", "type": "string"},
]


def table(**fields: Any) -> dict[str, Any]:
    return {"tables": [{"name": "cdc.t", "create": True, "schema": SCHEMA, **fields}]}


@pytest.mark.parametrize(
    ("fields", "key", "problem"),
    [
        ({"key": ["id", "nope"]}, "tables[0].key[1]", "'nope' is not in the schema"),
        ({"key": ["note"]}, "tables[0].key[0]", "must be declared required = true"),
        ({"key": ["score"]}, "tables[0].key[0]", "cannot be double"),
        ({"key": ["tags"]}, "tables[0].key[0]", "must be of a primitive type"),
        ({"key": ["id", "id"]}, "tables[0].key[1]", "listed twice"),
        (
            {"key": ["id"], "properties": {"format-version": "1"}},
            "tables[0].properties.format-version",
            "is format version 2",
        ),
        (
            {"key": ["id"], "partition_by": ["region"]},
            "tables[0].partition_by[0]",
            "'region' is not a key column",
        ),
    ],
)
def test_a_key_iceberg_cannot_use_is_refused_naming_the_key(
    fields: dict[str, Any], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(table(**fields))
    assert caught.value.key == key
    assert problem in caught.value.problem


def test_an_inferred_table_cannot_be_an_upsert_table() -> None:
    raw = {"tables": [{"name": "cdc.t", "create": True, "infer": True, "key": ["id"]}]}
    with pytest.raises(ConfigError, match="needs a declared schema") as caught:
        validate_config(raw)
    assert caught.value.key == "tables[0].key"


def test_a_valid_key_is_shown_by_check_config_not_redacted() -> None:
    config = validate_config(table(key=["id", "region"], partition_by=["bucket(8, id)", "region"]))
    assert config.tables[0].key == ["id", "region"]
    assert redacted(config)["tables"][0]["key"] == ["id", "region"]
    assert validate_config(table()).tables[0].key == []
