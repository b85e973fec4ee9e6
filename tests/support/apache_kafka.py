"""A real Apache Kafka broker for tests: one KRaft JVM (broker and controller combined).

The jars are the ones tests/support/kafka/pom.xml pins, copied by ``make test-deps``
into .test-tools/kafka/libs/. ``KafkaBroker.start(root)`` formats a fresh KRaft storage
under ``root`` (a random cluster id, the SCRAM users created at format time, as
``kafka-storage format --add-scram`` does), then runs ``kafka.Kafka`` on free
127.0.0.1 ports with one listener per way a client connects:

- ``plaintext``: no security;
- ``sasl_plaintext``: SASL with SCRAM-SHA-256, SCRAM-SHA-512 (users in `SCRAM_USERS`)
  and PLAIN (users in `PLAIN_USERS`, from the listener's JAAS config);
- ``ssl``: TLS with a server certificate of the test CA (support/kafka_tls.py);
- ``mtls``: the same, and a client certificate signed by the test CA is required;
- ``sasl_ssl``: SASL as above, inside TLS;
- a ``CONTROLLER`` listener the clients never use.

It answers within seconds and is meant to run once per xdist worker, so tests share it:
each test uses its own topics and consumer groups. Whatever stops the start raises with
the broker's log tail; missing Java or jars raise naming ``make test-deps``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from support.kafka_tls import TlsFiles, make_tls_files

__all__ = [
    "LIBS",
    "PLAIN_USERS",
    "SCRAM_USERS",
    "KafkaBroker",
    "KafkaToolsMissing",
]

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / ".test-tools" / "kafka" / "libs"
START_WITHIN = 60.0
# SCRAM credentials are stored by the controller at format time; PLAIN users live in the
# SASL listeners' JAAS config. Distinct users per mechanism, so a test that logs in as
# one proves that mechanism's store answered, not another's.
SCRAM_USERS: Mapping[str, str] = {"alice": "alice-secret", "bob": "bob-secret"}
PLAIN_USERS: Mapping[str, str] = {"carol": "carol-secret"}
_SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    # A test broker lives for minutes: C1 only and the serial collector start fastest and
    # leave the machine's two cores to the tests.
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
# One line per request or segment roll would bury what a failed start says.
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.log.name = org.apache.kafka.storage.internals.log
logger.log.level = warn
logger.unified.name = kafka.log
logger.unified.level = warn
"""


class KafkaToolsMissing(RuntimeError):
    """Java or the broker's jars are not installed (``make test-deps`` installs them)."""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "java")] if home else []
    candidates.append(shutil.which("java") or "")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise KafkaToolsMissing(
        "no java for the test Kafka broker (JAVA_HOME unset and none on PATH): "
        "run `make test-deps` (it installs openjdk-17-jre-headless)"
    )


def _classpath() -> str:
    jars = sorted(LIBS.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise KafkaToolsMissing(
            f"the Apache Kafka broker jars are missing from {LIBS}: run `make test-deps` "
            "(it copies those tests/support/kafka/pom.xml pins from Maven Central)"
        )
    return f"{LIBS}/*"


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _cluster_id() -> str:
    """A random Kafka UUID (22 URL-safe base64 characters). Like Kafka's own
    ``Uuid.randomUuid``, never one that starts with "-": StorageTool's argument parser
    would read it as an option."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


def _jaas(login_module: str, options: Mapping[str, str]) -> str:
    pairs = " ".join(f'{k}="{v}"' for k, v in options.items())
    return f"{login_module} required {pairs};".replace("  ", " ")


@dataclass(frozen=True, slots=True)
class Listeners:
    """The client listeners' ports (the controller's is not for clients)."""

    plaintext: int
    sasl_plaintext: int
    ssl: int
    mtls: int
    sasl_ssl: int
    controller: int


class KafkaBroker:
    """``KafkaBroker.start(root)`` -> a running single-node Apache Kafka; ``stop()`` kills
    it and removes ``root``."""

    def __init__(self, root: Path, listeners: Listeners, tls: TlsFiles, cluster_id: str) -> None:
        self.root = root
        self.listeners = listeners
        self.tls = tls
        self.cluster_id = cluster_id
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"
        self.console = root / "console.log"
        self.started_in = 0.0

    # ------------------------------------------------------------------ addresses

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener: what every test broker offers."""
        return f"127.0.0.1:{self.listeners.plaintext}"

    @property
    def sasl_plaintext(self) -> str:
        return f"127.0.0.1:{self.listeners.sasl_plaintext}"

    @property
    def ssl(self) -> str:
        return f"127.0.0.1:{self.listeners.ssl}"

    @property
    def mtls(self) -> str:
        return f"127.0.0.1:{self.listeners.mtls}"

    @property
    def sasl_ssl(self) -> str:
        return f"127.0.0.1:{self.listeners.sasl_ssl}"

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, root: Path) -> KafkaBroker:
        java = _java()
        classpath = _classpath()
        root.mkdir(parents=True, exist_ok=True)
        listeners = Listeners(*_free_ports(6))
        broker = cls(root, listeners, make_tls_files(root / "tls"), _cluster_id())
        began = time.monotonic()
        try:
            broker._format(java, classpath)
            broker._run(java, classpath)
            broker._wait_ready(began + START_WITHIN)
        except BaseException:
            broker.stop()
            raise
        broker.started_in = time.monotonic() - began
        return broker

    def _properties(self) -> str:
        p = self.listeners
        names = {
            "PLAINTEXT": ("PLAINTEXT", p.plaintext),
            "SASL_PLAINTEXT": ("SASL_PLAINTEXT", p.sasl_plaintext),
            "SSL": ("SSL", p.ssl),
            "MTLS": ("SSL", p.mtls),
            "SASL_SSL": ("SASL_SSL", p.sasl_ssl),
        }
        listeners = [f"{name}://127.0.0.1:{port}" for name, (_, port) in names.items()]
        protocols = [f"{name}:{protocol}" for name, (protocol, _) in names.items()]
        tls = self.tls
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{p.controller}",
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{p.controller}"]),
            "advertised.listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join([*protocols, "CONTROLLER:PLAINTEXT"]),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "metadata.log.dir": str(self.root / "metadata"),
            # One node: every internal topic on it, one partition each (fewer files, faster
            # group and transaction coordinator loads).
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # The tests' consumers use session timeouts of a few seconds.
            "group.min.session.timeout.ms": "1000",
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "log.segment.bytes": str(1 << 20),
            "log.index.size.max.bytes": str(1 << 20),
            "log.cleaner.dedupe.buffer.size": str(4 << 20),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
            "delete.topic.enable": "true",
            # SASL: SCRAM from the metadata log, PLAIN from the JAAS config below.
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            # TLS: PEM files of the test CA (Kafka reads PKCS#8 keys, EC or RSA).
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self._keystore()),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca),
            "ssl.client.auth": "none",
            "listener.name.mtls.ssl.client.auth": "required",
        }
        scram = _jaas("org.apache.kafka.common.security.scram.ScramLoginModule", {})
        plain = _jaas(
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            {f"user_{user}": password for user, password in PLAIN_USERS.items()},
        )
        for listener in ("sasl_plaintext", "sasl_ssl"):
            for mechanism in _SCRAM_MECHANISMS:
                lines[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = scram
            lines[f"listener.name.{listener}.plain.sasl.jaas.config"] = plain
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def _keystore(self) -> Path:
        """The server's key and certificate in one PEM file, as ssl.keystore.location of
        type PEM reads them."""
        path = self.root / "tls" / "server-keystore.pem"
        if not path.exists():
            path.write_bytes(self.tls.server_key.read_bytes() + self.tls.server_cert.read_bytes())
            path.chmod(0o600)
        return path

    def _java_command(self, java: str, classpath: str, *args: str) -> list[str]:
        log4j = self.root / "log4j2.properties"
        return [
            java,
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            classpath,
            *args,
        ]

    def _format(self, java: str, classpath: str) -> None:
        (self.root / "log4j2.properties").write_text(_LOG4J2.format(log=self.log))
        config = self.root / "server.properties"
        config.write_text(self._properties())
        scram = [
            arg
            for mechanism in _SCRAM_MECHANISMS
            for user, password in SCRAM_USERS.items()
            for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")
        ]
        command = self._java_command(
            java,
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(config),
            "--cluster-id",
            self.cluster_id,
            *scram,
        )
        result = subprocess.run(
            command,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_WITHIN,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"kafka-storage format exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}{self.log_tail()}"
            )

    def _run(self, java: str, classpath: str) -> None:
        command = self._java_command(
            java, classpath, "kafka.Kafka", str(self.root / "server.properties")
        )
        with self.console.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self, deadline: float) -> None:
        """Until a client lists the topics on the PLAINTEXT listener: the broker then has
        caught up with its metadata and serves requests."""
        assert self.process is not None
        last = "no answer yet"
        with ThreadPoolExecutor(1) as pool:  # the caller may run inside an event loop
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the Kafka broker exited with {self.process.returncode} while "
                        f"starting\n{self.log_tail()}"
                    )
                try:
                    # A bare connect first: aiokafka logs every refused connection.
                    with socket.create_connection(("127.0.0.1", self.listeners.plaintext), 1):
                        pass
                    pool.submit(asyncio.run, _list_topics(self.bootstrap)).result(10)
                    return
                except Exception as exc:  # any refusal means "not yet"
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.1)
        raise RuntimeError(
            f"the Kafka broker did not answer on {self.bootstrap} within "
            f"{START_WITHIN:.0f} s (last: {last})\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 60) -> str:
        parts = []
        for path in (self.console, self.log):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


async def _list_topics(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.list_topics()
    finally:
        await admin.close()
