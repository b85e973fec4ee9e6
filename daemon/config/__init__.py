"""icespool's configuration: the documented TOML contract as validated, immutable models.

    config = load_config("/etc/icespool/icespool.toml")  # None: $ICESPOOL_CONFIG or the default
    settings = config.table_settings("demo.events")       # [defaults] + the table's overrides

Every problem is a ``icespool.errors.ConfigError`` whose ``key`` is the dotted path of the value
at fault (``tables[0].schema[1].type``) and whose message says how to fix it.
"""

from __future__ import annotations

from icespool.config._catalog_keys import (
    CATALOG_TYPES,
    STORAGE_KEYS,
    canonical_catalog_keys,
    pyiceberg_value,
)
from icespool.config._load import (
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigFileError,
    apply_env_overrides,
    embedded_default,
    env_overrides,
    format_key,
    load_config,
    read_config_file,
    resolve_config_path,
    validate_config,
)
from icespool.config._model import (
    COLUMN_TYPES,
    DEFAULT_DATA_DIR,
    LEASE_CLOCK_MARGIN,
    CatalogConfig,
    ColumnConfig,
    Compression,
    Config,
    Durability,
    EncodeConfig,
    HttpConfig,
    KafkaConfig,
    LogConfig,
    LogFormat,
    LogLevel,
    MaintenanceConfig,
    MaintenanceOverride,
    SpoolConfig,
    TableConfig,
    TimeoutsConfig,
    TokenConfig,
    WriterSettings,
    embedded_catalog,
    redacted,
)
from icespool.config._redact import REDACTED, hide_secrets, is_secret_key, redact_uri, redact_value
from icespool.config._render import render_toml
from icespool.config._units import (
    format_bytes,
    format_duration,
    human_bytes,
    human_seconds,
    parse_bytes,
    parse_duration,
)

__all__ = [
    "CATALOG_TYPES",
    "COLUMN_TYPES",
    "CONFIG_ENV",
    "DEFAULT_DATA_DIR",
    "ENV_PREFIX",
    "LEASE_CLOCK_MARGIN",
    "REDACTED",
    "STORAGE_KEYS",
    "CatalogConfig",
    "ColumnConfig",
    "Compression",
    "Config",
    "ConfigFileError",
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
    "TokenConfig",
    "WriterSettings",
    "apply_env_overrides",
    "canonical_catalog_keys",
    "embedded_catalog",
    "embedded_default",
    "env_overrides",
    "format_bytes",
    "format_duration",
    "format_key",
    "hide_secrets",
    "human_bytes",
    "human_seconds",
    "is_secret_key",
    "load_config",
    "parse_bytes",
    "parse_duration",
    "pyiceberg_value",
    "read_config_file",
    "redact_uri",
    "redact_value",
    "redacted",
    "render_toml",
    "resolve_config_path",
    "validate_config",
]
