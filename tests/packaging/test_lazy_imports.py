"""What the CLI and an HTTP-only daemon import: checked on the modules, not on time.

`icespool --help`, `check-config`, `spark-conf`, `status` and `tables` must start in a
fraction of a second, so they import no pyarrow, no catalog side of pyiceberg, no Kafka
client and no aiohttp server (the config model's type grammar may use pyiceberg's type
classes: `pyiceberg.types` and what it imports). A daemon without `[[kafka]]` never imports
aiokafka (nor the fence icespool.kafka._upstream, which reaches into its internals).
Each case runs in a fresh interpreter and reports its `sys.modules`; the contrast cases
(`check-config --connect`, a Kafka source configured) show the probe sees the imports.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fixture_types import RunDaemon

# Runs the CLI's main in-process with argv, then reports its exit code, output and modules.
CLI_RUNNER = """
import contextlib, io, json, sys
from icespool.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                  "modules": sorted(sys.modules)}))
"""

# What `icespool run` imports (icespool.app), then a started service behind the
# HTTP server with the embedded default under argv[1] and the [[kafka]] list argv[2]; one
# record goes in and is committed over HTTP before the modules are reported.
SERVICE_RUNNER = """
import asyncio, json, sys, urllib.request
from pathlib import Path
import icespool.app
from icespool.config import embedded_default, validate_config
from icespool.http import start_http
from icespool.lifecycle.service import Icespool

def post(url, body):
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)

async def main():
    raw = embedded_default(Path(sys.argv[1]))
    raw["encode"] = {"workers": 2}
    raw["kafka"] = json.loads(sys.argv[2])
    config = validate_config(raw)
    service = Icespool(config)
    await service.start()
    http = await start_http(service, "127.0.0.1", 0, max_body_bytes=config.http.max_body_bytes)
    base = f"http://127.0.0.1:{http.port}/v1/tables/demo.events"
    try:
        accepted = await asyncio.to_thread(post, base + "/records", b'{"event_id": 1}\\n')
        flushed = await asyncio.to_thread(post, base + "/flush", b"")
    finally:
        await http.stop()
        await service.stop()
    return accepted, flushed["records"]

accepted, records = asyncio.run(main())
print(json.dumps({"accepted": accepted, "records": records, "modules": sorted(sys.modules)}))
"""

# Top-level packages (and daemon modules) none of the light commands may import.
HEAVY = (
    "pyarrow",
    "aiokafka",
    "aiohttp",
    "numpy",
    "icespool.app",
    "icespool.lifecycle.service",
    "icespool.write.writer",
    "icespool.write.ingest",
    "icespool.iceberg",
    "icespool.kafka._source",
    "icespool.http._api",
)
# pyiceberg's type classes (the config's column-type grammar builds them) and what
# pyiceberg.types imports; any other pyiceberg module is the catalog/table side.
PYICEBERG_TYPES = ("pyiceberg.types", "pyiceberg.typedef", "pyiceberg.exceptions")
KAFKA_CLIENT = (
    "aiokafka",
    "icespool.kafka._source",
    "icespool.kafka._upstream",
)


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def heavy_modules(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if _within(m, HEAVY)
        or (
            _within(m, ("pyiceberg",))
            and m != "pyiceberg"
            and not _within(m, (*PYICEBERG_TYPES, "pyiceberg.utils"))
        )
    ]


def _env() -> dict[str, str]:
    """This environment without icespool's variables (config path, overrides, runtime)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}


def run_cli(cwd: Path, *argv: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", CLI_RUNNER, *argv],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        (["--help"], "usage: icespool [-h] [--version] COMMAND ..."),
        (
            ["check-config"],
            "# icespool effective config from the embedded default (no config file)",
        ),
        (["check-config", "--format", "json"], "{"),
        (["spark-conf"], "--conf spark.jars"),
    ],
)
def test_light_commands_import_nothing_heavy(
    tmp_path: Path, argv: list[str], first_line: str
) -> None:
    report = run_cli(tmp_path, *argv)
    assert report["code"] == 0, report["stderr"]
    assert report["stdout"].splitlines()[0].startswith(first_line)
    assert heavy_modules(report["modules"]) == []


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [(["--help"], "usage: icespool"), (["--version"], "icespool "), (["status", "-h"], "usage:")],
)
def test_help_and_version_load_no_config(tmp_path: Path, argv: list[str], first_line: str) -> None:
    report = run_cli(tmp_path, *argv)
    assert (report["code"], report["stderr"]) == (0, "")
    assert report["stdout"].startswith(first_line)
    assert [m for m in report["modules"] if _within(m, ("pydantic", "icespool.config"))] == []


async def test_status_and_tables_import_nothing_heavy(
    run_daemon: RunDaemon, tmp_path: Path
) -> None:
    async with run_daemon() as (_, base):
        reports = {}
        for command in ("status", "tables"):
            for extra in ([], ["--json"]):
                argv = [command, "--url", base, *extra]
                reports[" ".join(argv[:1] + extra)] = await asyncio.to_thread(
                    run_cli, tmp_path, *argv
                )
    for name, report in reports.items():
        assert (report["code"], report["stderr"]) == (0, ""), name
        assert "demo.events" in report["stdout"], name
        assert heavy_modules(report["modules"]) == [], name
    assert reports["status"]["stdout"].startswith(f"icespool at {base}")
    assert json.loads(reports["tables --json"]["stdout"])["demo.events"]["degraded"] is None


def test_check_config_connect_loads_the_catalog_side(tmp_path: Path) -> None:
    report = run_cli(tmp_path, "check-config", "--connect")
    assert report["code"] == 0, report["stderr"]
    heavy = heavy_modules(report["modules"])
    assert "pyiceberg.catalog.sql" in heavy and "pyarrow" in heavy
    assert [m for m in report["modules"] if _within(m, KAFKA_CLIENT)] == []


def _service_modules(tmp_path: Path, kafka: list[dict[str, Any]]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", SERVICE_RUNNER, str(tmp_path / "icespool-data"), json.dumps(kafka)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["accepted"], report["records"]) == ({"accepted": 1}, 1)
    modules: list[str] = report["modules"]
    return modules


def test_http_only_daemon_never_imports_the_kafka_client(tmp_path: Path) -> None:
    modules = _service_modules(tmp_path, [])
    assert "icespool.http._api" in modules and "pyiceberg.catalog.sql" in modules
    assert [m for m in modules if _within(m, KAFKA_CLIENT)] == []
    # Nor the Avro reader: only a source of format "avro" needs it.
    assert [m for m in modules if _within(m, ("fastavro", "icespool.decode._avro"))] == []
    assert [m for m in modules if _within(m, SCHEMA_FORMATS)] == []


def test_a_kafka_source_imports_the_kafka_client(tmp_path: Path) -> None:
    # No broker answers on port 1: the source keeps trying in the background while the
    # HTTP path works, and stops with the service.
    kafka = [
        {
            "bootstrap_servers": "127.0.0.1:1",
            "group_id": "lazy-imports",
            "topics": ["events"],
            "table": "demo.events",
        }
    ]
    modules = _service_modules(tmp_path, kafka)
    for name in (
        "aiokafka",
        "icespool.kafka._source",
        "icespool.kafka._upstream",
    ):
        assert name in modules, name
    # A JSON source imports no Protobuf runtime, compiler or JSON Schema decoder.
    assert [m for m in modules if _within(m, SCHEMA_FORMATS)] == []


# What only sources of format "protobuf" or "json-schema" import.
SCHEMA_FORMATS = (
    "google.protobuf",
    "grpc_tools",
    "icespool.decode._protobuf",
    "icespool.decode._proto_schema",
    "icespool.decode._proto_convert",
    "icespool.decode._json_schema",
    "icespool.decode._json_schema_values",
)


@pytest.mark.parametrize(
    "package",
    [
        "icespool",
        "icespool.cdc",
        "icespool.decode",
        "icespool.http",
        "icespool.kafka",
        "icespool.schema",
        "icespool.write",
    ],
)
def test_lazy_packages_export_every_name(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None, name
        assert getattr(module, name) is value  # kept on the package after the first use
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nope'"):
        _ = module.nope
