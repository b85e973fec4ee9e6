"""Apache Iceberg's Kafka Connect sink, run by support/connect_worker.py's worker.

``ensure_plugin()`` copies the jars tests/support/iceberg_sink/pom.xml pins from Maven
Central into .test-tools/iceberg-sink/plugins/iceberg-sink/ (one ``plugin.path`` folder)
the first time, and again whenever that POM changes; it returns how long that took (None
when the folder was already there). Needs mvn, as ``make test-deps`` does.

``IcebergSink(root, bootstrap, ...)`` is one ``ConnectStandalone`` worker with one
``IcebergSinkConnector`` reading ``topics`` into ``table`` of a pyiceberg-compatible
catalog: ``catalog_name`` and ``catalog`` (Iceberg Java catalog options, without the
``iceberg.catalog.`` prefix; icespool.spark.conf.catalog_options maps a daemon
``[catalog]`` to them, so the sink's ``JdbcCatalog`` keeps its rows in the very
``iceberg_tables`` rows pyiceberg's SQL catalog reads). Values are schemaless JSON
(``JsonConverter``, ``schemas.enable=false``), the table exists beforehand (no
auto-create). The sink's own control topic (``control_topic``) must exist: the test
broker creates no topics by itself.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.apache_kafka import KafkaToolsMissing
from support.connect_worker import ConnectWorker, log_time

__all__ = ["ICEBERG_VERSION", "PLUGINS", "USER_JVM_OPTIONS", "IcebergSink", "ensure_plugin"]

REPO = Path(__file__).resolve().parents[2]
POM = Path(__file__).resolve().parent / "iceberg_sink" / "pom.xml"
TOOLS = REPO / ".test-tools" / "iceberg-sink"
PLUGINS = TOOLS / "plugins"
_PLUGIN = PLUGINS / "iceberg-sink"
_STAMP = TOOLS / ".pom-sha256"
ICEBERG_VERSION = "1.11.0"
BUILD_WITHIN = 900.0
#: What bin/connect-standalone.sh runs the worker with (its KAFKA_HEAP_OPTS and
#: kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS): the settings users run, not the test
#: worker's fast-start ones, so the sink's throughput is the JIT-compiled one.
USER_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
_CONVERTERS = {
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "false",
    "value.converter.schemas.enable": "false",
}


def ensure_plugin() -> float | None:
    """The sink's plugin folder, copied from Maven Central if missing or if the POM
    changed since; the seconds that took, or None when nothing was copied."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    jar = f"iceberg-kafka-connect-{ICEBERG_VERSION}.jar"
    if _STAMP.exists() and _STAMP.read_text().strip() == digest and any(_PLUGIN.glob(jar)):
        return None
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaToolsMissing(
            "mvn (Debian package maven) is missing: it assembles the Iceberg Kafka Connect "
            f"sink from {POM.relative_to(REPO)} (`make test-deps` installs it)"
        )
    began = time.monotonic()
    shutil.rmtree(TOOLS, ignore_errors=True)
    command = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={_PLUGIN}",
    ]
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BUILD_WITHIN,
        check=False,
    )
    if result.returncode != 0 or not any(_PLUGIN.glob(jar)):
        shutil.rmtree(TOOLS, ignore_errors=True)
        raise KafkaToolsMissing(
            f"mvn could not copy the Iceberg sink's jars ({POM.relative_to(REPO)}) from Maven "
            f"Central (exit {result.returncode}): is it reachable?\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    _STAMP.write_text(digest + "\n")
    return time.monotonic() - began


class IcebergSink:
    """One Connect worker running the Iceberg sink on ``topics`` into ``table``."""

    def __init__(
        self,
        root: Path,
        bootstrap: str,
        *,
        name: str,
        topics: Sequence[str],
        table: str,
        catalog_name: str,
        catalog: Mapping[str, str],
        control_topic: str,
        commit_interval_ms: int,
        tasks: int = 1,
        jvm_options: Sequence[str] = USER_JVM_OPTIONS,
    ) -> None:
        self.name = name
        self.group = f"connect-{name}"  # Connect's group for a sink connector's consumers
        connector = {
            "name": name,
            "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "tasks.max": str(tasks),
            "topics": ",".join(topics),
            "iceberg.tables": table,
            "iceberg.tables.auto-create-enabled": "false",
            "iceberg.catalog": catalog_name,
            **{f"iceberg.catalog.{key}": value for key, value in catalog.items()},
            "iceberg.control.topic": control_topic,
            "iceberg.control.commit.interval-ms": str(commit_interval_ms),
        }
        self.worker = ConnectWorker(
            root, bootstrap, PLUGINS, connector, _CONVERTERS, jvm_options=jvm_options
        )

    @property
    def pid(self) -> int:
        return self.worker.pid

    def start(self) -> None:
        self.worker.start()

    def assigned_at(self) -> float:
        """Epoch time the sink's consumer was last handed partitions of its topics (0: not
        yet), from the worker's log."""
        last = 0.0
        marker = f"groupId={self.group}] Adding newly assigned partitions: "
        for line in self.worker.log_lines():
            at = line.find(marker)
            if at < 0 or not line[at + len(marker) :].strip(" ()"):
                continue
            stamp = log_time(line)
            if stamp is not None:
                last = max(last, stamp)
        return last

    def kill(self) -> None:
        self.worker.kill()

    def log_tail(self, lines: int = 60) -> str:
        return self.worker.log_tail(lines)
