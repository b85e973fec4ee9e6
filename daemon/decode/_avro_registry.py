"""Where Avro writer schemas come from: a Confluent-compatible schema registry (by the
schema id each value's wire header carries) or one ``.avsc`` file.

A schema id the registry does not know, or a registry that does not answer after a
few tries, is `SchemaUnavailable`: the decoder makes its records dead letters with
reason ``schema_unavailable``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from icespool.decode._avro_schema import WriterSchema, load_schema_file, parse_writer_schema
from icespool.decode._registry import (
    CachedSchemas,
    RegistryAnswer,
    SchemaRegistry,
    SchemaUnavailable,
)

if TYPE_CHECKING:
    from icespool.config import KafkaConfig

__all__ = ["AvroSchemas", "FileSchema", "RegistrySchemas", "SchemaUnavailable", "avro_schemas"]


class AvroSchemas:
    """Where writer schemas come from. ``framed``: values carry the Confluent header."""

    framed: bool = True

    def get(self, schema_id: int) -> WriterSchema:
        raise NotImplementedError

    def fixed(self) -> WriterSchema:
        raise NotImplementedError


class FileSchema(AvroSchemas):
    """The schema of an ``.avsc`` file, read again when the file changes."""

    framed = False

    def __init__(self, path: Path) -> None:
        self._path = path
        self._changed = self._mtime()
        self._schema = load_schema_file(path)

    def fixed(self) -> WriterSchema:
        changed = self._mtime()
        if changed != self._changed:
            self._schema = load_schema_file(self._path)
            self._changed = changed
        return self._schema

    def _mtime(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None  # a missing file fails in load_schema_file, by name


class RegistrySchemas(AvroSchemas):
    """Avro writer schemas from a Confluent-compatible registry
    (`icespool.decode._registry`), cached by id. Safe to share between threads."""

    framed = True

    def __init__(
        self,
        url: str,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        registry = SchemaRegistry(url, username, password, timeout, format="Avro")
        self.url = registry.url
        self._schemas = CachedSchemas(registry, _parse)

    def get(self, schema_id: int) -> WriterSchema:
        return self._schemas.get(schema_id)


def _parse(answer: RegistryAnswer, registry: SchemaRegistry) -> WriterSchema:
    if answer.kind != "AVRO":
        raise SchemaUnavailable("invalid", f"{answer.label} is a {answer.kind} schema, not Avro")
    try:
        return parse_writer_schema(answer.text, answer.label)
    except ValueError as exc:
        raise SchemaUnavailable("invalid", str(exc)) from None


def avro_schemas(config: KafkaConfig) -> AvroSchemas:
    """The schema source of a ``[[kafka]]`` section with format "avro"; its source
    keeps it (and the registry cache in it) for as long as it runs."""
    if config.avro_schema_file is not None:
        return FileSchema(config.avro_schema_file)
    if config.schema_registry_url is not None:
        return RegistrySchemas(
            config.schema_registry_url,
            config.schema_registry_username,
            config.schema_registry_password,
            config.schema_registry_timeout,
        )
    raise ValueError("format 'avro' needs schema_registry_url or avro_schema_file")
