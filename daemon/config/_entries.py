"""The config's arrays of tables: ``[[tables]]`` entries (with their ``schema`` columns) and
``[[kafka]]`` sources.

Checks of one entry that need its position in the file (``tables[2].key``) live in
``icespool.config._checks``; a nested model does not know where it stands.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from icespool.config._sections import MaintenanceOverride, Section, WriterSettings
from icespool.config._values import (
    BootstrapServers,
    Bytes,
    ColumnType,
    Compression,
    EvolvePolicy,
    HttpUrl,
    KafkaMetadataColumn,
    MaxColumns,
    NestingDepth,
    NonEmptyStr,
    OptionalAbsPath,
    PartitionBy,
    PositiveInt,
    Regex,
    Seconds,
    SortTerm,
    TableName,
    TableProperties,
    TimestampUnit,
    TopicName,
)
from icespool.schema._grammar import PartitionTerm, parse_partition

__all__ = ["ColumnConfig", "KafkaConfig", "TableConfig", "matches_template"]


# ------------------------------------------------------------------ [[tables]]


class ColumnConfig(Section):
    """One entry of a table's ``schema``."""

    name: NonEmptyStr
    """Column name (unique case-insensitively)."""
    type: ColumnType
    """Iceberg type, e.g. "long", "decimal(18,2)", "list<string>", "struct<a: int>"."""
    required: bool = False
    """Whether the column is required (a null in it is refused)."""
    doc: str | None = None
    """Column documentation stored in the table's schema."""
    # Also for timestamps nested in it.
    timestamp_unit: TimestampUnit | None = None
    """Epoch unit (s, ms, us, ns) of JSON numbers in this column; overrides the table's."""


class TableConfig(Section):
    """One ``[[tables]]`` entry: an Iceberg table and its writer-setting overrides."""

    name: TableName
    """The table, as "namespace.table"."""
    create: bool = False
    """Whether the daemon creates the table when it does not exist."""
    # "schema" would shadow a BaseModel attribute, hence the alias.
    columns: list[ColumnConfig] | None = Field(default=None, alias="schema")
    """Declared columns (name, type, required, doc, timestamp_unit), in order."""
    partition_by: list[PartitionBy] = Field(default_factory=list)
    """Partition terms, e.g. "day(ts)", "bucket(16, id)", "truncate(4, name)"."""
    # Iceberg identifier fields; each change is an upsert or a delete by key, the last
    # change per key wins.
    key: list[NonEmptyStr] = Field(default_factory=list)
    """Key columns: makes the table an upsert table taking keyed changes."""
    sort_by: list[SortTerm] = Field(default_factory=list)
    """Sort order set at creation: "col [asc|desc] [nulls first|last]", transforms too."""
    # An existing table keeps its own.
    properties: TableProperties = Field(default_factory=dict)
    """Iceberg table properties set when the daemon creates the table."""
    infer: bool = False
    """Whether the table is created from the first batch's inferred schema (no schema)."""
    timestamp_unit: TimestampUnit | None = None
    """Epoch unit (s, ms, us, ns) of JSON numbers in timestamp columns (unset: ISO-8601 only)."""
    evolve: EvolvePolicy = "none"
    """Schema evolution: "none", "add-columns" or "add-and-widen" (also int->long, ...)."""

    # Overrides of [defaults]; None means "use the default".
    max_batch_records: PositiveInt | None = None
    """Records that make this table commit (unset: [defaults] max_batch_records)."""
    max_batch_bytes: Bytes | None = None
    """Spooled bytes that make this table commit (unset: [defaults] max_batch_bytes)."""
    batch_timeout: Seconds | None = None
    """Seconds the oldest uncommitted record may wait (unset: [defaults] batch_timeout)."""
    target_file_size: Bytes | None = None
    """Size in bytes of this table's data files (unset: [defaults] target_file_size)."""
    compression: Compression | None = None
    """Parquet compression of this table (unset: [defaults] compression)."""
    row_group_records: PositiveInt | None = None
    """Most records in one Parquet row group (unset: [defaults] row_group_records)."""
    max_queue_bytes: Bytes | None = None
    """Bytes waiting to be encoded for this table (unset: [defaults] max_queue_bytes)."""
    max_nesting_depth: NestingDepth | None = None
    """Deepest nesting of a record for this table (unset: [defaults] max_nesting_depth)."""
    max_columns: MaxColumns | None = None
    """Columns this table may grow to, nested counted (unset: [defaults] max_columns)."""
    key_index_memory: Bytes | None = None
    """Memory this upsert table's key index may cache (unset: [defaults] key_index_memory)."""
    maintenance: MaintenanceOverride | None = None
    """Overrides of [maintenance] for this table, e.g. { enabled = false }."""

    @property
    def namespace(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)

    @property
    def partition_fields(self) -> list[PartitionTerm]:
        return [parse_partition(spec) for spec in self.partition_by]

    def overrides(self) -> dict[str, Any]:
        """The writer settings this table sets itself."""
        return {
            key: value
            for key in WriterSettings.model_fields
            if (value := getattr(self, key)) is not None
        }


# ------------------------------------------------------------------ [[kafka]]


def matches_template(template: str, name: str) -> bool:
    """Whether table ``name`` is one a ``table_template`` (``ns.{value}``) routes to."""
    prefix, suffix = template.split("{value}")
    return (
        len(name) > len(prefix) + len(suffix)
        and name.startswith(prefix)
        and (name.endswith(suffix))
    )


class KafkaConfig(Section):
    """One ``[[kafka]]`` consumer: topics (or a pattern) routed to tables."""

    bootstrap_servers: BootstrapServers
    """Kafka brokers, "host:port" (a list, or one comma-separated string)."""
    group_id: NonEmptyStr = "icespool"
    """Consumer group the source joins."""
    topics: list[TopicName] = Field(default_factory=list)
    """Topics read (or topic_pattern)."""
    topic_pattern: Regex | None = None
    """Regular expression over topic names read (or topics)."""
    table: TableName | None = None
    """The [[tables]] entry every record is written to (static routing)."""
    route_field: NonEmptyStr | None = None
    """Record field whose value fills table_template's {value} (dynamic routing)."""
    route_header: NonEmptyStr | None = None
    """Kafka header whose value fills table_template's {value} (dynamic routing)."""
    table_template: NonEmptyStr | None = None
    """Table a route value maps to, e.g. "lake.{value}"."""
    auto_create: bool = False
    """Whether a route with no table creates one from its first records (else dead letters)."""
    # A route field holding a user id by mistake must not create a table per user.
    max_tables: PositiveInt = 1000
    """With auto_create: tables this source routes to at most; further routes are dead letters."""
    format: Literal["json", "raw", "avro", "protobuf", "json-schema"] = "json"
    """Value format: "json", "raw" (bytes, key, headers), "avro", "protobuf" or "json-schema"."""
    # Avro: exactly one of the registry (Confluent wire format: magic byte 0, 4-byte
    # schema id, Avro binary) or one fixed .avsc schema (values are plain Avro binary);
    # Protobuf and JSON Schema: the registry.
    schema_registry_url: HttpUrl | None = None
    """avro, protobuf, json-schema: Confluent-compatible registry URL the schemas come from."""
    schema_registry_username: str | None = None
    """Basic auth user name for the schema registry."""
    schema_registry_password: str | None = None
    """Basic auth password for the schema registry (redacted in output)."""
    schema_registry_timeout: Seconds = 2.0
    """Seconds one schema registry request may take (tried 3 times)."""
    avro_schema_file: OptionalAbsPath = None
    """format "avro": an .avsc file with the one schema of plain Avro binary values."""
    # Debezium: op c/r/u upsert `after`, d deletes by `before` or the Kafka key; keyed:
    # the Kafka key carries the key; in both a null value (tombstone) deletes by the key.
    changes: Literal["none", "debezium", "keyed"] = "none"
    """Keyed changes for upsert tables: "none", "debezium" or "keyed"."""
    # "json": an object of the key columns (Debezium's schema envelope allowed) or a
    # scalar for a one-column key; "string": UTF-8 text, the one key column; "avro":
    # Confluent wire format, from the schema registry of format = "avro".
    key_format: Literal["json", "string", "avro"] = "json"
    """How the Kafka key is read with changes: "json", "string" or "avro"."""
    dead_letter: NonEmptyStr = "table"
    """Where bad records go: "table" ("<table>_dead_letter") or a topic name."""
    metadata_columns: list[KafkaMetadataColumn] = Field(default_factory=list)
    """Kafka metadata written as columns: _kafka_topic, _partition, _offset, _timestamp, _key."""
    max_record_bytes: Bytes = 2**20
    """Largest value in bytes; larger ones are dead letters (reason "oversized")."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a partition no table and no group offset knows starts: "earliest" or "latest"."""
    # aiokafka's own 5 min left new partitions unread that long.
    metadata_max_age: Seconds = 30.0
    """Seconds within which partitions added to a topic (or topics to a pattern) are read."""
    # "read_committed": records of open transactions wait (the partition stops at its last
    # stable offset), those of aborted ones are never read.
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    """Transactional records read: "read_uncommitted" (all) or "read_committed"."""
    offset_commit_interval: Seconds = 5.0
    """Seconds between consumer-group offset commits to Kafka (after Iceberg)."""
    max_poll_records: PositiveInt = 20_000
    """Most records one fetch hands on."""
    # The consumer's fetch.min.bytes / fetch.max.wait.ms. Kafka's own default (1 byte)
    # answers each fetch as soon as any record is there: a topic of many partitions at
    # a modest rate then costs a round trip, a wake-up and a spool append per handful
    # of records.
    # A fetch request carries it as a 32-bit integer: a larger one stopped the
    # consumer's fetcher for good (nothing read, the source still connected).
    fetch_min_bytes: Bytes = Field(default=64 * 1024, le=2**31 - 1)
    """Bytes a fetch waits for on the broker (at most fetch_max_wait) before it answers."""
    # A fetch waiting on the broker holds the connection the source's metadata probes
    # and offset look-ups share (the broker answers a connection's requests in order;
    # they give up after 5 s): with a longer wait, a quiet topic's broker looked
    # unreachable and the daemon not ready.
    fetch_max_wait: Seconds = Field(default=0.1, le=1.0)
    """Seconds a fetch waits on the broker for fetch_min_bytes."""
    session_timeout: Seconds = 10.0
    """Seconds after which a member that stops heartbeating loses its partitions."""
    # Security, passed through to aiokafka.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Broker protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""
    sasl_plain_username: str | None = None
    """SASL user name."""
    sasl_plain_password: str | None = None
    """SASL password (redacted in output)."""
    ssl_cafile: OptionalAbsPath = None
    """PEM file of the CAs the brokers' certificates are checked against."""
    ssl_certfile: OptionalAbsPath = None
    """PEM client certificate (TLS client auth)."""
    ssl_keyfile: OptionalAbsPath = None
    """PEM private key of ssl_certfile."""
    ssl_password: str | None = None
    """Password of ssl_keyfile (redacted in output)."""

    @property
    def dynamic(self) -> bool:
        return self.table_template is not None

    @property
    def dead_letter_table(self) -> str | None:
        """The dead-letter table's name, or None when dead letters go to a topic."""
        if self.dead_letter != "table":
            return None
        if self.table is not None:
            return f"{self.table}_dead_letter"
        namespace = (self.table_template or "").split(".", 1)[0]
        return f"{namespace}.kafka_dead_letter"

    def route(self, value: str) -> str:
        """The table a route value maps to."""
        if self.table_template is None:
            raise ValueError("static source: no template")
        return self.table_template.replace("{value}", value)

    def targets(self, tables: Iterable[str]) -> list[str]:
        """The configured tables this source may write (dead-letter table excluded)."""
        if self.table_template is None:
            return [self.table] if self.table else []
        return [name for name in tables if matches_template(self.table_template, name)]
