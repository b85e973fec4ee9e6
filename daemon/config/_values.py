"""The config's value types: units, names and paths as Annotated types checked on the field.

Each type checks one value, so pydantic reports the exact location of a bad one; values are
serialised back in the spelling users write, so check-config's output is valid input again.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, Le
from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer

from icespool.config._units import format_bytes, format_duration, parse_bytes, parse_duration
from icespool.schema._grammar import parse_partition, parse_sort, parse_type_string, render_type

__all__ = [
    "COLUMN_TYPES",
    "LEASE_CLOCK_MARGIN",
    "LEASE_WORK_MIN",
    "AbsPath",
    "BootstrapServers",
    "Bytes",
    "ColumnType",
    "CompactionMinFiles",
    "Compression",
    "Durability",
    "EvolvePolicy",
    "HttpUrl",
    "KafkaMetadataColumn",
    "LeaseMode",
    "Listen",
    "LogFormat",
    "LogLevel",
    "LowerLogFormat",
    "LowerLogLevel",
    "MaintenanceConcurrency",
    "MaxColumns",
    "MinSnapshots",
    "NestingDepth",
    "NonEmptyStr",
    "OptionalAbsPath",
    "PartitionBy",
    "PositiveInt",
    "Regex",
    "Seconds",
    "SortTerm",
    "TableGlob",
    "TableName",
    "TableProperties",
    "TimestampUnit",
    "TokenName",
    "TopicName",
    "check_topic",
    "flatten_extras",
    "has_control_chars",
    "non_empty",
    "split_listen",
]

Durability = Literal["page-cache", "fsync"]
Compression = Literal["zstd", "snappy", "lz4_raw", "gzip", "none"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
LogFormat = Literal["text", "json"]
# Unit of epoch numbers sent for timestamp columns in JSON (unset: only ISO-8601 text).
TimestampUnit = Literal["s", "ms", "us", "ns"]
EvolvePolicy = Literal["none", "add-columns", "add-and-widen"]

# Iceberg primitive types (format v1/v2) plus the parameterised fixed[L] and decimal(P,S).
COLUMN_TYPES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "string",
    "uuid",
    "binary",
    "fixed[L]",
    "decimal(P,S)",
)

_TABLE_NAME_MAX = 255
_KAFKA_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


# Serialised back in the spelling users write, so check-config output is valid input again.
Bytes = Annotated[
    int,
    BeforeValidator(parse_bytes),
    Gt(0),
    PlainSerializer(format_bytes, when_used="json"),
]
Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    Gt(0),
    PlainSerializer(format_duration, when_used="json"),
]
PositiveInt = Annotated[int, Gt(0)]


def _lower(value: object) -> object:
    return value.lower().strip() if isinstance(value, str) else value


def has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    if has_control_chars(value):
        raise ValueError("must not contain control characters")
    return value


NonEmptyStr = Annotated[str, AfterValidator(non_empty)]


def _abs_path(value: object) -> object:
    if isinstance(value, str | Path):
        text = str(value)
        if not text.strip():
            raise ValueError("must be a path, got an empty string")
        if "\x00" in text:
            raise ValueError("a path must not contain NUL")
        return Path(os.path.abspath(os.path.expanduser(text)))
    return value


def _optional_abs_path(value: object) -> object:
    if value == "":
        return None
    return _abs_path(value)


# Relative paths are resolved against the working directory at load time, so the effective
# config (and check-config's output) shows where files really go.
AbsPath = Annotated[Path, BeforeValidator(_abs_path), PlainSerializer(str, when_used="json")]
OptionalAbsPath = Annotated[
    Path | None,
    BeforeValidator(_optional_abs_path),
    PlainSerializer(lambda p: "" if p is None else str(p), when_used="json"),
]


def _check_table_name(value: str) -> str:
    if len(value) > _TABLE_NAME_MAX:
        raise ValueError(f"must be at most {_TABLE_NAME_MAX} characters, got {len(value)}")
    if "\x00" in value or has_control_chars(value):
        raise ValueError("must not contain NUL or control characters")
    if "/" in value or "\\" in value:
        raise ValueError(f"{value!r} must not contain '/' or '\\'; write it as 'namespace.table'")
    parts = value.split(".")
    if len(parts) != 2:
        raise ValueError(
            f"{value!r} must be 'namespace.table': exactly one '.' between two non-empty names"
        )
    for part in parts:
        if not part or part != part.strip():
            raise ValueError(
                f"{value!r} must be 'namespace.table' with non-empty parts and no surrounding "
                "whitespace"
            )
    return value


TableName = Annotated[str, AfterValidator(_check_table_name)]


def _normalise_column_type(value: object) -> object:
    if not isinstance(value, str):
        return value
    # The grammar (nested types included) is shared with the schema builder; the
    # canonical spelling keeps check-config's output valid input.
    return render_type(parse_type_string(value))


ColumnType = Annotated[str, BeforeValidator(_normalise_column_type)]


def check_topic(value: str) -> str:
    if not _KAFKA_TOPIC_RE.match(value):
        raise ValueError(
            f"{value!r} is not a Kafka topic name: 1-249 characters of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    return value


TopicName = Annotated[str, AfterValidator(check_topic)]
KafkaMetadataColumn = Literal[
    "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"
]


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


Regex = Annotated[str, AfterValidator(_check_regex)]


def _check_http_url(value: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} must be an http(s) URL, e.g. 'http://registry:8081'")
    return value.strip()


HttpUrl = Annotated[str, AfterValidator(_check_http_url)]


def _split_servers(value: object) -> object:
    if isinstance(value, str):
        return [s.strip() for s in value.split(",") if s.strip()]
    return value


def _check_server(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} must be 'host:port', e.g. '127.0.0.1:9092'")
    return value


BootstrapServers = Annotated[
    list[Annotated[str, AfterValidator(_check_server)]],
    BeforeValidator(_split_servers),
    Field(min_length=1),
]


def _check_listen(value: str) -> str:
    split_listen(value)
    return value


def split_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as the host and the port."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"{value!r} must be 'host:port' with a port 0-65535, e.g. '127.0.0.1:8080' "
            "or '[::1]:8080'"
        )
    return host, int(port)


Listen = Annotated[str, AfterValidator(_check_listen)]

_TOKEN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_token_name(value: str) -> str:
    if not _TOKEN_NAME_RE.match(value):
        raise ValueError(
            f"{value[:80]!r} must be 1-64 letters, digits, '_', '.' or '-' (it is shown in "
            "403 answers and logs), e.g. 'producer-a'"
        )
    return value


TokenName = Annotated[str, AfterValidator(_check_token_name)]


def _check_table_glob(value: str) -> str:
    non_empty(value)
    if "." not in value:
        raise ValueError(
            f"{value!r} must match 'namespace.table' names, e.g. 'shop.*' or 'demo.events' "
            "('*.*' for every table)"
        )
    return value


TableGlob = Annotated[str, AfterValidator(_check_table_glob)]

LowerLogLevel = Annotated[LogLevel, BeforeValidator(_lower)]
LowerLogFormat = Annotated[LogFormat, BeforeValidator(_lower)]

# Python's json recurses per level and stops near 1,000; pyarrow.json's C parser
# must stay far from the stack's end.
NestingDepth = Annotated[int, Ge(1), Le(512)]
# Every commit writes the whole schema into the table's metadata: 60,001 columns made
# 22 MiB of metadata per commit and 50 s requests, so even the cap is capped.
MaxColumns = Annotated[int, Ge(1), Le(100_000)]

# Never more maintenance runs at once than this: each holds a thread and reads manifests.
MaintenanceConcurrency = Annotated[int, Ge(1), Le(64)]
# Iceberg's own floor for min-snapshots-to-keep is 1: the current snapshot stays.
MinSnapshots = Annotated[int, Ge(1)]
# Compaction bin-packs at least two files, or it only copies one.
CompactionMinFiles = Annotated[int, Ge(2)]
LeaseMode = Literal["catalog", "none"]
#: Wall clocks of replicas may differ by this much: a maintenance lease holder stops
#: acting this long before its lease ends (daemon/maintenance/_lease.py).
LEASE_CLOCK_MARGIN: Final = 2.0
#: The least time a lease must leave its holder to work in (its TTL less the margin).
LEASE_WORK_MIN: Final = 1.0


# ------------------------------------------------------------------ partitions and sorting


def _check_partition(value: str) -> str:
    parse_partition(value)
    return value


PartitionBy = Annotated[str, AfterValidator(_check_partition)]


def _check_sort(value: str) -> str:
    term, _, _ = parse_sort(value)
    parse_partition(term)
    return value


SortTerm = Annotated[str, AfterValidator(_check_sort)]


# ------------------------------------------------------------------ nested TOML keys


def flatten_extras(data: dict[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """``s3.endpoint = "..."`` (a nested table in TOML) becomes the key "s3.endpoint"."""
    out: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        elif isinstance(value, bool):
            out[prefix] = "true" if value else "false"
        elif isinstance(value, int | float):
            out[prefix] = str(value)
        else:
            out[prefix] = value

    for key, value in data.items():
        if key in fields:
            out[key] = value
        else:
            put(str(key), value)
    return out


def _table_properties(value: object) -> object:
    # TOML reads `write.target-file-size-bytes = 1` as nested tables and numbers;
    # Iceberg properties are flat strings.
    return flatten_extras(value, frozenset()) if isinstance(value, dict) else value


TableProperties = Annotated[dict[str, str], BeforeValidator(_table_properties)]
