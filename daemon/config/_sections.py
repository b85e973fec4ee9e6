"""The config's daemon-wide sections: ``[catalog]``, ``[spool]``, ``[http]``, ``[defaults]``,
``[encode]``, ``[log]``, ``[timeouts]`` and ``[maintenance]``.

Each field carries a one-line docstring (its description in ``Config.model_json_schema()``);
checks that relate several values of one section live on that section, checks across
sections on ``Config``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field, model_validator

from icespool.config._catalog_keys import (
    SECRET_FILE_SUFFIX,
    canonical_catalog_keys,
    is_secret_file_key,
)
from icespool.config._values import (
    AbsPath,
    Bytes,
    CompactionMinFiles,
    Compression,
    Durability,
    LeaseMode,
    Listen,
    LowerLogFormat,
    LowerLogLevel,
    MaintenanceConcurrency,
    MaxColumns,
    MinSnapshots,
    NestingDepth,
    NonEmptyStr,
    OptionalAbsPath,
    PositiveInt,
    Seconds,
    TableGlob,
    TokenName,
    flatten_extras,
    has_control_chars,
    non_empty,
    split_listen,
)
from icespool.errors import ConfigError

__all__ = [
    "DEFAULT_DATA_DIR",
    "CatalogConfig",
    "EncodeConfig",
    "HttpConfig",
    "LogConfig",
    "MaintenanceConfig",
    "MaintenanceOverride",
    "Section",
    "SpoolConfig",
    "TimeoutsConfig",
    "TokenConfig",
    "WriterSettings",
    "default_data_dir",
    "embedded_catalog",
]

DEFAULT_DATA_DIR = "icespool-data"


class Section(BaseModel):
    """A config section: exactly its keys, frozen once loaded, and a description per key
    taken from the attribute docstring under each field."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )


# ------------------------------------------------------------------ [catalog]


class CatalogConfig(BaseModel):
    """``[catalog]``: passed to pyiceberg ``load_catalog(name, **properties())``.

    Besides the fields, the keys the catalog type takes (``icespool.config._catalog_keys``:
    ``s3.endpoint``, ``credential``, ...), as strings in their canonical spelling; any other
    key is an error naming it. A secret key ``K`` may be given as ``K-file`` (a path);
    ``properties()`` reads the file.
    """

    model_config = ConfigDict(
        extra="allow", frozen=True, strict=True, use_attribute_docstrings=True
    )
    __pydantic_extra__: dict[str, str] = Field(init=False)

    name: NonEmptyStr = "icespool"
    """Catalog name given to pyiceberg load_catalog (and to Spark by spark-conf)."""
    type: NonEmptyStr = "sql"
    """Catalog type: sql, rest, hive or glue."""
    uri: NonEmptyStr | None = None
    """Catalog URI: the database URL of a sql catalog, the endpoint of a rest or hive one."""
    warehouse: NonEmptyStr | None = None
    """Warehouse location where new tables' data and metadata go (file://, s3://, ...)."""

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        flat = flatten_extras(data, frozenset(cls.model_fields))
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
                    non_empty(flat[key])
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
    if has_control_chars(value):
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


# ------------------------------------------------------------------ [spool]


class SpoolConfig(Section):
    """``[spool]``: where acked records wait for their Iceberg commit."""

    dir: AbsPath = Field(default_factory=lambda: default_data_dir() / "spool")
    """Directory of the spool's segment files (relative: to the working directory)."""
    durability: Durability = "page-cache"
    """When an ack is sent: "page-cache" (written) or "fsync" (on disk)."""
    max_bytes: Bytes = 10 * 2**30
    """Most bytes the spool may hold; at 90 % Kafka sources pause, when full ingest answers 503."""
    segment_max_bytes: Bytes = 128 * 2**20
    """Size in bytes at which a spool segment file is closed and a new one started."""
    # Renewed every third of it (daemon/lifecycle/spool_claim.py).
    claim_ttl: Seconds = Field(default=30.0, ge=3.0, le=3600.0)
    """Seconds another process's claim on this spool must stay unchanged before it is adopted."""


# ------------------------------------------------------------------ [http]


class TokenConfig(Section):
    """One ``[[http.tokens]]`` entry: a named Bearer token and what it may do.

    ``tables``: globs over ``namespace.table`` (``fnmatch``: ``*``, ``?``, ``[...]``) the
    token may ingest into; ``admin``: it may also flush, read /v1/status and ingest into
    every table.
    """

    name: TokenName
    """Name of the token, shown in 403 answers and logs (1-64 letters, digits, _ . -)."""
    token_file: AbsPath
    """File holding the token (re-read on SIGHUP)."""
    tables: list[TableGlob] = Field(default_factory=list)
    """Globs over namespace.table the token may ingest into, e.g. "shop.*"."""
    admin: bool = False
    """Whether the token may also flush, replay, read /v1/status and write every table."""


class HttpConfig(Section):
    """``[http]``: the ingest, admin, metrics and health endpoints."""

    listen: Listen = "127.0.0.1:8080"
    """Address the HTTP server listens on, host:port ([v6]:port for IPv6)."""
    # The contract since 0.1; ``tokens`` adds named, scoped ones.
    auth_token_file: OptionalAbsPath = None
    """File holding the admin Bearer token; when set, ingest/flush/replay/status need it."""
    tokens: list[TokenConfig] = Field(default_factory=list)
    """Named, scoped Bearer tokens ([[http.tokens]])."""
    max_body_bytes: Bytes = 64 * 2**20
    """Largest request body in bytes; larger ones get 413."""
    # Both or neither; SIGHUP reloads the files (rotation).
    tls_cert_file: OptionalAbsPath = None
    """PEM certificate chain; with tls_key_file the listener is HTTPS."""
    tls_key_file: OptionalAbsPath = None
    """PEM private key (unencrypted) of tls_cert_file."""
    # Slow-header clients cannot hold connections for ever.
    header_timeout: Seconds = 10.0
    """Seconds a request line and headers may take after its first byte (else 408, closed)."""
    idle_timeout: Seconds = 60.0
    """Seconds a kept-alive connection may wait for a request before it is closed."""
    # Beyond the cap a new connection waits unread for a place (a connection of that IP
    # without a request is closed to admit one whose request arrived); 503 after
    # header_timeout (icespool.http._conn).
    max_connections_per_ip: Annotated[int, Ge(0)] = 256
    """Connections one client IP may have read at once (0: no cap); more wait for a place."""

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
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


# ------------------------------------------------------------------ [defaults]


class WriterSettings(Section):
    """``[defaults]``: per-table writer settings; each one can be overridden in ``[[tables]]``."""

    max_batch_records: PositiveInt = 500_000
    """A table commits once this many records are spooled for it."""
    max_batch_bytes: Bytes = 256 * 2**20
    """A table commits once this many bytes are spooled for it."""
    batch_timeout: Seconds = 60.0
    """Seconds the oldest uncommitted record of a table may wait before it commits."""
    target_file_size: Bytes = 128 * 2**20
    """Size in bytes of the Parquet data files written (and compacted to)."""
    compression: Compression = "zstd"
    """Parquet compression: zstd, snappy, lz4_raw, gzip or none."""
    # pyarrow's own default (1 Mi rows): a 500k-record flush stays one row group per file.
    row_group_records: PositiveInt = 2**20
    """Most records in one Parquet row group."""
    max_queue_bytes: Bytes = 512 * 2**20
    """Bytes a table may have waiting to be encoded; beyond it ingest waits (backpressure)."""
    # Refused before any parser recurses into them.
    max_nesting_depth: NestingDepth = 64
    """Deepest nesting a JSON record (or Avro schema) may have (1-512); deeper ones are refused."""
    max_columns: MaxColumns = 1000
    """Columns a table may grow to by evolve/infer, nested fields counted (1-100000)."""
    # The index itself is on disk (the spool directory's key-index/), any size; this is
    # what of it stays in memory.
    key_index_memory: Bytes = 64 * 2**20
    """Memory an upsert table's key index (key -> row position, on disk) may cache."""


# ------------------------------------------------------------------ [encode], [log], [timeouts]


class EncodeConfig(Section):
    """``[encode]``: the encode worker pool."""

    workers: Annotated[int, Ge(0), Le(1024)] = 0
    """Encode worker processes (0: 2 x the CPU cores this process may run on)."""

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


class LogConfig(Section):
    """``[log]``: level and line format (human text or one JSON object per line)."""

    level: LowerLogLevel = "info"
    """Least severity logged: debug, info, warning, error or critical."""
    format: LowerLogFormat = "text"
    """Log line format: "text" (for people) or "json" (one object per line)."""


class TimeoutsConfig(Section):
    """``[timeouts]``: how long one call to a dependency may take before it counts as failed.

    A failed call is retried later (the spool keeps the records), so these bound how long
    a hung dependency can hold a flush, a start-up or a shutdown, not whether data is kept.
    """

    catalog_connect: Seconds = 10.0
    """Seconds to open a connection to the catalog (database connect_timeout, REST connect)."""
    catalog_request: Seconds = 30.0
    """Seconds one catalog statement or REST request may take."""
    storage_connect: Seconds = 10.0
    """Seconds to connect to the object store (FileIO s3.connect-timeout unless set)."""
    storage_request: Seconds = 60.0
    """Seconds one object store request may take (FileIO s3.request-timeout unless set)."""
    # The AWS SDK's jittered exponential backoff runs between them; the flush is then
    # retried with the writer's backoff.
    storage_attempts: Annotated[int, Ge(1), Le(20)] = 3
    """Tries of one object store call before it counts as failed (1-20)."""
    shutdown_grace: Seconds = 30.0
    """Seconds tables have to commit on SIGTERM; the process ends at most 5 s later."""


# ------------------------------------------------------------------ [maintenance]


class MaintenanceOverride(Section):
    """A ``[[tables]]`` entry's ``maintenance = { ... }``: overrides of ``[maintenance]``
    for that table (None: the section's value). The daemon-wide keys (``concurrency``,
    ``io_bytes_per_second``, ``lease``) have no per-table form."""

    enabled: bool | None = None
    """Whether this table is maintained (unset: [maintenance] enabled)."""
    interval: Seconds | None = None
    """Seconds between this table's maintenance runs (unset: [maintenance] interval)."""
    run_timeout: Seconds | None = None
    """Seconds one run on this table may take (unset: [maintenance] run_timeout)."""
    max_snapshot_age: Seconds | None = None
    """Seconds snapshots of this table are kept (unset: [maintenance] max_snapshot_age)."""
    min_snapshots: MinSnapshots | None = None
    """Snapshots of this table always kept (unset: [maintenance] min_snapshots)."""
    max_snapshots: PositiveInt | None = None
    """Most snapshots of this table kept (unset: [maintenance] max_snapshots)."""
    max_deletes_per_run: PositiveInt | None = None
    """Files one run deletes at most (unset: [maintenance] max_deletes_per_run)."""
    compaction: bool | None = None
    """Whether this table's small files are compacted (unset: [maintenance] compaction)."""
    compaction_min_files: CompactionMinFiles | None = None
    """Small files a compaction needs at least (unset: [maintenance] compaction_min_files)."""
    compaction_max_bytes_per_run: Bytes | None = None
    """Bytes one compaction run rewrites at most (unset: the [maintenance] value)."""
    orphan_older_than: Seconds | None = None
    """Seconds between listings for never-committed files (unset: the [maintenance] value)."""
    apply_to_existing: bool | None = None
    """Whether the daemon's table defaults are set on this existing table (unset: section's)."""
    lease_ttl: Seconds | None = None
    """Seconds this table's maintenance lease lasts unless renewed (unset: the section's)."""

    def overrides(self) -> dict[str, Any]:
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}


class MaintenanceConfig(Section):
    """``[maintenance]``: the daemon keeps the tables it writes healthy (snapshot expiry and
    the files only expired snapshots reached, small-file compaction, never-committed files),
    one maintainer per table across replicas (a lease in the catalog)."""

    enabled: bool = True
    """Whether the daemon maintains the tables it writes."""
    interval: Seconds = 300.0
    """Seconds between maintenance runs of each table (runs are spread over the interval)."""
    # Each run takes one thread, outside the ingest lanes.
    concurrency: MaintenanceConcurrency = 1
    """Maintenance runs at once, all tables together (1-64)."""
    # Its lease also bounds it.
    run_timeout: Seconds = 600.0
    """Seconds one table's run may take before it gives up (retried with backoff)."""
    # For tables without the standard properties history.expire.max-snapshot-age-ms /
    # history.expire.min-snapshots-to-keep (and the tables the daemon creates).
    max_snapshot_age: Seconds = 6 * 3600.0
    """Seconds snapshots are kept, unless the table sets history.expire.max-snapshot-age-ms."""
    min_snapshots: MinSnapshots = 10
    """Snapshots always kept, unless the table sets history.expire.min-snapshots-to-keep."""
    # min_snapshots always stays.
    max_snapshots: PositiveInt = 500
    """Most snapshots kept whatever their age (never below min_snapshots, never a ref head)."""
    max_deletes_per_run: PositiveInt = 10_000
    """Files one run deletes at most; the rest wait for the next run."""
    compaction: bool = True
    """Whether the daemon's small files are bin-packed up to target_file_size."""
    compaction_min_files: CompactionMinFiles = 5
    """Small files a compaction needs at least (2 or more)."""
    compaction_max_bytes_per_run: Bytes = 2 * 2**30
    """Bytes one compaction run rewrites at most."""
    io_bytes_per_second: Bytes = 64 * 2**20
    """Compaction's read+write budget in bytes per second, all tables together."""
    orphan_older_than: Seconds = 3600.0
    """Seconds between listings of a table's data location for never-committed files."""
    # For the keys they do not set themselves.
    apply_to_existing: bool = False
    """Whether the daemon's table defaults (retention, cleanup, merge) go on existing tables."""
    # "catalog": a lease in a table property, taken by compare-and-swap (SQL catalogs);
    # "none": no lease, for catalogs that cannot hold one (REST): set it on ONE replica.
    lease: LeaseMode = "catalog"
    """One maintainer per table across replicas: "catalog" (a lease) or "none"."""
    lease_ttl: Seconds | None = None
    """Seconds a maintenance lease lasts unless renewed (unset: 3 x interval)."""

    @property
    def resolved_lease_ttl(self) -> float:
        """``lease_ttl``, or 3 x ``interval`` when unset."""
        return self.lease_ttl if self.lease_ttl is not None else 3 * self.interval
