"""TLS material for test Kafka brokers and their clients: a CA, a server certificate
for 127.0.0.1/localhost, a client certificate with an encrypted key, an unrelated CA,
all made now (``tls_certs.LocalCA``); and the aiokafka options of a test client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.helpers import create_ssl_context

from support.tls_certs import LocalCA

__all__ = ["TlsFiles", "client_options", "make_tls_files"]


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


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate
    (encrypted key), and an unrelated CA, all generated now."""
    ca = LocalCA.create(directory, "icespool test CA")
    other = LocalCA.create(directory, "some other CA")
    password = "client-key-secret"
    files = TlsFiles(
        ca=ca.cert_path,
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        client_key_password=password,
        other_ca=other.cert_path,
    )
    ca.issue(files.server_cert, files.server_key, "localhost")
    ca.issue(files.client_cert, files.client_key, "icespool-daemon", client=True, password=password)
    return files


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
