"""The config model's JSON schema documents every key: the reference docs are rendered from it."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from icespool.config import Config

# Every model a config file can hold, reached from Config.
SECTION_MODELS = {
    "CatalogConfig",
    "ColumnConfig",
    "Config",
    "EncodeConfig",
    "HttpConfig",
    "KafkaConfig",
    "LogConfig",
    "MaintenanceConfig",
    "MaintenanceOverride",
    "SpoolConfig",
    "TableConfig",
    "TimeoutsConfig",
    "TokenConfig",
    "WriterSettings",
}


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    origin = get_origin(tp)
    if origin is Annotated:
        return _models_in(get_args(tp)[0])
    if origin in (Union, types.UnionType, list, dict, tuple):
        return [m for arg in get_args(tp) for m in _models_in(arg)]
    return []


def _section_models() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [Config]
    while todo:
        model = todo.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for info in model.model_fields.values():
            todo += _models_in(info.annotation)
    return found


def test_every_field_of_every_section_has_a_one_line_description() -> None:
    models = _section_models()
    assert set(models) == SECTION_MODELS
    undocumented = [
        f"{name}.{field}"
        for name, model in models.items()
        for field, info in model.model_fields.items()
        if not (info.description or "").strip()
    ]
    assert undocumented == []
    multiline = [
        f"{name}.{field}"
        for name, model in models.items()
        for field, info in model.model_fields.items()
        if "\n" in (info.description or "")
    ]
    assert multiline == []


def test_the_json_schema_carries_a_description_for_every_key() -> None:
    schema = Config.model_json_schema()
    definitions = schema["$defs"]
    assert set(definitions) | {"Config"} == SECTION_MODELS
    missing = [
        f"{name}.{key}"
        for name, definition in [("Config", schema), *definitions.items()]
        for key, prop in definition["properties"].items()
        if not prop.get("description", "").strip()
    ]
    assert missing == []
    # The key a file uses, not the attribute: [[tables]] declare columns as `schema`.
    assert set(definitions["TableConfig"]["properties"]) >= {"schema", "name", "key"}
    assert "columns" not in definitions["TableConfig"]["properties"]
    assert definitions["SpoolConfig"]["properties"]["max_bytes"]["description"] == (
        "Most bytes the spool may hold; at 90 % Kafka sources pause, when full ingest answers 503."
    )
