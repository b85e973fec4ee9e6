"""The schema registry of a ``[[kafka]]`` section whose format is Protobuf or JSON Schema:
the one registry client (`icespool.decode._registry`) with that format's parser."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icespool.decode._registry import CachedSchemas, SchemaRegistry

if TYPE_CHECKING:
    from icespool.config import KafkaConfig

__all__ = ["registry_schemas"]


def registry_schemas(config: KafkaConfig, format: str) -> CachedSchemas[Any]:
    """The registry schemas of a source (kept, with their cache, while it runs)."""
    if config.schema_registry_url is None:
        raise ValueError(f"format {format!r} needs schema_registry_url")
    if format == "protobuf":
        from icespool.decode._proto_schema import parse_proto_schema

        parse: Any = parse_proto_schema
        name = "Protobuf"
    else:
        from icespool.decode._json_schema import parse_json_schema

        parse = parse_json_schema
        name = "JSON Schema"
    registry = SchemaRegistry(
        config.schema_registry_url,
        config.schema_registry_username,
        config.schema_registry_password,
        config.schema_registry_timeout,
        format=name,
    )
    return CachedSchemas(registry, parse)
