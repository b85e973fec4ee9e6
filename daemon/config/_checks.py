"""Checks of one ``[[tables]]`` entry, ``[[kafka]]`` source or ``[maintenance]`` (section or a
table's override) that relate several of its values; ``Config._cross_check`` runs them with
the entry's position, so each ConfigError names the dotted key at fault.
"""

from __future__ import annotations

from collections.abc import Mapping

from icespool.config._entries import KafkaConfig, TableConfig
from icespool.config._sections import MaintenanceConfig
from icespool.config._units import format_duration
from icespool.config._values import LEASE_CLOCK_MARGIN, LEASE_WORK_MIN
from icespool.errors import ConfigError
from icespool.schema._grammar import (
    parse_partition,
    parse_sort,
    parse_type_string,
    transform_accepts,
    type_columns,
)

# Submodules, not the packages: these import no pyarrow, so loading a config (the CLI)
# stays light.
from icespool.schema._key import OP_COLUMN, key_type_problem

__all__ = [
    "REGISTRY_FORMATS",
    "check_avro",
    "check_changes",
    "check_maintenance",
    "check_table",
    "check_width",
]


#: Kafka formats whose values carry a schema registry's id (Confluent wire format).
REGISTRY_FORMATS = ("avro", "protobuf", "json-schema")


def check_avro(i: int, kafka: KafkaConfig) -> None:
    """The schema registry keys of a ``[[kafka]]`` section, for its format."""
    registry, schema_file = kafka.schema_registry_url, kafka.avro_schema_file
    if kafka.format not in REGISTRY_FORMATS:
        for key in ("schema_registry_url", "avro_schema_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(
                    f"kafka[{i}].{key}",
                    f'only used with format = "avro", "protobuf" or "json-schema" (format is '
                    f"{kafka.format!r}); remove it",
                )
        return
    if kafka.format != "avro":
        if schema_file is not None:
            raise ConfigError(
                f"kafka[{i}].avro_schema_file",
                f'only used with format = "avro" (format is {kafka.format!r}); remove it',
            )
        if registry is None:
            raise ConfigError(
                f"kafka[{i}].schema_registry_url",
                f"format {kafka.format!r} needs 'schema_registry_url' (Confluent wire format: "
                "magic byte, schema id, then the value)",
            )
    elif (registry is None) == (schema_file is None):
        raise ConfigError(
            f"kafka[{i}].schema_registry_url",
            "format 'avro' needs exactly one of 'schema_registry_url' (Confluent wire format: "
            "magic byte, schema id, Avro binary) or 'avro_schema_file' (an .avsc file; values "
            "are plain Avro binary)",
        )
    if (kafka.schema_registry_username is None) != (kafka.schema_registry_password is None):
        raise ConfigError(
            f"kafka[{i}].schema_registry_username",
            "basic auth needs both 'schema_registry_username' and 'schema_registry_password'",
        )
    if kafka.dynamic and kafka.route_field is not None:
        raise ConfigError(
            f"kafka[{i}].route_field",
            f"format {kafka.format!r} routes records before decoding them; route by 'route_header'",
        )
    if schema_file is not None:
        from icespool.decode._avro_schema import load_schema_file  # fastavro: only for this check

        try:
            load_schema_file(schema_file)
        except ValueError as exc:
            raise ConfigError(f"kafka[{i}].avro_schema_file", str(exc)) from None


def check_changes(i: int, kafka: KafkaConfig) -> None:
    if kafka.changes == "none":
        if kafka.key_format != "json":  # the default, which a rendered config repeats
            raise ConfigError(
                f"kafka[{i}].key_format",
                'only used with changes = "debezium" or "keyed" (changes is \'none\'); '
                "remove it or set 'changes'",
            )
        return
    if kafka.format in ("protobuf", "json-schema"):
        raise ConfigError(
            f"kafka[{i}].changes",
            f"changes = {kafka.changes!r} reads values as JSON or Avro; format "
            f"{kafka.format!r} is read as rows only",
        )
    if kafka.format == "raw":
        raise ConfigError(
            f"kafka[{i}].changes",
            f"changes = {kafka.changes!r} decodes values into a table's columns; format "
            '\'raw\' keeps them as bytes. Use format = "json" or "avro"',
        )
    if kafka.route_field is not None:
        raise ConfigError(
            f"kafka[{i}].route_field",
            f"changes = {kafka.changes!r} routes records before decoding them, and a "
            "tombstone (a delete) has no value to read a route field from: route by "
            "'route_header' or use a static 'table'",
        )
    if kafka.changes == "debezium" and kafka.auto_create:
        raise ConfigError(
            f"kafka[{i}].auto_create",
            "creates a table from the inferred shape of its first values, and a Debezium "
            "value is a change envelope, not a row: declare the tables (with their key)",
        )
    if kafka.key_format == "avro" and kafka.schema_registry_url is None:
        raise ConfigError(
            f"kafka[{i}].key_format",
            "'avro' keys are read in the Confluent wire format through the schema registry: "
            "it needs format = \"avro\" with 'schema_registry_url'",
        )


def check_maintenance(where: str, m: MaintenanceConfig, keys: frozenset[str] | None = None) -> None:
    """Relations between [maintenance] values. ``where``: the section, or a table's
    override, checked merged with the section for the ``keys`` it sets (a problem of
    the section alone is reported once, at the section)."""

    def blame(*names: str) -> str | None:
        if keys is None:
            return names[0]
        return next((name for name in names if name in keys), None)

    if m.min_snapshots > m.max_snapshots and (key := blame("min_snapshots", "max_snapshots")):
        raise ConfigError(
            f"{where}.{key}",
            f"{m.min_snapshots} is more than max_snapshots ({m.max_snapshots}); the cap "
            "cannot keep fewer snapshots than the minimum",
        )
    if m.lease == "catalog" and m.resolved_lease_ttl < LEASE_CLOCK_MARGIN + LEASE_WORK_MIN:
        key = blame("interval") if m.lease_ttl is None else blame("lease_ttl", "interval")
        if key is not None:
            raise ConfigError(
                f"{where}.{key}",
                f"the maintenance lease would last {format_duration(m.resolved_lease_ttl)}; "
                f"its holder stops {format_duration(LEASE_CLOCK_MARGIN)} before the end "
                "(replicas' clocks may differ that much), so no run would have time to "
                f"work: make lease_ttl (unset: 3 x interval) at least "
                f"{format_duration(LEASE_CLOCK_MARGIN + LEASE_WORK_MIN)}",
            )
    too_short = m.lease_ttl is not None and m.lease_ttl < 2 * m.interval
    if too_short and (key := blame("lease_ttl", "interval")):
        assert m.lease_ttl is not None
        raise ConfigError(
            f"{where}.{key}",
            f"{format_duration(m.lease_ttl)} is shorter than 2 x interval "
            f"({format_duration(m.interval)}): the maintainer renews its lease once per run, "
            "so a shorter lease lapses between runs; raise it or leave it unset (3 x interval)",
        )


def check_table(i: int, table: TableConfig) -> None:
    if table.create and not table.columns and not table.infer:
        raise ConfigError(
            f"tables[{i}].schema",
            "create = true needs a schema to create the table from, e.g. "
            'schema = [{ name = "id", type = "long", required = true }], '
            "or infer = true to create it from the first batch",
        )
    types_by_name: dict[str, str] = {}
    if table.columns is not None:
        folded: dict[str, int] = {}
        for j, column in enumerate(table.columns):
            key = column.name.casefold()
            if key == OP_COLUMN:
                # Reserved: a change batch's trailing op column would shadow it (and
                # spooled rows holding it are taken for keyed changes).
                raise ConfigError(
                    f"tables[{i}].schema[{j}].name",
                    f"{column.name!r} is reserved for the op column of keyed changes "
                    "(0 upsert, 1 delete); rename the column",
                )
            if key in folded:
                raise ConfigError(
                    f"tables[{i}].schema[{j}].name",
                    f"{column.name!r} repeats schema[{folded[key]}] (names are compared "
                    "case-insensitively, as Spark does); rename one of them",
                )
            folded[key] = j
            types_by_name[column.name] = column.type
    for j, field in enumerate(table.partition_fields):
        key = f"tables[{i}].partition_by[{j}]"
        if table.columns is None:
            continue  # the table's own schema is checked when it is loaded
        if field.column not in types_by_name:
            raise ConfigError(
                key,
                f"column {field.column!r} is not in the schema; use one of "
                f"{', '.join(types_by_name)}",
            )
        column_type = types_by_name[field.column]
        if not transform_accepts(field.transform, column_type):
            raise ConfigError(
                key,
                f"{field.transform} cannot partition {field.column!r} of type {column_type}; "
                "use a transform that fits the type (year/month/day: date or timestamp, "
                "hour: timestamp, truncate: int/long/string/binary/decimal)",
            )
    _check_key(i, table, types_by_name)
    for j, sort in enumerate(table.sort_by):
        sort_column = parse_partition(parse_sort(sort)[0]).column
        if table.columns is not None and sort_column not in types_by_name:
            raise ConfigError(
                f"tables[{i}].sort_by[{j}]",
                f"column {sort_column!r} is not in the schema; use one of "
                f"{', '.join(types_by_name)}",
            )


def check_width(i: int, table: TableConfig) -> None:
    """A table's own max_columns is not below its declared schema's width (such a
    table could never take a column). The [defaults] cap is not held against a
    declaration: tables declared wider before the cap existed stay valid."""
    if table.columns is None or table.max_columns is None:
        return
    width = sum(type_columns(parse_type_string(column.type)) for column in table.columns)
    if width > table.max_columns:
        raise ConfigError(
            f"tables[{i}].max_columns",
            f"{table.max_columns} is less than the {width} columns of the declared schema "
            "(nested fields counted); raise it to at least that",
            table=table.name,
        )


def _check_key(i: int, table: TableConfig, types_by_name: Mapping[str, str]) -> None:
    """An upsert table's key: declared required, of a type Iceberg allows as an
    identifier field, and covering every partition source column (the key must
    determine the partition, as Flink requires: a key's rows then live in one
    partition, and its equality delete is written to that partition only)."""
    if not table.key:
        return
    where = f"tables[{i}].key"
    seen: set[str] = set()
    for j, name in enumerate(table.key):
        if name in seen:
            raise ConfigError(
                f"{where}[{j}]", f"{name!r} is listed twice; list each key column once"
            )
        seen.add(name)
    version = table.properties.get("format-version")
    if version is not None and version not in ("2", "3"):
        raise ConfigError(
            f"tables[{i}].properties.format-version",
            f"an upsert table (key = {table.key}) is format version 2 (position and equality "
            f'deletes) or 3 (deletion vectors); set format-version = "2" or "3", or '
            f"remove format-version = {version!r}",
        )
    if table.columns is None:
        if table.infer:
            raise ConfigError(
                where,
                "an upsert table needs a declared schema: infer = true creates optional "
                "columns, and key columns must be required; declare the schema with the key "
                "columns required = true",
            )
        return  # an existing table: its own schema is checked when it is loaded
    required = {column.name: column.required for column in table.columns}
    for j, name in enumerate(table.key):
        if name not in types_by_name:
            raise ConfigError(
                f"{where}[{j}]",
                f"key column {name!r} is not in the schema; use one of {', '.join(types_by_name)}",
            )
        if not required[name]:
            raise ConfigError(
                f"{where}[{j}]",
                f"key column {name!r} must be declared required = true (a row without its "
                "key could never be updated or deleted)",
            )
        problem = key_type_problem(parse_type_string(types_by_name[name]))
        if problem is not None:
            raise ConfigError(f"{where}[{j}]", f"key column {name!r}: {problem}")
    for j, field in enumerate(table.partition_fields):
        if field.column not in seen:
            raise ConfigError(
                f"tables[{i}].partition_by[{j}]",
                f"partition source column {field.column!r} is not a key column; an upsert "
                "table's partition must be determined by its key (add it to key, or "
                f"partition by key columns only: {', '.join(table.key)})",
            )
