"""One Kafka Connect standalone worker (``ConnectStandalone``) running one connector.

The worker's classpath is Kafka Connect's runtime that tests/support/debezium/pom.xml pins
(connect-runtime of the test broker's release), copied by ``make test-deps`` into
.test-tools/debezium/runtime/; each connector brings its own ``plugin.path`` folder, so its
dependencies stay in its plugin class loader. Debezium's PostgreSQL source
(support/debezium.py) and Iceberg's sink (support/iceberg_sink.py) both run on this.

``ConnectWorker(root, bootstrap, plugins, connector, converters)`` writes the worker and
connector properties and a log4j2 file under ``root``; ``start(ready)`` runs the JVM in a
session of its own and returns once the connector's tasks are all RUNNING and ``ready()``
(the caller's own sign, if any) holds, or raises with the log tail: a FAILED connector or
task raises at once with its trace. ``kill()`` is kill -9 of the JVM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from support.apache_kafka import KafkaToolsMissing
from support.jvm import find_java, free_ports

__all__ = ["CONNECT_LOG_TIME", "RUNTIME", "ConnectWorker", "log_time", "properties"]

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / ".test-tools" / "debezium" / "runtime"
START_WITHIN = 120.0
#: As the test broker: C1 and the serial collector start fastest on two shared cores.
TEST_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms128m",
    "-Xmx768m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
#: The log line's time, as the layout below writes it (local time).
CONNECT_LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.reflections.name = org.reflections
logger.reflections.level = error
"""


def properties(values: Mapping[str, str]) -> str:
    # Properties files treat backslashes as escapes: paths here never hold any.
    return "".join(f"{key}={value}\n" for key, value in values.items())


def log_time(line: str) -> float | None:
    """The epoch time of a worker log line (``[2025-01-01 12:00:00,123] INFO ...``)."""
    if not line.startswith("[") or "]" not in line:
        return None
    try:
        return datetime.strptime(line[1 : line.index("]")], CONNECT_LOG_TIME).timestamp()
    except ValueError:
        return None


def _classpath() -> str:
    if not any(RUNTIME.glob("connect-runtime-*.jar")):
        raise KafkaToolsMissing(
            f"Kafka Connect's jars are missing from {RUNTIME}: run `make test-deps` (it "
            "copies those tests/support/debezium/pom.xml pins from Maven Central)"
        )
    return f"{RUNTIME}/*"


class ConnectWorker:
    """A ``ConnectStandalone`` JVM with one connector; REST on a free 127.0.0.1 port."""

    def __init__(
        self,
        root: Path,
        bootstrap: str,
        plugins: Path,
        connector: Mapping[str, str],
        converters: Mapping[str, str],
        jvm_options: Sequence[str] = TEST_JVM_OPTIONS,
    ) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.plugins = plugins
        self.connector = dict(connector)
        self.name = self.connector["name"]
        self.converters = dict(converters)
        self.jvm_options = tuple(jvm_options)
        self.process: subprocess.Popen[bytes] | None = None
        self.rest_port = 0
        self.log = root / "connect.log"
        self.console = root / "console.log"
        self.started_in = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, ready: Callable[[], bool] | None = None, within: float = START_WITHIN) -> None:
        java = find_java()
        classpath = _classpath()
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.rest_port,) = free_ports(1)
        worker = self.root / "worker.properties"
        worker.write_text(properties(self._worker_properties()))
        connector = self.root / "connector.properties"
        connector.write_text(properties(self.connector))
        (self.root / "log4j2.properties").write_text(_LOG4J2.format(log=self.log))
        command = [
            java,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            str(connector),
        ]
        with self.console.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_running(began + within, within, ready)
        except BaseException:
            self.kill()
            raise
        self.started_in = time.monotonic() - began

    def _worker_properties(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap,
            **self.converters,
            # Source offsets (a sink keeps its own in the consumer group).
            "offset.storage.file.filename": str(self.root / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
            "plugin.path": str(self.plugins),
            # Only the plugin.path folders are scanned, not the worker's classpath.
            "plugin.discovery": "only_scan",
            "listeners": f"http://127.0.0.1:{self.rest_port}",
        }

    def _wait_running(
        self, deadline: float, within: float, ready: Callable[[], bool] | None
    ) -> None:
        assert self.process is not None
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Kafka Connect exited with {self.process.returncode} while starting\n"
                    f"{self.log_tail()}"
                )
            try:
                status = self.status()
                tasks = status.get("tasks", [])
                failed = [t for t in tasks if t.get("state") == "FAILED"]
                if status.get("connector", {}).get("state") == "FAILED" or failed:
                    trace = (failed or [status["connector"]])[0].get("trace", "")
                    raise RuntimeError(
                        f"the connector {self.name} failed:\n{trace}\n{self.log_tail()}"
                    )
                running = bool(tasks) and all(t.get("state") == "RUNNING" for t in tasks)
                if running and (ready is None or ready()):
                    return
                last = json.dumps(status)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise RuntimeError(
            f"the connector {self.name} was not running within {within:.0f} s "
            f"(last: {last})\n{self.log_tail()}"
        )

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{self.name}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                found: dict[str, Any] = json.load(response)
                return found
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # not created yet
                return {}
            raise

    def log_lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 60) -> str:
        parts = []
        for path in (self.console, self.log):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(parts)

    def kill(self) -> None:
        """kill -9 of the JVM (its whole session), then reap it."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
