"""The config model: units, the contract's keys, errors naming keys, env overrides, redaction."""

from __future__ import annotations

import copy
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from icespool.config import (
    ConfigFileError,
    TableConfig,
    WriterSettings,
    apply_env_overrides,
    embedded_default,
    format_bytes,
    format_duration,
    is_secret_key,
    load_config,
    parse_bytes,
    parse_duration,
    redact_uri,
    redacted,
    render_toml,
    validate_config,
)
from icespool.errors import ConfigError, UnknownTableError
from icespool.schema import PartitionTerm, parse_partition

MiB = 2**20
GiB = 2**30

# The example of DESIGN.md's contract, verbatim.
CONTRACT_EXAMPLE = """
[catalog]                 # passed to pyiceberg load_catalog(name, **rest)
name = "lake"
type = "sql"              # sql | rest | glue | hive | ...
uri = "sqlite:////var/lib/icespool/catalog.db"   # or postgresql+psycopg2://...
warehouse = "file:///var/lib/icespool/warehouse" # or s3://...

[spool]
dir = "/var/lib/icespool/spool"
durability = "page-cache" # or "fsync"
max_bytes = "10GiB"

[http]
listen = "127.0.0.1:8080"
auth_token_file = ""      # when set, ingest and admin endpoints need Bearer auth

[defaults]                # per-table writer settings, overridable per table
max_batch_records = 500000
max_batch_bytes = "256MiB"
batch_timeout = "60s"
target_file_size = "128MiB"
compression = "zstd"      # zstd | snappy | lz4_raw | gzip | none

[encode]
workers = 0               # 0 means 2 x CPU cores

[[tables]]
name = "demo.events"      # namespace.table
create = true             # create namespace and table if missing
schema = [
  { name = "event_id", type = "long", required = true },
  { name = "ts",       type = "timestamptz" },
  { name = "kind",     type = "string" },
]
partition_by = ["day(ts)"]

[[kafka]]
bootstrap_servers = "127.0.0.1:9092"
group_id = "icespool"
topics = ["events"]
table = "demo.events"     # static route
format = "json"           # one JSON object per message value
dead_letter = "table"     # "table" -> <table>_dead_letter, or a topic name
"""


def write(tmp_path: Path, text: str, name: str = "icespool.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def raw_contract() -> dict[str, Any]:
    return tomllib.loads(CONTRACT_EXAMPLE)


def config_error(raw: dict[str, Any], env: dict[str, str] | None = None) -> ConfigError:
    merged, sources = apply_env_overrides(raw, env or {})
    with pytest.raises(ConfigError) as info:
        validate_config(merged, sources)
    return info.value


# ------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MiB", 256 * MiB),
        ("10GiB", 10 * GiB),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        (4096, 4096),
        (0, 0),
        (3.0, 3),
        ("1 KiB", 1024),
        ("2kb", 2000),
        ("1_000", 1000),
        ("512Mi", 512 * MiB),
        ("0.5KiB", 512),
        ("7B", 7),
        (" 1TiB ", 2**40),
    ],
)
def test_parse_bytes_accepts(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "lots",
            "'lots' is not a byte size; write a number with an optional unit, e.g. '256MiB' "
            "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024)",
        ),
        (
            "",
            "'' is not a byte size; write a number with an optional unit, e.g. '256MiB' "
            "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024)",
        ),
        (
            "10 parsecs",
            "'10 parsecs': unknown unit 'parsecs' "
            "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024)",
        ),
        (
            "1G",
            "'1G': unit 'G' is ambiguous; write 'GB' (powers of 1000) or 'GiB' (powers of 1024)",
        ),
        ("1.5B", "'1.5B' is not a whole number of bytes"),
        (-1, "a byte size cannot be negative, got -1"),
        (1.5, "a byte size must be a whole number >= 0, got 1.5"),
        (True, "expected a byte size such as '256MiB' or 1048576, got True"),
        ([1], "expected a byte size such as '256MiB' or 1048576, got list"),
    ],
)
def test_parse_bytes_rejects(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_bytes(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("60s", 60.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1m 30s", 90.0),
        ("2d", 172800.0),
        ("1.5", 1.5),
        ("0.1s", 0.1),
        ("60S", 60.0),
        (60, 60.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_accepts(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "60x",
            "'60x': unknown duration unit 'x'; use ms, s, m, h, d (e.g. '500ms', '60s', '5m', "
            "'1h30m')",
        ),
        (
            "soon",
            "'soon' is not a duration; write a number with a unit (ms, s, m, h, d (e.g. "
            "'500ms', '60s', '5m', '1h30m')) or a plain number of seconds",
        ),
        (
            "-5s",
            "'-5s' is not a duration; write a number with a unit (ms, s, m, h, d (e.g. "
            "'500ms', '60s', '5m', '1h30m')) or a plain number of seconds",
        ),
        ("", "empty duration; write e.g. '60s'"),
        (-1, "a duration must be a finite number of seconds >= 0, got -1"),
        (float("inf"), "a duration must be a finite number of seconds >= 0, got inf"),
        (True, "expected a duration such as '60s' or 60, got True"),
        (None, "expected a duration such as '60s' or 60, got NoneType"),
    ],
)
def test_parse_duration_rejects(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_duration(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "text"),
    [(256 * MiB, "256MiB"), (10 * GiB, "10GiB"), (3072, "3KiB"), (1536, "1536"), (0, "0")],
)
def test_format_bytes(value: int, text: str) -> None:
    assert str(format_bytes(value)) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (60.0, "1m"),
        (90.0, "90s"),
        (3600.0, "1h"),
        (0.5, "500ms"),
        (1.25, "1250ms"),
        (1e-05, "0.00001s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_bytes_round_trip(value: int) -> None:
    assert parse_bytes(format_bytes(value)) == value


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_duration_round_trip(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


# ------------------------------------------------------------------ loading


def test_contract_example_loads_with_exact_values(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONTRACT_EXAMPLE), env={})

    assert config.catalog.name == "lake"
    assert config.catalog.properties() == {
        "type": "sql",
        "uri": "sqlite:////var/lib/icespool/catalog.db",
        "warehouse": "file:///var/lib/icespool/warehouse",
    }
    assert config.spool.dir == Path("/var/lib/icespool/spool")
    assert config.spool.durability == "page-cache"
    assert config.spool.max_bytes == 10 * GiB
    assert config.spool.segment_max_bytes == 128 * MiB
    assert (config.http.host, config.http.port) == ("127.0.0.1", 8080)
    assert config.http.auth_token_file is None
    assert config.http.max_body_bytes == 64 * MiB
    assert config.defaults == WriterSettings(
        max_batch_records=500_000,
        max_batch_bytes=256 * MiB,
        batch_timeout=60.0,
        target_file_size=128 * MiB,
        compression="zstd",
        row_group_records=2**20,
        max_queue_bytes=512 * MiB,
    )
    assert config.encode.workers == 0
    assert config.encode.resolved_workers == 2 * len(os.sched_getaffinity(0))
    assert (config.log.level, config.log.format) == ("info", "text")

    (table,) = config.tables
    assert (table.name, table.namespace, table.table) == ("demo.events", "demo", "events")
    assert table.create is True
    assert [(c.name, c.type, c.required) for c in table.columns or []] == [
        ("event_id", "long", True),
        ("ts", "timestamptz", False),
        ("kind", "string", False),
    ]
    assert table.partition_fields == [PartitionTerm("day", "ts")]

    (kafka,) = config.kafka
    assert kafka.bootstrap_servers == ["127.0.0.1:9092"]
    assert (kafka.group_id, kafka.topics, kafka.topic_pattern) == ("icespool", ["events"], None)
    assert (kafka.table, kafka.format, kafka.dead_letter) == ("demo.events", "json", "table")


def test_embedded_default_when_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = Path.cwd() / "icespool-data"

    config = load_config(env={})

    assert config.catalog.name == "icespool"
    assert config.catalog.properties() == {
        "type": "sql",
        "uri": f"sqlite:///{data}/catalog.db",
        "warehouse": f"file://{data}/warehouse",
    }
    assert config.spool.dir == data / "spool"
    assert config.http.listen == "127.0.0.1:8080"
    assert config.kafka == []
    assert config.table_names == ["demo.events"]
    table = config.table("demo.events")
    assert table.create is True
    assert [(c.name, c.type, c.required) for c in table.columns or []] == [
        ("event_id", "long", True),
        ("ts", "timestamptz", False),
        ("kind", "string", False),
    ]
    assert table.partition_by == ["day(ts)"]


def test_icespool_config_env_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[catalog]\nname = "from-env"\nuri = "sqlite:///x.db"\n')
    config = load_config(env={"ICESPOOL_CONFIG": str(path)})
    assert config.catalog.name == "from-env"
    assert config.tables == []


def test_explicit_path_wins_over_icespool_config(tmp_path: Path) -> None:
    a = write(tmp_path, '[log]\nlevel = "debug"\n', "a.toml")
    b = write(tmp_path, '[log]\nlevel = "error"\n', "b.toml")
    assert load_config(a, env={"ICESPOOL_CONFIG": str(b)}).log.level == "debug"


def test_file_without_catalog_gets_the_embedded_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(write(tmp_path, '[spool]\ndurability = "fsync"\n'), env={})
    assert config.catalog.uri == f"sqlite:///{Path.cwd()}/icespool-data/catalog.db"
    assert config.spool.durability == "fsync"
    assert config.tables == []  # the demo table comes only with no file at all


def test_relative_spool_dir_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(write(tmp_path, '[spool]\ndir = "data/spool"\n'), env={})
    assert config.spool.dir == Path.cwd() / "data" / "spool"


def test_missing_file_is_a_config_file_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigFileError) as info:
        load_config(path, env={})
    assert str(info.value) == (
        f"config file '{path}': does not exist; pass an existing file with --config "
        "(or ICESPOOL_CONFIG), or neither to use the embedded default"
    )


def test_invalid_toml_is_a_config_file_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[spool\n")
    with pytest.raises(ConfigFileError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"config file '{path}': is not valid TOML: ")
    assert "line 1" in str(info.value)


# ------------------------------------------------------------------ unknown keys


@pytest.mark.parametrize(
    ("mutate", "key", "problem"),
    [
        (
            lambda r: r.update(bogus=1),
            "bogus",
            "unknown key; valid keys here: catalog, spool, http, defaults, encode, log, timeouts, "
            "maintenance, tables, kafka",
        ),
        (
            lambda r: r["spool"].update(max_byte="1GiB"),
            "spool.max_byte",
            "unknown key; did you mean 'max_bytes'? valid keys here: dir, durability, "
            "max_bytes, segment_max_bytes, claim_ttl",
        ),
        (
            lambda r: r["tables"][0].update(partition=["day(ts)"]),
            "tables[0].partition",
            "unknown key; did you mean 'partition_by'? valid keys here: name, create, schema, "
            "partition_by, key, sort_by, properties, infer, timestamp_unit, evolve, "
            "max_batch_records, "
            "max_batch_bytes, batch_timeout, "
            "target_file_size, compression, row_group_records, max_queue_bytes, max_nesting_depth, "
            "max_columns, key_index_memory, "
            "maintenance",
        ),
        (
            lambda r: r["tables"][0]["schema"][1].update(nullable=True),
            "tables[0].schema[1].nullable",
            "unknown key; valid keys here: name, type, required, doc, timestamp_unit",
        ),
        (
            lambda r: r["kafka"][0].update(topic="events"),
            "kafka[0].topic",
            "unknown key; did you mean 'topics'? valid keys here: bootstrap_servers, group_id, "
            "topics, topic_pattern, table, route_field, route_header, table_template, auto_create, "
            "max_tables, format, "
            "schema_registry_url, schema_registry_username, schema_registry_password, "
            "schema_registry_timeout, "
            "avro_schema_file, changes, key_format, dead_letter, metadata_columns, "
            "max_record_bytes, auto_offset_reset, metadata_max_age, isolation_level, "
            "offset_commit_interval, max_poll_records, fetch_min_bytes, fetch_max_wait, "
            "session_timeout, security_protocol, "
            "sasl_mechanism, sasl_plain_username, sasl_plain_password, ssl_cafile, "
            "ssl_certfile, ssl_keyfile, ssl_password",
        ),
    ],
)
def test_unknown_keys_are_rejected_by_name(mutate: Any, key: str, problem: str) -> None:
    raw = raw_contract()
    mutate(raw)
    error = config_error(raw)
    assert (error.key, error.problem) == (key, problem)
    where = f" (table {raw['tables'][0]['name']!r})" if key.startswith("tables[0]") else ""
    assert str(error) == f"config key {key!r}{where}: {problem}"


def test_catalog_passes_its_keys_through_as_strings() -> None:
    raw = raw_contract()
    raw["catalog"].update(
        {"s3.endpoint": "http://minio:9000", "s3": {"region": "eu-1"}, "pool_pre_ping": True}
    )
    config = validate_config(raw)
    assert config.catalog.extra_properties == {
        "s3.endpoint": "http://minio:9000",
        "s3.region": "eu-1",
        "pool_pre_ping": "true",
    }
    assert config.catalog.properties()["s3.region"] == "eu-1"


# ------------------------------------------------------------------ bad values


@pytest.mark.parametrize(
    ("mutate", "key", "problem"),
    [
        (
            lambda r: r["tables"][0]["schema"][1].update(type="text"),
            "tables[0].schema[1].type",
            "type 'text': unknown type 'text'; use boolean, int, long, float, double, "
            "decimal(P,S), date, time, timestamp, timestamptz, string, uuid, fixed[L], binary, "
            "list<T>, map<K, V> or struct<name: T, ...> (append 'not null' to a nested field, "
            'element or value to make it required), e.g. "map<string, list<long>>"',
        ),
        (
            lambda r: r["tables"][0]["schema"][0].update(type="decimal(40, 2)"),
            "tables[0].schema[0].type",
            "type 'decimal(40, 2)': decimal(40,2) needs 1 <= P <= 38 and 0 <= S <= P, "
            "e.g. decimal(18,2)",
        ),
        (
            lambda r: r["defaults"].update(max_batch_bytes="lots"),
            "defaults.max_batch_bytes",
            "'lots' is not a byte size; write a number with an optional unit, e.g. '256MiB' "
            "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024)",
        ),
        (
            lambda r: r["tables"][0].update(batch_timeout="soon"),
            "tables[0].batch_timeout",
            "'soon' is not a duration; write a number with a unit (ms, s, m, h, d (e.g. "
            "'500ms', '60s', '5m', '1h30m')) or a plain number of seconds",
        ),
        (
            lambda r: r["http"].update(listen="8080"),
            "http.listen",
            "'8080' must be 'host:port' with a port 0-65535, e.g. '127.0.0.1:8080' or '[::1]:8080'",
        ),
        (
            lambda r: r.update(spool=5),
            "spool",
            "must be a table ([section], [[array]] or { key = value }), got int 5",
        ),
        (
            lambda r: r["kafka"][0].update(bootstrap_servers="broker"),
            "kafka[0].bootstrap_servers[0]",
            "'broker' must be 'host:port', e.g. '127.0.0.1:9092'",
        ),
        (
            lambda r: r["kafka"][0].update(table="demo.other"),
            "kafka[0].table",
            "'demo.other' is not defined in [[tables]] (defined: 'demo.events'); add a "
            "[[tables]] entry for it",
        ),
        (
            lambda r: r["kafka"][0].update(topic_pattern="ev.*"),
            "kafka[0].topics",
            "set exactly one of 'topics' (a list of names) or 'topic_pattern' (a regex)",
        ),
        (
            lambda r: r["kafka"][0].pop("table"),
            "kafka[0].table",
            "missing; name the [[tables]] entry these topics are written to",
        ),
        (
            lambda r: r["kafka"][0].update(dead_letter="bad topic!"),
            "kafka[0].dead_letter",
            "use \"table\" or a topic name: 'bad topic!' is not a Kafka topic name: 1-249 "
            "characters of A-Z, a-z, 0-9, '.', '_', '-'",
        ),
        (
            lambda r: r["tables"][0].pop("schema"),
            "tables[0].schema",
            "create = true needs a schema to create the table from, e.g. schema = "
            '[{ name = "id", type = "long", required = true }], or infer = true to create it '
            "from the first batch",
        ),
        (
            lambda r: r["tables"][0].update(partition_by=["day(when)"]),
            "tables[0].partition_by[0]",
            "column 'when' is not in the schema; use one of event_id, ts, kind",
        ),
        (
            lambda r: r["tables"][0].update(partition_by=["day(ts)", "hour(kind)"]),
            "tables[0].partition_by[1]",
            "hour cannot partition 'kind' of type string; use a transform that fits the type "
            "(year/month/day: date or timestamp, hour: timestamp, truncate: "
            "int/long/string/binary/decimal)",
        ),
        (
            lambda r: r["tables"][0].update(partition_by=["bucket(event_id)"]),
            "tables[0].partition_by[0]",
            "'bucket(event_id)': bucket needs a positive number first, e.g. 'bucket(16, event_id)'",
        ),
        (
            lambda r: r["tables"][0]["schema"].append({"name": "KIND", "type": "string"}),
            "tables[0].schema[3].name",
            "'KIND' repeats schema[2] (names are compared case-insensitively, as Spark does); "
            "rename one of them",
        ),
        (
            lambda r: r["tables"].append(copy.deepcopy(r["tables"][0])),
            "tables[1].name",
            "'demo.events' is already defined by tables[0]; define each table once",
        ),
        (
            lambda r: r["spool"].update(max_bytes="64MiB"),
            "spool.segment_max_bytes",
            "128MiB is larger than spool.max_bytes (64MiB); lower it or raise spool.max_bytes",
        ),
        (
            lambda r: r["catalog"].pop("uri"),
            "catalog.uri",
            "a sql catalog needs a database URI, e.g. 'sqlite:////var/lib/icespool/catalog.db'"
            " or 'postgresql+psycopg2://user@host/db'",
        ),
        (
            lambda r: r["tables"][0].pop("name"),
            "tables[0].name",
            "is required but missing; add it",
        ),
        (
            lambda r: r["kafka"][0].update(fetch_max_wait="30s"),
            "kafka[0].fetch_max_wait",
            "Input should be less than or equal to 1; got 30.0",
        ),
        (
            lambda r: r["kafka"][0].update(fetch_min_bytes="2GiB"),
            "kafka[0].fetch_min_bytes",
            "Input should be less than or equal to 2147483647; got 2147483648",
        ),
        (
            lambda r: r["tables"][0].update(max_queue_bytes="1G"),
            "tables[0].max_queue_bytes",
            "'1G': unit 'G' is ambiguous; write 'GB' (powers of 1000) or 'GiB' (powers of 1024)",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_fix(mutate: Any, key: str, problem: str) -> None:
    raw = raw_contract()
    mutate(raw)
    error = config_error(raw)
    assert (error.key, error.problem) == (key, problem)


@pytest.mark.parametrize(
    ("mutate", "key", "problem_start", "got"),
    [
        (
            lambda r: r["defaults"].update(compression="brotli"),
            "defaults.compression",
            "Input should be 'zstd', 'snappy', 'lz4_raw', 'gzip' or 'none'",
            "'brotli'",
        ),
        (
            lambda r: r["spool"].update(durability="sometimes"),
            "spool.durability",
            "Input should be 'page-cache' or 'fsync'",
            "'sometimes'",
        ),
        (
            lambda r: r["defaults"].update(max_batch_records=0),
            "defaults.max_batch_records",
            "Input should be greater than 0",
            "0",
        ),
        (
            lambda r: r["defaults"].update(max_batch_records="5"),
            "defaults.max_batch_records",
            "Input should be a valid integer",
            "'5'",
        ),
        (
            lambda r: r["encode"].update(workers=-1),
            "encode.workers",
            "Input should be greater than or equal to 0",
            "-1",
        ),
        (
            lambda r: r["catalog"].update(name=5),
            "catalog.name",
            "Input should be a valid string",
            "5",
        ),
        (
            lambda r: r["tables"][0].update(create="yes"),
            "tables[0].create",
            "Input should be a valid boolean",
            "'yes'",
        ),
        (
            lambda r: r["catalog"].update(echo=[1]),
            "catalog.echo",
            "Input should be a valid string",
            "[1]",
        ),
    ],
)
def test_type_errors_name_the_key_and_the_bad_value(
    mutate: Any, key: str, problem_start: str, got: str
) -> None:
    raw = raw_contract()
    mutate(raw)
    error = config_error(raw)
    assert error.key == key
    assert error.problem == f"{problem_start}; got {got}"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../etc", "'../etc' must not contain '/' or '\\'; write it as 'namespace.table'"),
        ("a/b.c", "'a/b.c' must not contain '/' or '\\'; write it as 'namespace.table'"),
        ("a\\b.c", "'a\\\\b.c' must not contain '/' or '\\'; write it as 'namespace.table'"),
        ("a.b\x00", "must not contain NUL or control characters"),
        ("a.b\n", "must not contain NUL or control characters"),
        (
            "events",
            "'events' must be 'namespace.table': exactly one '.' between two non-empty names",
        ),
        ("a.b.c", "'a.b.c' must be 'namespace.table': exactly one '.' between two non-empty names"),
        (
            ".events",
            "'.events' must be 'namespace.table' with non-empty parts and no surrounding "
            "whitespace",
        ),
        (
            "demo. events",
            "'demo. events' must be 'namespace.table' with non-empty parts and no surrounding "
            "whitespace",
        ),
        ("d." + "x" * 254, "must be at most 255 characters, got 256"),
    ],
)
def test_table_names_are_validated(name: str, problem: str) -> None:
    raw = raw_contract()
    raw["tables"][0]["name"] = name
    raw["kafka"] = []
    error = config_error(raw)
    assert (error.key, error.problem) == ("tables[0].name", problem)


def test_unicode_and_long_table_names_within_limit_are_accepted() -> None:
    raw = raw_contract()
    raw["tables"][0]["name"] = "données.événements"
    raw["tables"].append({"name": "n." + "x" * 253})
    raw["kafka"] = []
    config = validate_config(raw)
    assert config.table_names == ["données.événements", "n." + "x" * 253]


def test_several_problems_are_all_reported_at_once() -> None:
    raw = raw_contract()
    raw["spool"]["durability"] = "sometimes"
    raw["http"]["listen"] = "nowhere"
    raw["defaults"]["compression"] = "brotli"
    error = config_error(raw)
    assert error.key == "spool.durability"
    assert [p.key for p in error.problems] == [
        "spool.durability",
        "http.listen",
        "defaults.compression",
    ]
    assert str(error).splitlines() == [p.line() for p in error.problems]


def test_cross_field_problems_are_all_reported_and_name_their_table() -> None:
    raw = raw_contract()
    raw["tables"].append({"name": raw["tables"][0]["name"]})  # defined twice
    raw["tables"].append({"name": "demo.other", "create": True})  # no schema to create from
    raw["kafka"][0]["table"] = "demo.missing"
    error = config_error(raw)
    lines = [p.line() for p in error.problems]
    assert [p.key for p in error.problems] == [
        "tables[1].name",
        "tables[2].schema",
        "kafka[0].table",
    ], lines
    assert error.problems[0].table == raw["tables"][0]["name"]
    assert error.problems[1].table == "demo.other"
    assert "(table 'demo.other')" in lines[1]
    assert error.problems[2].table is None


def test_a_type_error_in_a_table_names_the_table() -> None:
    raw = raw_contract()
    raw["tables"][0]["schema"][1]["type"] = "lng"
    error = config_error(raw)
    assert error.key == "tables[0].schema[1].type"
    assert error.table == raw["tables"][0]["name"]
    assert f"(table {raw['tables'][0]['name']!r})" in str(error)


def test_config_is_immutable() -> None:
    config = validate_config(raw_contract())
    with pytest.raises(ValidationError):
        config.spool.max_bytes = 5  # type: ignore[misc]


# ------------------------------------------------------------------ per-table settings


def test_table_settings_overlay_defaults_with_table_overrides() -> None:
    raw = raw_contract()
    raw["defaults"]["compression"] = "snappy"
    raw["tables"][0].update(batch_timeout="5s", max_batch_bytes="1GiB")
    raw["tables"].append({"name": "demo.plain"})
    config = validate_config(raw)

    assert config.table_settings("demo.events") == WriterSettings(
        max_batch_records=500_000,
        max_batch_bytes=GiB,
        batch_timeout=5.0,
        target_file_size=128 * MiB,
        compression="snappy",
        row_group_records=2**20,
        max_queue_bytes=512 * MiB,
    )
    assert config.table_settings("demo.plain") == config.defaults
    with pytest.raises(UnknownTableError) as info:
        config.table_settings("demo.nope")
    assert str(info.value) == (
        "table 'demo.nope' is not configured; add a [[tables]] entry with name = 'demo.nope'"
    )


def test_a_dead_letter_table_writes_with_its_source_tables_settings() -> None:
    """A Kafka source's dead-letter table (not declared) commits on its source table's
    batch_timeout, not [defaults]' (60 s); a declared one keeps its own settings, and a
    routed source's (no one table) gets [defaults]'."""
    raw = raw_contract()
    raw["defaults"]["batch_timeout"] = "60s"
    raw["tables"][0].update(batch_timeout="2s")
    raw["tables"].append({"name": "demo.own_dead_letter", "batch_timeout": "7s"})
    raw["tables"].append({"name": "routed.clicks", "batch_timeout": "3s"})
    raw["kafka"] = [
        {"bootstrap_servers": ["127.0.0.1:9092"], "topics": ["a"], "table": "demo.events"},
        {
            "bootstrap_servers": ["127.0.0.1:9092"],
            "topics": ["b"],
            "table_template": "routed.{value}",
            "route_field": "kind",
        },
    ]
    config = validate_config(raw)
    assert config.writer_settings("demo.events_dead_letter") == config.table_settings("demo.events")
    assert config.writer_settings("demo.events_dead_letter").batch_timeout == 2.0
    assert config.writer_settings("routed.kafka_dead_letter") == config.defaults
    assert config.writer_settings("demo.own_dead_letter").batch_timeout == 7.0
    assert config.writer_settings("routed.clicks").batch_timeout == 3.0
    assert config.writer_settings("routed.anything") == config.defaults


def test_every_default_can_be_overridden_per_table() -> None:
    assert set(WriterSettings.model_fields) <= set(TableConfig.model_fields)


def test_partition_specs_parse() -> None:
    assert parse_partition("bucket(16, event_id)") == PartitionTerm("bucket", "event_id", 16)
    assert parse_partition("truncate(4,kind)") == PartitionTerm("truncate", "kind", 4)
    assert parse_partition("days(ts)") == PartitionTerm("day", "ts")
    assert parse_partition("kind") == PartitionTerm("identity", "kind")
    with pytest.raises(ValueError, match="unknown transform") as info:
        parse_partition("weeks(ts)")
    assert str(info.value).startswith("'weeks(ts)': unknown transform 'weeks'; write 'col', ")


def test_http_listen_accepts_ipv6_and_port_zero() -> None:
    raw = raw_contract()
    raw["http"]["listen"] = "[::1]:0"
    config = validate_config(raw)
    assert (config.http.host, config.http.port) == ("::1", 0)


def test_explicit_worker_count_is_used_as_is() -> None:
    raw = raw_contract()
    raw["encode"]["workers"] = 3
    assert validate_config(raw).encode.resolved_workers == 3


# ------------------------------------------------------------------ environment overrides


def test_env_overrides_set_typed_values(tmp_path: Path) -> None:
    env = {
        "ICESPOOL__SPOOL__MAX_BYTES": "1GiB",
        "ICESPOOL__SPOOL__DURABILITY": "fsync",
        "ICESPOOL__DEFAULTS__MAX_BATCH_RECORDS": "1000",
        "ICESPOOL__HTTP__LISTEN": "0.0.0.0:9000",
        "ICESPOOL__TABLES__0__BATCH_TIMEOUT": "5s",
        "ICESPOOL__TABLES__0__CREATE": "false",
        "ICESPOOL__CATALOG__NAME": "123",
        "ICESPOOL__CATALOG__S3__ENDPOINT": "http://minio:9000",
        "ICESPOOL__LOG__LEVEL": "DEBUG",
        "ICESPOOL__KAFKA__0__TOPICS": '["a", "b"]',
        "ICESPOOL_CONFIG_UNRELATED": "ignored",
    }
    config = load_config(write(tmp_path, CONTRACT_EXAMPLE), env=env)

    assert config.spool.max_bytes == GiB
    assert config.spool.durability == "fsync"
    assert config.defaults.max_batch_records == 1000
    assert config.http.listen == "0.0.0.0:9000"
    assert config.table_settings("demo.events").batch_timeout == 5.0
    assert config.tables[0].create is False
    assert config.catalog.name == "123"  # a string key keeps the text, not the integer
    assert config.catalog.extra_properties == {"s3.endpoint": "http://minio:9000"}
    assert config.log.level == "debug"
    assert config.kafka[0].topics == ["a", "b"]


def test_env_override_applies_to_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(env={"ICESPOOL__HTTP__LISTEN": "127.0.0.1:0"})
    assert config.http.port == 0
    assert config.table_names == ["demo.events"]


@pytest.mark.parametrize(
    ("env", "key", "problem"),
    [
        (
            {"ICESPOOL__SPOOL__MAX_BYTES": "lots"},
            "spool.max_bytes",
            "'lots' is not a byte size; write a number with an optional unit, e.g. '256MiB' "
            "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024) "
            "(set by ICESPOOL__SPOOL__MAX_BYTES)",
        ),
        (
            {"ICESPOOL__SPOOL__NOPE": "1"},
            "spool.nope",
            "unknown key; valid keys here: dir, durability, max_bytes, segment_max_bytes, "
            "claim_ttl (set by ICESPOOL__SPOOL__NOPE)",
        ),
        (
            {"ICESPOOL__TABLES__5__CREATE": "true"},
            "tables",
            "ICESPOOL__TABLES__5__CREATE: '5' is not an index of this array of 1 entries; "
            "use 0..0, or add the entry in the config file",
        ),
        (
            {"ICESPOOL__SPOOL__DIR__X": "1"},
            "spool.dir",
            "ICESPOOL__SPOOL__DIR__X sets a key inside 'spool.dir', which is a value, not a table",
        ),
        (
            {"ICESPOOL____X": "1"},
            "ICESPOOL____X",
            "empty part in the variable name; write ICESPOOL__SECTION__KEY=value",
        ),
    ],
)
def test_bad_env_overrides_name_the_key_and_the_variable(
    env: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(*apply_env_overrides(raw_contract(), env))
    assert (info.value.key, info.value.problem) == (key, problem)


def test_apply_env_overrides_does_not_modify_its_input() -> None:
    raw = embedded_default()
    before = copy.deepcopy(raw)
    merged, sources = apply_env_overrides(raw, {"ICESPOOL__LOG__FORMAT": "json"})
    assert raw == before
    assert merged["log"] == {"format": "json"}
    assert sources == {"log.format": "ICESPOOL__LOG__FORMAT"}


# ------------------------------------------------------------------ redaction and output


def test_redacted_hides_uri_passwords_and_secret_properties() -> None:
    raw = raw_contract()
    raw["catalog"].update(
        {
            "uri": "postgresql+psycopg2://icespool:s3cr3t@db.internal:5432/lake",
            "s3.session-token": "abc123",
            "client.secret-access-key": "client:secret",
            "s3.secret-access-key": "AKIA/SECRET",
            "s3.access-key-id": "AKIA123",
            "s3.endpoint": "http://minio:9000",
        }
    )
    raw["http"]["auth_token_file"] = "/etc/icespool/token"
    catalog = redacted(validate_config(raw))["catalog"]

    assert catalog == {
        "name": "lake",
        "type": "sql",
        "uri": "postgresql+psycopg2://icespool:***@db.internal:5432/lake",
        "warehouse": "file:///var/lib/icespool/warehouse",
        "s3.session-token": "***",
        "client.secret-access-key": "***",
        "s3.secret-access-key": "***",
        "s3.access-key-id": "***",
        "s3.endpoint": "http://minio:9000",
    }
    # The path of the token file is not the token.
    assert redacted(validate_config(raw))["http"]["auth_token_file"] == "/etc/icespool/token"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p@ss/w@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:pw@h/db?x=a@b", "postgresql://u:***@h/db?x=a@b"),
        (
            "postgresql://h/db?password=pw&sslmode=require",
            "postgresql://h/db?password=***&sslmode=require",
        ),
        ("postgresql://user@h/db", "postgresql://user@h/db"),
        ("s3://bucket/a@b:c", "s3://bucket/a@b:c"),
        ("file:///tmp/a:b@c", "file:///tmp/a:b@c"),
        ("sqlite:////var/lib/icespool/catalog.db", "sqlite:////var/lib/icespool/catalog.db"),
        ("not a uri", "not a uri"),
    ],
)
def test_redact_uri(uri: str, expected: str) -> None:
    assert redact_uri(uri) == expected


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("sasl_plain_password", True),
        ("token", True),
        ("gcs.oauth2.token", True),
        ("credential", True),
        ("s3.secret-access-key", True),
        ("adls.account-key", True),
        ("api_key", True),
        ("key", True),
        ("header.Authorization", True),
        # REST headers are an open family: a custom auth header carries a credential.
        ("header.X-Custom-Auth", True),
        ("header.X-Auth-Key", True),
        ("header.X-Iceberg-Access-Delegation", False),
        ("auth_token_file", False),
        ("key_field", False),
        ("partition_key", False),
        ("route_field", False),
        ("s3.endpoint", False),
        ("uri", False),
        ("client_id", False),
    ],
)
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_rendered_toml_reads_back_as_the_same_config() -> None:
    raw = raw_contract()
    raw["catalog"].update({"s3.endpoint": "http://minio:9000", "s3": {"region": "eu-1"}})
    raw["tables"][0].update(batch_timeout="1h30m", compression="gzip")
    raw["tables"][0]["schema"][2]["doc"] = 'what happened, "quoted"\n'
    config = validate_config(raw)

    text = render_toml(redacted(config), header="effective config\nsecond line")

    assert text.startswith("# effective config\n# second line\n")
    assert validate_config(tomllib.loads(text)) == config


def test_rendered_toml_leaves_out_unset_values_at_every_depth() -> None:
    data = {
        "top": None,
        "section": {"kept": 1, "unset": None, "nested": {"a": None, "b": "x"}},
        "entries": [{"name": "t", "doc": None, "cols": [{"n": "c", "d": None}]}],
    }

    text = render_toml(data, header="one")

    assert text.startswith("# one\n\n")
    assert tomllib.loads(text) == {
        "section": {"kept": 1, "nested": {"b": "x"}},
        "entries": [{"name": "t", "cols": [{"n": "c"}]}],
    }
    assert render_toml({}) == "\n"
    with pytest.raises(TypeError, match="set"):
        render_toml({"bad": {1, 2}})


@pytest.mark.parametrize(
    ("kafka", "key", "fragment"),
    [
        ({"route_field": "kind"}, "kafka[0].table_template", "needs both"),
        (
            {"table": None, "route_field": "k", "table_template": "nope"},
            "kafka[0].table_template",
            "namespace.",
        ),
        (
            {"table": None, "route_field": "k", "table_template": "other.{value}"},
            "kafka[0].table_template",
            "no [[tables]] entry matches",
        ),
        (
            {"table": None, "route_field": "k", "route_header": "h", "table_template": "x.{value}"},
            "kafka[0].route_header",
            "not both",
        ),
        ({"sasl_mechanism": "PLAIN"}, "kafka[0].security_protocol", "SASL_PLAINTEXT"),
        ({"format": "protobuf"}, "kafka[0].format", "avro"),
        ({"metadata_columns": ["_kafka_bogus"]}, "kafka[0].metadata_columns", "_kafka_offset"),
    ],
)
def test_bad_kafka_routing_and_security_settings_name_the_key(
    kafka: dict[str, Any], key: str, fragment: str
) -> None:
    raw = raw_contract()
    raw["kafka"][0].update(kafka)
    raw["kafka"][0] = {k: v for k, v in raw["kafka"][0].items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert caught.value.key.startswith(key), caught.value
    assert fragment in str(caught.value), caught.value


def test_auto_create_needs_dynamic_routing() -> None:
    raw = raw_contract()
    raw["kafka"][0]["auto_create"] = True
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert caught.value.key == "kafka[0].auto_create"
    assert "table_template" in str(caught.value)
