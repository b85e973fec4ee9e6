"""The whole config: ``Config``, exactly the documented keys
(docs/reference/configuration.md), unknown keys rejected, and the checks that relate
values of several sections.

Single-value checks live on the fields (``icespool.config._values``) so pydantic reports the
exact location; checks that relate several values live in ``Config._cross_check`` (and
``icespool.config._checks``) and raise ConfigError with the dotted key themselves, because a
nested model does not know its own position in the file.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field, model_validator

from icespool.config._catalog_keys import pyiceberg_value
from icespool.config._checks import (
    check_avro,
    check_changes,
    check_maintenance,
    check_table,
    check_width,
)
from icespool.config._entries import ColumnConfig, KafkaConfig, TableConfig, matches_template
from icespool.config._redact import redact_config
from icespool.config._sections import (
    DEFAULT_DATA_DIR,
    CatalogConfig,
    EncodeConfig,
    HttpConfig,
    LogConfig,
    MaintenanceConfig,
    MaintenanceOverride,
    Section,
    SpoolConfig,
    TimeoutsConfig,
    TokenConfig,
    WriterSettings,
    embedded_catalog,
)
from icespool.config._units import format_bytes
from icespool.config._values import (
    COLUMN_TYPES,
    LEASE_CLOCK_MARGIN,
    Compression,
    Durability,
    LogFormat,
    LogLevel,
    TimestampUnit,
    check_topic,
)
from icespool.errors import ConfigError, UnknownTableError

__all__ = [
    "COLUMN_TYPES",
    "DEFAULT_DATA_DIR",
    "LEASE_CLOCK_MARGIN",
    "REPLAY_GROUP_PREFIX",
    "CatalogConfig",
    "ColumnConfig",
    "Compression",
    "Config",
    "Durability",
    "EncodeConfig",
    "HttpConfig",
    "KafkaConfig",
    "LogConfig",
    "LogFormat",
    "LogLevel",
    "MaintenanceConfig",
    "MaintenanceOverride",
    "SpoolConfig",
    "TableConfig",
    "TimeoutsConfig",
    "TimestampUnit",
    "TokenConfig",
    "WriterSettings",
    "annotation_at",
    "embedded_catalog",
    "keys_at",
    "redacted",
]

#: The claims group prefix of dead-letter replay (`icespool.kafka._replay`), which no
#: consumer group may use (the config package cannot import the Kafka one).
REPLAY_GROUP_PREFIX = "dead-letter-replay/"


def _catalog_default() -> CatalogConfig:
    return CatalogConfig.model_validate(embedded_catalog())


class Config(Section):
    """The effective configuration of one daemon."""

    catalog: CatalogConfig = Field(default_factory=_catalog_default)
    """The Iceberg catalog, passed to pyiceberg load_catalog (default: SQLite in the data dir)."""
    spool: SpoolConfig = Field(default_factory=SpoolConfig)
    """The spool: where acked records wait for their Iceberg commit."""
    http: HttpConfig = Field(default_factory=HttpConfig)
    """The HTTP server: ingest, admin, metrics and health endpoints."""
    defaults: WriterSettings = Field(default_factory=WriterSettings)
    """Per-table writer settings; each can be overridden in [[tables]]."""
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    """The encode worker pool."""
    log: LogConfig = Field(default_factory=LogConfig)
    """Log level and line format."""
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    """How long one call to a dependency may take before it fails (and is retried)."""
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    """Table maintenance: snapshot expiry, compaction, never-committed files."""
    tables: list[TableConfig] = Field(default_factory=list)
    """The Iceberg tables written ([[tables]])."""
    kafka: list[KafkaConfig] = Field(default_factory=list)
    """Kafka consumers, each routing topics to tables ([[kafka]])."""

    @model_validator(mode="after")
    def _cross_check(self) -> Config:
        # ConfigError is not a ValueError, so pydantic lets it through with our dotted
        # key. Every check runs, so one error lists every cross-field problem.
        problems: list[ConfigError] = []

        def check(run: Callable[[], None]) -> None:
            try:
                run()
            except ConfigError as exc:
                problems.extend(exc.problems)

        check(self._check_catalog)
        check(self._check_spool)
        check(functools.partial(check_maintenance, "maintenance", self.maintenance))
        seen: dict[str, int] = {}
        for i, table in enumerate(self.tables):
            if table.name in seen:
                problems.append(
                    ConfigError(
                        f"tables[{i}].name",
                        f"{table.name!r} is already defined by tables[{seen[table.name]}]; "
                        "define each table once",
                        table=table.name,
                    )
                )
                continue
            seen[table.name] = i
            check(functools.partial(check_table, i, table))
            check(functools.partial(check_width, i, table))
            if table.maintenance is not None:
                check(
                    functools.partial(
                        check_maintenance,
                        f"tables[{i}].maintenance",
                        self.maintenance.model_copy(update=table.maintenance.overrides()),
                        frozenset(table.maintenance.overrides()),
                    )
                )
        for i, kafka in enumerate(self.kafka):
            check(functools.partial(self._check_kafka, i, kafka, seen))
            check(functools.partial(self._check_change_key, i, kafka))
        if problems:
            raise ConfigError.of(problems)
        return self

    def _check_change_key(self, i: int, kafka: KafkaConfig) -> None:
        """A change's key comes from the record, never from the source's metadata."""
        if kafka.changes == "none":
            return
        try:
            names = set(kafka.targets(self.table_names))
        except ValueError:
            return  # a malformed table_template: _check_kafka names it
        for table in (t for t in self.tables if t.name in names):
            clash = [k for k in table.key if k in kafka.metadata_columns]
            if clash:
                raise ConfigError(
                    f"kafka[{i}].metadata_columns",
                    f"{clash[0]!r} is a key column of {table.name!r}: a change's key comes "
                    "from its value or Kafka key, not from a metadata column; remove it "
                    "from metadata_columns or from the key",
                )

    def _check_catalog(self) -> None:
        problems: list[ConfigError] = []
        if self.catalog.type == "sql" and self.catalog.uri is None:
            problems.append(
                ConfigError(
                    "catalog.uri",
                    "a sql catalog needs a database URI, e.g. 'sqlite:////var/lib/icespool/"
                    "catalog.db' or 'postgresql+psycopg2://user@host/db'",
                )
            )
        # Values pyiceberg hands on unconverted (glue.max-retries reaches botocore as text
        # and fails there with a TypeError at the first catalog call, not at start).
        for key, value in self.catalog.extra_properties.items():
            try:
                pyiceberg_value(key, value)
            except ValueError as exc:
                problems.append(ConfigError(f"catalog.{key}", str(exc)))
        if problems:
            raise ConfigError.of(problems)

    def _check_spool(self) -> None:
        if self.spool.segment_max_bytes > self.spool.max_bytes:
            raise ConfigError(
                "spool.segment_max_bytes",
                f"{format_bytes(self.spool.segment_max_bytes)} is larger than spool.max_bytes "
                f"({format_bytes(self.spool.max_bytes)}); lower it or raise spool.max_bytes",
            )

    @staticmethod
    def _check_kafka(i: int, kafka: KafkaConfig, tables: dict[str, int]) -> None:
        if kafka.group_id.startswith(REPLAY_GROUP_PREFIX):
            # Dead-letter replay claims offsets in the tables under this prefix; a
            # consumer group of that name would share its bookkeeping.
            raise ConfigError(
                f"kafka[{i}].group_id",
                f"{kafka.group_id!r} starts with {REPLAY_GROUP_PREFIX!r}, which dead-letter "
                "replay uses; choose another group id",
            )
        if bool(kafka.topics) == (kafka.topic_pattern is not None):
            raise ConfigError(
                f"kafka[{i}].topics",
                "set exactly one of 'topics' (a list of names) or 'topic_pattern' (a regex)",
            )
        routed = kafka.route_field is not None or kafka.route_header is not None
        if kafka.route_field is not None and kafka.route_header is not None:
            raise ConfigError(
                f"kafka[{i}].route_header", "set one of 'route_field' or 'route_header', not both"
            )
        if routed != (kafka.table_template is not None):
            raise ConfigError(
                f"kafka[{i}].table_template",
                "dynamic routing needs both 'table_template' (e.g. \"ns.{value}\") and one of "
                "'route_field' or 'route_header'",
            )
        if kafka.table_template is not None:
            if kafka.table is not None:
                raise ConfigError(
                    f"kafka[{i}].table", "set either a static 'table' or 'table_template', not both"
                )
            template = kafka.table_template
            if template.count("{value}") != 1 or "." not in template.split("{value}")[0]:
                raise ConfigError(
                    f"kafka[{i}].table_template",
                    f"{template!r} must be 'namespace.<name with {{value}}>', e.g. 'ns.{{value}}'",
                )
            if not kafka.auto_create and not any(
                matches_template(template, name) for name in tables
            ):
                raise ConfigError(
                    f"kafka[{i}].table_template",
                    f"no [[tables]] entry matches {template!r}; declare the tables records "
                    "may be routed to (unknown routes go to the dead-letter destination)",
                )
        elif kafka.auto_create:
            raise ConfigError(
                f"kafka[{i}].auto_create",
                "creates tables for dynamic routes; it needs 'table_template' and "
                "'route_field' or 'route_header'",
            )
        elif kafka.table is None:
            raise ConfigError(
                f"kafka[{i}].table",
                "missing; name the [[tables]] entry these topics are written to",
            )
        elif kafka.table not in tables:
            known = ", ".join(repr(t) for t in tables) or "none"
            raise ConfigError(
                f"kafka[{i}].table",
                f"{kafka.table!r} is not defined in [[tables]] (defined: {known}); "
                "add a [[tables]] entry for it",
            )
        if kafka.format == "raw" and kafka.dynamic and kafka.route_field is not None:
            raise ConfigError(
                f"kafka[{i}].route_field",
                "format 'raw' does not parse values; route raw records by 'route_header'",
            )
        check_avro(i, kafka)
        check_changes(i, kafka)
        if kafka.sasl_mechanism is not None and not kafka.security_protocol.startswith("SASL"):
            raise ConfigError(
                f"kafka[{i}].security_protocol",
                f"sasl_mechanism is set but security_protocol is {kafka.security_protocol!r}; "
                "use SASL_PLAINTEXT or SASL_SSL",
            )
        if kafka.dead_letter != "table":
            try:
                check_topic(kafka.dead_letter)
            except ValueError as exc:
                raise ConfigError(
                    f"kafka[{i}].dead_letter", f'use "table" or a topic name: {exc}'
                ) from None

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    @functools.cached_property
    def _tables_by_name(self) -> tuple[list[TableConfig], dict[str, TableConfig]]:
        # With the list it indexes: `model_copy(update={"tables": ...})` (a reload)
        # copies this cache along, and must not find the old list's entries.
        return self.tables, {t.name: t for t in self.tables}

    def table(self, name: str) -> TableConfig:
        """The ``[[tables]]`` entry called ``name``; UnknownTableError if there is none.

        O(1): looked up once per table at start-up and per table on reload, which was
        O(tables^2) as a scan."""
        indexed, by_name = self._tables_by_name
        if indexed is not self.tables:
            del self.__dict__["_tables_by_name"]
            indexed, by_name = self._tables_by_name
        table = by_name.get(name)
        if table is not None:
            return table
        raise UnknownTableError(
            f"table {name!r} is not configured; add a [[tables]] entry with name = {name!r}"
        )

    def table_settings(self, name: str) -> WriterSettings:
        """Effective writer settings of a table: ``[defaults]`` overlaid by its overrides."""
        return self.defaults.model_copy(update=self.table(name).overrides())

    def writer_settings(self, name: str) -> WriterSettings:
        """The writer settings of any table the daemon writes: a declared table's
        (`table_settings`); a Kafka source's dead-letter table, those of the source's
        declared table (its dead letters commit on that table's schedule, not on
        ``[defaults]``', which may be far longer); any other table's, ``[defaults]``."""
        sources = [k.table for k in self.kafka if k.dead_letter_table == name and k.table]
        for declared in (name, *sources):
            with contextlib.suppress(UnknownTableError):
                return self.table_settings(declared)
        return self.defaults


# ------------------------------------------------------------------ schema navigation


def _unwrap(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_field(model: type[BaseModel], key: str) -> Any | None:
    for name, info in model.model_fields.items():
        if (info.alias or name) == key:
            return info.annotation
    return None


def annotation_at(path: Sequence[str | int]) -> Any | None:
    """The (unwrapped) type at a location in Config, or None when the location is unknown."""
    tp: Any = Config
    for part in path:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            tp = _model_field(tp, part)
            if tp is None:
                return None
        elif get_origin(tp) is list and isinstance(part, int):
            tp = get_args(tp)[0]
        else:
            return None
    return _unwrap(tp)


def keys_at(path: Sequence[str | int]) -> list[str]:
    """The keys a section at ``path`` accepts (empty when it is not a section)."""
    tp = annotation_at(path)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [info.alias or name for name, info in tp.model_fields.items()]
    return []


# ------------------------------------------------------------------ printing


def redacted(config: Config) -> dict[str, Any]:
    """The effective config as plain data (the spelling a config file uses), secrets hidden."""
    return redact_config(config.model_dump(mode="json", by_alias=True, exclude_none=True))
