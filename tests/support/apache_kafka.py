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
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from support.jvm import JvmProcess, ToolsMissing, find_java, free_ports, log4j2_file
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
# One line per request or segment roll would bury what a failed start says.
_QUIET = {
    "kafka.request.logger": "warn",
    "state.change.logger": "warn",
    "org.apache.kafka.storage.internals.log": "warn",
    "kafka.log": "warn",
}


# Java or the broker's jars are not installed (``make test-deps`` installs them).
KafkaToolsMissing = ToolsMissing


def _check_jars() -> None:
    jars = sorted(LIBS.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise KafkaToolsMissing(
            f"the Apache Kafka broker jars are missing from {LIBS}: run `make test-deps` "
            "(it copies those tests/support/kafka/pom.xml pins from Maven Central)"
        )


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

    def __init__(
        self, root: Path, listeners: Listeners, tls: TlsFiles, cluster_id: str, java: str
    ) -> None:
        self.root = root
        self.listeners = listeners
        self.tls = tls
        self.cluster_id = cluster_id
        self.log = root / "server.log"
        self.console = root / "console.log"
        self.jvm = JvmProcess(
            java,
            root,
            (self.console, self.log),
            heap=("128m", "512m"),
            classpath=f"{LIBS}/*",
            properties={"log4j2.configurationFile": root / "log4j2.properties"},
        )
        self.started_in = 0.0

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.jvm.process

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
        java = find_java()
        _check_jars()
        root.mkdir(parents=True, exist_ok=True)
        listeners = Listeners(*free_ports(6))
        broker = cls(root, listeners, make_tls_files(root / "tls"), _cluster_id(), java)
        began = time.monotonic()
        try:
            broker._format()
            broker.jvm.start("kafka.Kafka", str(root / "server.properties"))
            broker._wait_ready(began)
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

    def _format(self) -> None:
        (self.root / "log4j2.properties").write_text(log4j2_file(self.log, _QUIET))
        config = self.root / "server.properties"
        config.write_text(self._properties())
        scram = [
            arg
            for mechanism in _SCRAM_MECHANISMS
            for user, password in SCRAM_USERS.items()
            for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")
        ]
        self.jvm.run(
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(config),
            "--cluster-id",
            self.cluster_id,
            *scram,
            timeout=START_WITHIN,
            what="kafka-storage format",
        )

    def _wait_ready(self, began: float) -> None:
        """Until a client lists the topics on the PLAINTEXT listener: the broker then has
        caught up with its metadata and serves requests."""
        with ThreadPoolExecutor(1) as pool:  # the caller may run inside an event loop

            def list_topics() -> None:
                # A bare connect first: aiokafka logs every refused connection.
                with socket.create_connection(("127.0.0.1", self.listeners.plaintext), 1):
                    pass
                pool.submit(asyncio.run, _list_topics(self.bootstrap)).result(10)

            self.jvm.wait_ready(
                list_topics,
                within=START_WITHIN,
                since=began,
                name="the Kafka broker",
                waiting_for=f"answer on {self.bootstrap}",
                retry_on=(Exception,),  # any refusal means "not yet"
                interval=0.1,
            )

    def kill(self) -> None:
        """SIGKILL the broker, keeping its data and ports for `restart`."""
        self.jvm.stop()

    def restart(self) -> None:
        """Start the killed broker again on its data and ports; returns once it serves."""
        began = time.monotonic()
        self.jvm.start("kafka.Kafka", str(self.root / "server.properties"))
        self._wait_ready(began)

    def log_tail(self, lines: int = 60) -> str:
        return self.jvm.log_tail(lines)

    def stop(self) -> None:
        self.jvm.stop()
        shutil.rmtree(self.root, ignore_errors=True)


async def _list_topics(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.list_topics()
    finally:
        await admin.close()
