"""The config model: exactly the documented keys (README, Configuration), unknown keys rejected.

Single-value checks live on the fields (so pydantic reports the exact location); checks that
relate several values live in ``Config._cross_check`` and raise ConfigError with the dotted
key themselves, because a nested model does not know its own position in the file.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import types
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, Le
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)

from daemon.cdc import OP_COLUMN, key_type_problem
from daemon.config._catalog_keys import (
    SECRET_FILE_SUFFIX,
    canonical_catalog_keys,
    is_secret_file_key,
    pyiceberg_value,
)
from daemon.config._units import format_bytes, format_duration, parse_bytes, parse_duration
from daemon.errors import ConfigError, UnknownTableError
from daemon.schema import (
    PartitionTerm,
    load_schema_file,
    parse_partition,
    parse_sort,
    parse_type_string,
    render_type,
    transform_accepts,
    type_columns,
)

__all__ = [
    "COLUMN_TYPES",
    "DEFAULT_DATA_DIR",
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
    "embedded_catalog",
]

DEFAULT_DATA_DIR = "icespool-data"

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


# ------------------------------------------------------------------ value types


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


def _has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    if _has_control_chars(value):
        raise ValueError("must not contain control characters")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


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
    if "\x00" in value or _has_control_chars(value):
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


def _check_topic(value: str) -> str:
    if not _KAFKA_TOPIC_RE.match(value):
        raise ValueError(
            f"{value!r} is not a Kafka topic name: 1-249 characters of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    return value


TopicName = Annotated[str, AfterValidator(_check_topic)]


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def _check_http_url(value: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} must be an http(s) URL, e.g. 'http://registry:8081'")
    return value.strip()


def _split_servers(value: object) -> object:
    if isinstance(value, str):
        return [s.strip() for s in value.split(",") if s.strip()]
    return value


def _check_server(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} must be 'host:port', e.g. '127.0.0.1:9092'")
    return value


# ------------------------------------------------------------------ partitions


def _check_partition(value: str) -> str:
    parse_partition(value)
    return value


PartitionBy = Annotated[str, AfterValidator(_check_partition)]


# ------------------------------------------------------------------ sections


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _flatten_extras(data: dict[str, Any], fields: frozenset[str]) -> dict[str, Any]:
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


class CatalogConfig(BaseModel):
    """``[catalog]``: passed to pyiceberg ``load_catalog(name, **properties())``.

    Besides the fields, the keys the catalog type takes (``daemon.config._catalog_keys``:
    ``s3.endpoint``, ``credential``, ...), as strings in their canonical spelling; any other
    key is an error naming it. A secret key ``K`` may be given as ``K-file`` (a path);
    ``properties()`` reads the file.
    """

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    __pydantic_extra__: dict[str, str] = Field(init=False)

    name: NonEmptyStr = "icespool"
    type: NonEmptyStr = "sql"
    uri: NonEmptyStr | None = None
    warehouse: NonEmptyStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        flat = _flatten_extras(data, frozenset(cls.model_fields))
        kind = flat.get("type", "sql")
        if not isinstance(kind, str):
            return flat  # the field's own check names the type error
        extras = [k for k in flat if k not in cls.model_fields]
        mapping, problems = canonical_catalog_keys(kind, extras)
        errors = [ConfigError(f"catalog.{p.key}", p.problem) for p in problems]
        for key, canonical in mapping.items():
            try:
                if canonical.endswith(SECRET_FILE_SUFFIX):
                    _read_secret_file(flat[key])
                elif isinstance(flat[key], str):
                    # A trailing newline is dropped as from a secret file: a variable from
                    # a Kubernetes Secret made with --from-file ends in one.
                    flat[key] = flat[key].rstrip("\r\n")
                    # An empty value (a variable set to "") would reach pyiceberg as
                    # "unset" or as an empty secret, and fail far from its cause.
                    _non_empty(flat[key])
            except ValueError as exc:
                errors.append(ConfigError(f"catalog.{key}", str(exc)))
        if errors:
            raise ConfigError.of(errors)
        return {mapping.get(k, k): v for k, v in flat.items()}

    @property
    def configured_extras(self) -> dict[str, str]:
        """The extra keys as configured (secret files as paths)."""
        return dict(self.__pydantic_extra__ or {})

    @property
    def extra_properties(self) -> dict[str, str]:
        """The extra keys as pyiceberg takes them: ``K-file`` replaced by ``K`` = the
        file's content (read at each call; the daemon loads its catalog once, at start)."""
        props: dict[str, str] = {}
        for key, value in self.configured_extras.items():
            if key.endswith(SECRET_FILE_SUFFIX) and is_secret_file_key(key):
                props[key.removesuffix(SECRET_FILE_SUFFIX)] = _read_secret_file(value)
            else:
                props[key] = value
        return props

    def properties(self) -> dict[str, str]:
        """Everything but ``name``, as pyiceberg's ``load_catalog`` takes it."""
        props = {"type": self.type}
        if self.uri is not None:
            props["uri"] = self.uri
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        props.update(self.extra_properties)
        return props


# A secret is a line of text: an OAuth2 client secret, a key, a token (a few KiB at most).
_SECRET_FILE_MAX = 64 * 1024


def _read_secret_file(path: object) -> str:
    if not isinstance(path, str) or not path.strip():
        raise ValueError("must be the path of a file holding the secret")
    try:
        # Regular files only: reading a FIFO or a device (/dev/zero) would block the
        # load, or a SIGHUP reload, for good.
        # O_NONBLOCK: opening a FIFO waits for a writer otherwise (no effect on files).
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ValueError(f"{path!r} is not a regular file; it must hold the secret")
            data = file.read(_SECRET_FILE_MAX + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path!r} ({exc.strerror or exc})") from None
    if len(data) > _SECRET_FILE_MAX:
        raise ValueError(f"{path!r} is larger than 64 KiB; it must hold only the secret")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} is not UTF-8 text") from None
    # A trailing newline is how editors and `kubectl create secret --from-file` end it;
    # a byte order mark is how some editors begin UTF-8.
    value = text.removeprefix("\ufeff").rstrip("\r\n")
    if not value:
        raise ValueError(f"{path!r} is empty; it must hold the secret")
    if _has_control_chars(value):
        # A line break inside reaches an HTTP header, and requests' refusal quotes the
        # whole value: never echo it here.
        raise ValueError(
            f"{path!r} holds a line break or other control characters inside the secret; "
            "it must hold one line"
        )
    return value


def default_data_dir() -> Path:
    return Path(os.path.abspath(DEFAULT_DATA_DIR))


def embedded_catalog(data_dir: Path | None = None) -> dict[str, str]:
    """The embedded default catalog: SQLite SQL catalog and a local warehouse in data_dir."""
    base = Path(os.path.abspath(data_dir)) if data_dir is not None else default_data_dir()
    return {
        "name": "icespool",
        "type": "sql",
        "uri": f"sqlite:///{base / 'catalog.db'}",
        "warehouse": (base / "warehouse").as_uri(),
    }


class SpoolConfig(_Section):
    """``[spool]``: where acked records wait for their Iceberg commit."""

    dir: AbsPath = Field(default_factory=lambda: default_data_dir() / "spool")
    durability: Durability = "page-cache"
    max_bytes: Bytes = 10 * 2**30
    segment_max_bytes: Bytes = 128 * 2**20
    # How long another process's claim on this spool's identity must stay unchanged
    # before this one adopts the spool (daemon/spool_claim.py); renewed every third.
    claim_ttl: Seconds = Field(default=30.0, ge=3.0, le=3600.0)


def _check_listen(value: str) -> str:
    _split_listen(value)
    return value


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"{value!r} must be 'host:port' with a port 0-65535, e.g. '127.0.0.1:8080' "
            "or '[::1]:8080'"
        )
    return host, int(port)


_TOKEN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_token_name(value: str) -> str:
    if not _TOKEN_NAME_RE.match(value):
        raise ValueError(
            f"{value[:80]!r} must be 1-64 letters, digits, '_', '.' or '-' (it is shown in "
            "403 answers and logs), e.g. 'producer-a'"
        )
    return value


def _check_table_glob(value: str) -> str:
    _non_empty(value)
    if "." not in value:
        raise ValueError(
            f"{value!r} must match 'namespace.table' names, e.g. 'shop.*' or 'demo.events' "
            "('*.*' for every table)"
        )
    return value


class TokenConfig(_Section):
    """One ``[[http.tokens]]`` entry: a named Bearer token and what it may do.

    ``tables``: globs over ``namespace.table`` (``fnmatch``: ``*``, ``?``, ``[...]``) the
    token may ingest into; ``admin``: it may also flush, read /v1/status and ingest into
    every table.
    """

    name: Annotated[str, AfterValidator(_check_token_name)]
    token_file: AbsPath
    tables: list[Annotated[str, AfterValidator(_check_table_glob)]] = Field(default_factory=list)
    admin: bool = False


class HttpConfig(_Section):
    """``[http]``: the ingest, admin, metrics and health endpoints."""

    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:8080"
    # One admin token (the contract since 0.1); ``tokens`` adds named, scoped ones.
    auth_token_file: OptionalAbsPath = None
    tokens: list[TokenConfig] = Field(default_factory=list)
    max_body_bytes: Bytes = 64 * 2**20
    # TLS on the listener: both or neither; SIGHUP reloads the files (rotation).
    tls_cert_file: OptionalAbsPath = None
    tls_key_file: OptionalAbsPath = None
    # A request's line and headers must arrive within this once its first byte did (or
    # the connection opened): slow-header clients cannot hold connections for ever.
    header_timeout: Seconds = 10.0
    # A kept-alive connection with no request for this long is closed.
    idle_timeout: Seconds = 60.0
    # Connections one client IP may have read at once (0: no cap). Beyond it a new one
    # waits unread for a place (a connection of that IP without a request is closed to
    # admit one whose request arrived); 503 after header_timeout (daemon.http._conn).
    max_connections_per_ip: Annotated[int, Ge(0)] = 256

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @model_validator(mode="after")
    def _check_http(self) -> HttpConfig:
        # Only [http] holds these, so the dotted keys are known here.
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            missing = "tls_key_file" if self.tls_key_file is None else "tls_cert_file"
            raise ConfigError(
                f"http.{missing}",
                "TLS needs both http.tls_cert_file (PEM certificate chain) and "
                "http.tls_key_file (PEM private key); set both or neither",
            )
        names: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if token.name in names:
                raise ConfigError(
                    f"http.tokens[{i}].name",
                    f"{token.name!r} is already used by http.tokens[{names[token.name]}]; "
                    "give each token its own name",
                )
            names[token.name] = i
            if not token.admin and not token.tables:
                raise ConfigError(
                    f"http.tokens[{i}].tables",
                    f"token {token.name!r} may do nothing: list the tables it may write "
                    "(globs such as 'shop.*') or set admin = true",
                )
        return self

    @property
    def host(self) -> str:
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]


# Python's json recurses per level and stops near 1,000; pyarrow.json's C parser
# must stay far from the stack's end.
NestingDepth = Annotated[int, Ge(1), Le(512)]
# Every commit writes the whole schema into the table's metadata: 60,001 columns made
# 22 MiB of metadata per commit and 50 s requests, so even the cap is capped.
MaxColumns = Annotated[int, Ge(1), Le(100_000)]


class WriterSettings(_Section):
    """``[defaults]``: per-table writer settings; each one can be overridden in ``[[tables]]``."""

    max_batch_records: PositiveInt = 500_000
    max_batch_bytes: Bytes = 256 * 2**20
    batch_timeout: Seconds = 60.0
    target_file_size: Bytes = 128 * 2**20
    compression: Compression = "zstd"
    # pyarrow's own default (1 Mi rows): a 500k-record flush stays one row group per file.
    row_group_records: PositiveInt = 2**20
    max_queue_bytes: Bytes = 512 * 2**20
    # Deepest nesting a JSON record may have; deeper ones are refused (HTTP 400,
    # Kafka dead letter "too_deep") before any parser recurses into them.
    max_nesting_depth: NestingDepth = 64
    # Columns a table may grow to by schema evolution or inference (nested fields
    # counted); a change past it is refused (HTTP 400, Kafka dead letter).
    max_columns: MaxColumns = 1000


class EncodeConfig(_Section):
    """``[encode]``: the encode worker pool."""

    workers: Annotated[int, Ge(0), Le(1024)] = 0

    @property
    def resolved_workers(self) -> int:
        """``workers``, or 2 x the CPU cores this process may run on when it is 0."""
        if self.workers:
            return self.workers
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not on Linux
            cores = os.cpu_count() or 1
        return 2 * max(cores, 1)


class LogConfig(_Section):
    """``[log]``: level and line format (human text or one JSON object per line)."""

    level: Annotated[LogLevel, BeforeValidator(_lower)] = "info"
    format: Annotated[LogFormat, BeforeValidator(_lower)] = "text"


class TimeoutsConfig(_Section):
    """``[timeouts]``: how long one call to a dependency may take before it counts as failed.

    A failed call is retried later (the spool keeps the records), so these bound how long
    a hung dependency can hold a flush, a start-up or a shutdown, not whether data is kept.
    """

    catalog_connect: Seconds = 10.0  # open a connection to the catalog (database, REST)
    catalog_request: Seconds = 30.0  # one catalog statement or request
    storage_connect: Seconds = 10.0  # object store (FileIO) connect
    storage_request: Seconds = 60.0  # one object store request
    # Tries of one object-store call (the AWS SDK's jittered exponential backoff between
    # them) before it counts as failed; the flush is then retried with the writer's backoff.
    storage_attempts: Annotated[int, Ge(1), Le(20)] = 3
    # SIGTERM: tables commit within this; the process ends at most 5 s later.
    shutdown_grace: Seconds = 30.0


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
# The least time a lease must leave its holder to work in (its TTL less the margin).
_LEASE_WORK_MIN: Final = 1.0


class MaintenanceOverride(_Section):
    """A ``[[tables]]`` entry's ``maintenance = { ... }``: overrides of ``[maintenance]``
    for that table (None: the section's value). The daemon-wide keys (``concurrency``,
    ``io_bytes_per_second``, ``lease``) have no per-table form."""

    enabled: bool | None = None
    interval: Seconds | None = None
    run_timeout: Seconds | None = None
    max_snapshot_age: Seconds | None = None
    min_snapshots: MinSnapshots | None = None
    max_snapshots: PositiveInt | None = None
    max_deletes_per_run: PositiveInt | None = None
    compaction: bool | None = None
    compaction_min_files: CompactionMinFiles | None = None
    compaction_max_bytes_per_run: Bytes | None = None
    orphan_older_than: Seconds | None = None
    apply_to_existing: bool | None = None
    lease_ttl: Seconds | None = None

    def overrides(self) -> dict[str, Any]:
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}


class MaintenanceConfig(_Section):
    """``[maintenance]``: the daemon keeps the tables it writes healthy (snapshot expiry and
    the files only expired snapshots reached, small-file compaction, never-committed files),
    one maintainer per table across replicas (a lease in the catalog)."""

    enabled: bool = True
    # How often each table is maintained (its runs are spread over the interval).
    interval: Seconds = 300.0
    # Runs at once across all tables (each one thread, outside the ingest lanes).
    concurrency: MaintenanceConcurrency = 1
    # One table's run gives up after this (its lease also bounds it); retried with backoff.
    run_timeout: Seconds = 600.0
    # Retention of tables without the standard properties history.expire.max-snapshot-age-ms
    # / history.expire.min-snapshots-to-keep (and of the tables the daemon creates).
    max_snapshot_age: Seconds = 6 * 3600.0
    min_snapshots: MinSnapshots = 10
    # A cap whatever the age: the newest max_snapshots stay (min_snapshots always does).
    max_snapshots: PositiveInt = 500
    # Files one run deletes at most; the rest wait for the next run.
    max_deletes_per_run: PositiveInt = 10_000
    compaction: bool = True
    compaction_min_files: CompactionMinFiles = 5
    compaction_max_bytes_per_run: Bytes = 2 * 2**30
    # Read+write budget of compaction, shared by all tables.
    io_bytes_per_second: Bytes = 64 * 2**20
    # How often a table's data location is listed for this spool's never-committed files.
    orphan_older_than: Seconds = 3600.0
    # Set the daemon's table defaults (retention, metadata cleanup, manifest merge) on
    # existing tables too, for the keys they do not set themselves.
    apply_to_existing: bool = False
    # "catalog": a lease in a table property, taken by compare-and-swap (SQL catalogs);
    # "none": no lease, for catalogs that cannot hold one (REST): set it on ONE replica.
    lease: LeaseMode = "catalog"
    # How long a lease lasts unless renewed (unset: 3 x interval).
    lease_ttl: Seconds | None = None

    @property
    def resolved_lease_ttl(self) -> float:
        """``lease_ttl``, or 3 x ``interval`` when unset."""
        return self.lease_ttl if self.lease_ttl is not None else 3 * self.interval


class ColumnConfig(_Section):
    """One entry of a table's ``schema``."""

    name: NonEmptyStr
    type: ColumnType
    required: bool = False
    doc: str | None = None
    # Overrides the table's timestamp_unit for this column (and timestamps nested in it).
    timestamp_unit: TimestampUnit | None = None


def _check_sort(value: str) -> str:
    term, _, _ = parse_sort(value)
    parse_partition(term)
    return value


def _table_properties(value: object) -> object:
    # TOML reads `write.target-file-size-bytes = 1` as nested tables and numbers;
    # Iceberg properties are flat strings.
    return _flatten_extras(value, frozenset()) if isinstance(value, dict) else value


class TableConfig(_Section):
    """One ``[[tables]]`` entry: an Iceberg table and its writer-setting overrides."""

    name: TableName
    create: bool = False
    # "schema" would shadow a BaseModel attribute, hence the alias.
    columns: list[ColumnConfig] | None = Field(default=None, alias="schema")
    partition_by: list[PartitionBy] = Field(default_factory=list)
    # Makes the table an upsert table: its key columns (Iceberg identifier fields).
    # Each change is an upsert or a delete by key; the last change per key wins.
    key: list[NonEmptyStr] = Field(default_factory=list)
    sort_by: list[Annotated[str, AfterValidator(_check_sort)]] = Field(default_factory=list)
    # Table properties set when the table is created (an existing table keeps its own).
    properties: Annotated[dict[str, str], BeforeValidator(_table_properties)] = Field(
        default_factory=dict
    )
    # Create the table from the first batch's inferred schema when none is declared.
    infer: bool = False
    # Unit of epoch numbers in JSON timestamp columns; unset means ISO-8601 text only.
    timestamp_unit: TimestampUnit | None = None
    # Schema evolution: "none", "add-columns" (new optional columns) or "add-and-widen"
    # (also int -> long, float -> double, wider decimal precision).
    evolve: EvolvePolicy = "none"

    # Overrides of [defaults]; None means "use the default".
    max_batch_records: PositiveInt | None = None
    max_batch_bytes: Bytes | None = None
    batch_timeout: Seconds | None = None
    target_file_size: Bytes | None = None
    compression: Compression | None = None
    row_group_records: PositiveInt | None = None
    max_queue_bytes: Bytes | None = None
    max_nesting_depth: NestingDepth | None = None
    max_columns: MaxColumns | None = None
    # Overrides of [maintenance] for this table, e.g. { enabled = false }.
    maintenance: MaintenanceOverride | None = None

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


KafkaMetadataColumn = Literal[
    "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"
]


class KafkaConfig(_Section):
    """One ``[[kafka]]`` consumer: topics (or a pattern) routed to tables."""

    bootstrap_servers: Annotated[
        list[Annotated[str, AfterValidator(_check_server)]],
        BeforeValidator(_split_servers),
        Field(min_length=1),
    ]
    group_id: NonEmptyStr = "icespool"
    topics: list[TopicName] = Field(default_factory=list)
    topic_pattern: Annotated[str, AfterValidator(_check_regex)] | None = None
    # Routing: a static table, or a template filled from a record field or header.
    table: TableName | None = None
    route_field: NonEmptyStr | None = None
    route_header: NonEmptyStr | None = None
    table_template: NonEmptyStr | None = None
    # Create a table (schema inferred from its first records) for a route that has
    # none, instead of dead-lettering its records.
    auto_create: bool = False
    # With auto_create: the most tables this source routes to (declared ones matching
    # the template and those it created); it creates none beyond, and records for
    # further routes are dead letters (reason "table_limit"). A route field holding a
    # user id by mistake must not create a table per user.
    max_tables: PositiveInt = 1000
    format: Literal["json", "raw", "avro"] = "json"
    # format "avro": exactly one of a Confluent-compatible schema registry (values in the
    # Confluent wire format: magic byte 0, 4-byte schema id, Avro binary) or one fixed
    # schema from an .avsc file (values are plain Avro binary).
    schema_registry_url: Annotated[str, AfterValidator(_check_http_url)] | None = None
    schema_registry_username: str | None = None
    schema_registry_password: str | None = None
    schema_registry_timeout: Seconds = 2.0  # one registry request (tried 3 times)
    avro_schema_file: OptionalAbsPath = None
    # Keyed changes for upsert tables ([[tables]] key): "debezium" change events (op
    # c/r/u upsert `after`, d deletes by `before` or the Kafka key), "keyed" rows whose
    # Kafka key carries the key; in both a null value (tombstone) deletes by the key.
    changes: Literal["none", "debezium", "keyed"] = "none"
    # How the Kafka key is read with changes: "json" (an object of the key columns,
    # Debezium's schema envelope allowed, or a scalar for a one-column key), "string"
    # (UTF-8 text, the one key column), "avro" (Confluent wire format, from the
    # schema registry of format = "avro").
    key_format: Literal["json", "string", "avro"] = "json"
    # "table" sends bad records to the table "<table>_dead_letter" (dynamic routing:
    # "<namespace>.kafka_dead_letter"); anything else is a topic.
    dead_letter: Annotated[str, AfterValidator(_non_empty)] = "table"
    metadata_columns: list[KafkaMetadataColumn] = Field(default_factory=list)
    # Bigger values go to the dead-letter destination (reason "oversized").
    max_record_bytes: Bytes = 2**20
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # How old the client's topic metadata may grow: partitions added to a topic (or
    # topics matching topic_pattern) are picked up within it. aiokafka's own 5 min
    # left new partitions unread that long.
    metadata_max_age: Seconds = 30.0
    # "read_committed": records of transactions not committed yet are not read (the
    # partition waits at its last stable offset), those of aborted ones never are.
    # "read_uncommitted" (Kafka's default) reads every record a producer wrote.
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    # How often consumer-group offsets are committed to Kafka (after Iceberg).
    offset_commit_interval: Seconds = 5.0
    max_poll_records: PositiveInt = 20_000
    # A member that stops heartbeating (killed) loses its partitions after this.
    session_timeout: Seconds = 10.0
    # Security, passed through to aiokafka.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: OptionalAbsPath = None
    ssl_certfile: OptionalAbsPath = None
    ssl_keyfile: OptionalAbsPath = None
    ssl_password: str | None = None

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
        return [name for name in tables if _matches_template(self.table_template, name)]


# ------------------------------------------------------------------ the whole config

#: The claims group prefix of dead-letter replay (`daemon.kafka._replay`), which no
#: consumer group may use (the config package cannot import the Kafka one).
REPLAY_GROUP_PREFIX = "dead-letter-replay/"


def _matches_template(template: str, name: str) -> bool:
    prefix, suffix = template.split("{value}")
    return (
        len(name) > len(prefix) + len(suffix)
        and name.startswith(prefix)
        and (name.endswith(suffix))
    )


def _catalog_default() -> CatalogConfig:
    return CatalogConfig.model_validate(embedded_catalog())


class Config(_Section):
    """The effective configuration of one daemon."""

    catalog: CatalogConfig = Field(default_factory=_catalog_default)
    spool: SpoolConfig = Field(default_factory=SpoolConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    defaults: WriterSettings = Field(default_factory=WriterSettings)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    tables: list[TableConfig] = Field(default_factory=list)
    kafka: list[KafkaConfig] = Field(default_factory=list)

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
        check(functools.partial(_check_maintenance, "maintenance", self.maintenance))
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
            check(functools.partial(_check_table, i, table))
            check(functools.partial(_check_width, i, table))
            if table.maintenance is not None:
                check(
                    functools.partial(
                        _check_maintenance,
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
                _matches_template(template, name) for name in tables
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
        _check_avro(i, kafka)
        _check_changes(i, kafka)
        if kafka.sasl_mechanism is not None and not kafka.security_protocol.startswith("SASL"):
            raise ConfigError(
                f"kafka[{i}].security_protocol",
                f"sasl_mechanism is set but security_protocol is {kafka.security_protocol!r}; "
                "use SASL_PLAINTEXT or SASL_SSL",
            )
        if kafka.dead_letter != "table":
            try:
                _check_topic(kafka.dead_letter)
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

    def maintenance_for(self, name: str) -> MaintenanceConfig:
        """Effective ``[maintenance]`` of a table: the section overlaid by the table's
        ``maintenance = {...}`` (tables without an entry: the section as it is)."""
        for table in self.tables:
            if table.name == name and table.maintenance is not None:
                return self.maintenance.model_copy(update=table.maintenance.overrides())
        return self.maintenance

    def table_settings(self, name: str) -> WriterSettings:
        """Effective writer settings of a table: ``[defaults]`` overlaid by its overrides."""
        return self.defaults.model_copy(update=self.table(name).overrides())


def _check_avro(i: int, kafka: KafkaConfig) -> None:
    registry, schema_file = kafka.schema_registry_url, kafka.avro_schema_file
    if kafka.format != "avro":
        for key in ("schema_registry_url", "avro_schema_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(
                    f"kafka[{i}].{key}",
                    f'only used with format = "avro" (format is {kafka.format!r}); remove it',
                )
        return
    if (registry is None) == (schema_file is None):
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
            "format 'avro' routes records before decoding them; route by 'route_header'",
        )
    if schema_file is not None:
        try:
            load_schema_file(schema_file)
        except ValueError as exc:
            raise ConfigError(f"kafka[{i}].avro_schema_file", str(exc)) from None


def _check_changes(i: int, kafka: KafkaConfig) -> None:
    if kafka.changes == "none":
        if kafka.key_format != "json":  # the default, which a rendered config repeats
            raise ConfigError(
                f"kafka[{i}].key_format",
                'only used with changes = "debezium" or "keyed" (changes is \'none\'); '
                "remove it or set 'changes'",
            )
        return
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


def _check_maintenance(
    where: str, m: MaintenanceConfig, keys: frozenset[str] | None = None
) -> None:
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
    if m.lease == "catalog" and m.resolved_lease_ttl < LEASE_CLOCK_MARGIN + _LEASE_WORK_MIN:
        key = blame("interval") if m.lease_ttl is None else blame("lease_ttl", "interval")
        if key is not None:
            raise ConfigError(
                f"{where}.{key}",
                f"the maintenance lease would last {format_duration(m.resolved_lease_ttl)}; "
                f"its holder stops {format_duration(LEASE_CLOCK_MARGIN)} before the end "
                "(replicas' clocks may differ that much), so no run would have time to "
                f"work: make lease_ttl (unset: 3 x interval) at least "
                f"{format_duration(LEASE_CLOCK_MARGIN + _LEASE_WORK_MIN)}",
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


def _check_table(i: int, table: TableConfig) -> None:
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


def _check_width(i: int, table: TableConfig) -> None:
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
    if version is not None and version != "2":
        raise ConfigError(
            f"tables[{i}].properties.format-version",
            f"an upsert table (key = {table.key}) is format version 2 (equality deletes); "
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
