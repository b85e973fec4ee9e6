"""The icespool command (run as a real process) and the logging setup."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import structlog

from icespool.cli import main
from icespool.logs import configure_logging
from icespool.schema._grammar import TYPE_HELP

CONSOLE_SCRIPT = Path(sys.executable).parent / "icespool"
# The installed console script and `python -m icespool` must behave the same.
COMMANDS = {
    "console-script": [str(CONSOLE_SCRIPT)],
    "python-m-icespool": [sys.executable, "-m", "icespool"],
}

GOOD_CONFIG = """
[catalog]
name = "lake"
type = "sql"
uri = "postgresql+psycopg2://icespool:s3cr3t@db.internal:5432/lake"
warehouse = "file:///var/lib/icespool/warehouse"
"s3.session-token" = "abc123"

[spool]
dir = "/var/lib/icespool/spool"
durability = "fsync"
max_bytes = "10GiB"

[[tables]]
name = "demo.events"
create = true
schema = [
  { name = "event_id", type = "long", required = true },
  { name = "ts",       type = "timestamptz" },
  { name = "kind",     type = "string" },
]
partition_by = ["day(ts)"]
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    env.update(extra)
    return env


def icespool(
    command: list[str], *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "icespool.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(params=sorted(COMMANDS))
def command(request: pytest.FixtureRequest) -> list[str]:
    return COMMANDS[request.param]


# ------------------------------------------------------------------ check-config


def test_console_script_is_installed() -> None:
    assert CONSOLE_SCRIPT.is_file()
    assert os.access(CONSOLE_SCRIPT, os.X_OK)


def test_check_config_prints_the_effective_config_redacted(
    command: list[str], tmp_path: Path
) -> None:
    path = write(tmp_path, GOOD_CONFIG)

    proc = icespool(command, "check-config", "--config", str(path), cwd=tmp_path)

    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert lines[:2] == [
        f"# icespool effective config from the config file {path}",
        "# secrets are shown as ***",
    ]
    data = tomllib.loads(proc.stdout)
    assert data["catalog"] == {
        "name": "lake",
        "type": "sql",
        "uri": "postgresql+psycopg2://icespool:***@db.internal:5432/lake",
        "warehouse": "file:///var/lib/icespool/warehouse",
        "s3.session-token": "***",
    }
    assert data["spool"] == {
        "dir": "/var/lib/icespool/spool",
        "durability": "fsync",
        "max_bytes": "10GiB",
        "segment_max_bytes": "128MiB",
        "claim_ttl": "30s",
    }
    assert data["defaults"]["batch_timeout"] == "1m"
    assert [t["name"] for t in data["tables"]] == ["demo.events"]
    assert "s3cr3t" not in proc.stdout
    assert "abc123" not in proc.stdout


def test_check_config_json_output(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG)

    proc = icespool(
        COMMANDS["console-script"],
        "check-config",
        "--config",
        str(path),
        "--format",
        "json",
        cwd=tmp_path,
    )

    assert (proc.returncode, proc.stderr) == (0, "")
    data = json.loads(proc.stdout)
    assert data["catalog"]["uri"] == "postgresql+psycopg2://icespool:***@db.internal:5432/lake"
    assert data["catalog"]["s3.session-token"] == "***"
    assert data["http"] == {
        "listen": "127.0.0.1:8080",
        "tokens": [],
        "max_body_bytes": "64MiB",
        "header_timeout": "10s",
        "idle_timeout": "1m",
        "max_connections_per_ip": 256,
    }


def test_check_config_lists_every_problem_at_once(command: list[str], tmp_path: Path) -> None:
    broken = GOOD_CONFIG.replace('type = "timestamptz"', 'type = "text"')
    broken += '\n[log]\nlevel = "loud"\n'
    path = write(tmp_path, broken)

    proc = icespool(command, "check-config", "--config", str(path), cwd=tmp_path)

    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: config key 'log.level': ")
    assert lines[1].startswith(
        "error: config key 'tables[0].schema[1].type' (table 'demo.events'): type 'text'"
    )


def test_check_config_bad_value_exits_2_naming_the_key(command: list[str], tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG.replace('type = "timestamptz"', 'type = "text"'))

    proc = icespool(command, "check-config", "--config", str(path), cwd=tmp_path)

    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "error: config key 'tables[0].schema[1].type' (table 'demo.events'): type 'text': "
        "unknown type 'text'; "
        f"{TYPE_HELP}\n"
    )


def test_check_config_unknown_key_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG.replace("[spool]\n", "[spool]\nmax_byte = 1\n"))

    proc = icespool(COMMANDS["console-script"], "check-config", "--config", str(path), cwd=tmp_path)

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: config key 'spool.max_byte': unknown key; did you mean 'max_bytes'? "
        "valid keys here: dir, durability, max_bytes, segment_max_bytes, claim_ttl\n"
    )


def test_check_config_missing_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"

    proc = icespool(COMMANDS["console-script"], "check-config", "--config", str(path), cwd=tmp_path)

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"error: config file '{path}': does not exist; pass an existing file with --config "
        "(or ICESPOOL_CONFIG), or neither to use the embedded default\n"
    )


def test_check_config_invalid_toml_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "[catalog\n")

    proc = icespool(COMMANDS["console-script"], "check-config", "--config", str(path), cwd=tmp_path)

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(f"error: config file '{path}': is not valid TOML: ")
    assert proc.stderr.count("\n") == 1


def test_check_config_without_file_shows_the_embedded_default(tmp_path: Path) -> None:
    proc = icespool(COMMANDS["console-script"], "check-config", cwd=tmp_path)

    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines()[0] == (
        "# icespool effective config from the embedded default (no config file)"
    )
    data = tomllib.loads(proc.stdout)
    cwd = Path(os.path.realpath(tmp_path))
    assert data["catalog"] == {
        "name": "icespool",
        "type": "sql",
        "uri": f"sqlite:///{cwd}/icespool-data/catalog.db",
        "warehouse": f"file://{cwd}/icespool-data/warehouse",
    }
    assert data["spool"]["dir"] == f"{cwd}/icespool-data/spool"
    assert data["http"]["listen"] == "127.0.0.1:8080"
    assert data["tables"] == [
        {
            "name": "demo.events",
            "create": True,
            "schema": [
                {"name": "event_id", "type": "long", "required": True},
                {"name": "ts", "type": "timestamptz", "required": False},
                {"name": "kind", "type": "string", "required": False},
            ],
            "partition_by": ["day(ts)"],
            "key": [],
            "sort_by": [],
            "properties": {},
            "infer": False,
            "evolve": "none",
        }
    ]
    # Checking a config must not create anything.
    assert list(tmp_path.iterdir()) == []


def test_check_config_reads_icespool_config_and_env_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG)
    env = clean_env(ICESPOOL_CONFIG=str(path), ICESPOOL__HTTP__LISTEN="0.0.0.0:9000")

    proc = icespool(COMMANDS["console-script"], "check-config", cwd=tmp_path, env=env)

    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines()[:3] == [
        f"# icespool effective config from the config file {path}",
        "# environment overrides: ICESPOOL__HTTP__LISTEN",
        "# secrets are shown as ***",
    ]
    assert tomllib.loads(proc.stdout)["http"]["listen"] == "0.0.0.0:9000"


def test_check_config_bad_env_override_names_key_and_variable(tmp_path: Path) -> None:
    env = clean_env(ICESPOOL__SPOOL__MAX_BYTES="lots")

    proc = icespool(COMMANDS["console-script"], "check-config", cwd=tmp_path, env=env)

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: config key 'spool.max_bytes': 'lots' is not a byte size; write a number with "
        "an optional unit, e.g. '256MiB' (B; KB, MB, GB, TB are powers of 1000; KiB, MiB, "
        "GiB, TiB powers of 1024) (set by ICESPOOL__SPOOL__MAX_BYTES)\n"
    )


def test_spark_conf_prints_the_jdbc_catalog_and_leaves_the_password_out(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG)

    proc = icespool(COMMANDS["console-script"], "spark-conf", "--config", str(path), cwd=tmp_path)

    assert (proc.returncode, proc.stderr) == (
        0,
        "note: secret spark.sql.catalog.lake.jdbc.password left out; add it at submit time, "
        "or rerun with --include-secrets and keep the output private\n"
        "note: secret spark.sql.catalog.lake.s3.session-token left out; add it at submit time, "
        "or rerun with --include-secrets and keep the output private\n",
    )
    assert proc.stdout == (
        "--conf spark.jars.packages=org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0,"
        "org.postgresql:postgresql:42.7.14\n"
        "--conf spark.sql.extensions="
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions\n"
        "--conf spark.sql.catalog.lake=org.apache.iceberg.spark.SparkCatalog\n"
        "--conf spark.sql.catalog.lake.catalog-impl=org.apache.iceberg.jdbc.JdbcCatalog\n"
        "--conf spark.sql.catalog.lake.uri=jdbc:postgresql://db.internal:5432/lake\n"
        "--conf spark.sql.catalog.lake.jdbc.schema-version=V1\n"
        "--conf spark.sql.catalog.lake.jdbc.init-catalog-tables=false\n"
        "--conf spark.sql.catalog.lake.jdbc.user=icespool\n"
        "--conf spark.sql.catalog.lake.warehouse=file:///var/lib/icespool/warehouse\n"
        "--conf spark.sql.catalog.lake.cache-enabled=false\n"
    )


def test_spark_conf_refuses_to_rename_a_sql_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_CONFIG)

    proc = icespool(
        COMMANDS["console-script"],
        "spark-conf",
        "--config",
        str(path),
        "--catalog-name",
        "other",
        cwd=tmp_path,
    )

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: a sql catalog is seen by Spark only under the daemon's catalog name 'lake' "
        "(Iceberg's JdbcCatalog and pyiceberg's SqlCatalog both key the iceberg_tables rows by "
        "it), not 'other'; drop --catalog-name or rename [catalog] name\n"
    )


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: icespool [-h] [--version] COMMAND ...\n")
    assert err.endswith("error: the following arguments are required: COMMAND\n")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"icespool {metadata.version('icespool')}\n"


def test_log_options_are_validated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--log-format", "xml"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: icespool run ")
    # The tail of argparse's message differs between Python versions.
    assert "icespool run: error: argument --log-format: invalid choice: 'xml'" in err


def test_a_reader_that_goes_away_is_no_traceback(command: list[str], tmp_path: Path) -> None:
    """`icespool ... | head`: the pipe closed before the output is written is exit 0 and
    nothing on stderr, not a BrokenPipeError traceback."""
    read, written = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [*command, "check-config", "--format", "json"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=written,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(written)
    assert (result.returncode, result.stderr) == (0, "")


def test_tables_json_help_says_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tables", "--help"])
    tables_help = " ".join(capsys.readouterr().out.split())
    assert "each table's /v1/status entry with its 'degraded' reason" in tables_help
    assert "raw /v1/status" not in tables_help
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "print the raw /v1/status JSON" in capsys.readouterr().out


def test_a_port_in_use_names_the_setting_and_variable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = icespool(
            COMMANDS["console-script"],
            "run",
            "--log-format",
            "text",
            cwd=tmp_path,
            env=clean_env(ICESPOOL__HTTP__LISTEN=f"127.0.0.1:{port}"),
        )
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: " in result.stderr
    assert (
        "give another address in [http] listen or as ICESPOOL__HTTP__LISTEN "
        "(e.g. ICESPOOL__HTTP__LISTEN=127.0.0.1:8081)" in result.stderr
    )


# ------------------------------------------------------------------ logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_logging")
def test_text_logs_are_one_readable_line_with_extras() -> None:
    stream = io.StringIO()
    configure_logging("info", "text", stream=stream)
    log = logging.getLogger("icespool.test")

    log.info("flushed batch", extra={"table": "demo.events", "records": 10})
    log.debug("not shown at info")

    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[info\s*\] flushed batch\s+"
        r"\[icespool\.test\] records=10 table=demo\.events\n",
        stream.getvalue(),
    )


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_are_one_object_per_line_with_extras() -> None:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    log = logging.getLogger("icespool.test")

    log.debug("flushed batch", extra={"table": "demo.events", "records": 10})
    try:
        raise RuntimeError("catalog down")
    except RuntimeError:
        log.exception("commit failed", extra={"table": "demo.events"})

    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", first.pop("timestamp"))
    assert first == {
        "event": "flushed batch",
        "level": "debug",
        "logger": "icespool.test",
        "table": "demo.events",
        "records": 10,
    }
    assert second["event"] == "commit failed"
    assert second["level"] == "error"
    assert second["table"] == "demo.events"
    assert second["exception"].startswith("Traceback (most recent call last):\n")
    assert second["exception"].endswith("RuntimeError: catalog down")


@pytest.mark.usefixtures("restore_logging")
def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "text", stream=first)
    configure_logging("warning", "json", stream=second)
    log = logging.getLogger("icespool.test")

    log.info("dropped at warning")
    log.warning("kept")

    assert first.getvalue() == ""
    (line,) = second.getvalue().splitlines()
    assert json.loads(line)["event"] == "kept"


def test_bad_log_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging("loud", "text")
