"""Real object-store and catalog emulators on loopback: Azurite (Azure Blob) and moto (S3 and
Glue), each a child process bound to 127.0.0.1 on a port the kernel picks (port 0), so no
two test runs race for a pre-picked port. The port is read from the server's own log line.

A server that is missing or does not come up fails the test with its log tail: never a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "Azurite",
    "EmulatorError",
    "MotoServer",
    "azurite_main",
]

ROOT = Path(__file__).resolve().parents[2]
# Azurite's one built-in account and its documented, public development key.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_AZURITE_ENV = "ICESPOOL_AZURITE"
_AZURITE_MAIN = ".test-tools/azurite/node_modules/azurite/dist/src/blob/main.js"
_AZURITE_READY = re.compile(r"Blob service successfully listens on http://127\.0\.0\.1:(\d+)")
_MOTO_READY = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")
_START_TIMEOUT = 30.0


class EmulatorError(AssertionError):
    """An emulator is not installed or did not start (the message says which and why)."""


def azurite_main() -> Path:
    """Azurite's blob server script: $ICESPOOL_AZURITE or the Makefile's install."""
    path = Path(os.environ.get(_AZURITE_ENV) or ROOT / _AZURITE_MAIN)
    if not path.is_file():
        raise EmulatorError(
            f"Azurite is not installed ({path} is missing): run 'make test-deps' (npm ci of "
            f"tests/support/azurite/package-lock.json into .test-tools/azurite), or point "
            f"${_AZURITE_ENV} at azurite/dist/src/blob/main.js"
        )
    return path


@dataclass
class _Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # Azurite ignores SIGTERM for 10 s or more; both keep their data in memory only, so
    # there is nothing a gentler stop would save.
    stop_signal = signal.SIGKILL

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _start(name: str, command: list[str], log: Path, ready: re.Pattern[str]) -> _Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            raise EmulatorError(f"cannot start {name} ({command[0]}): {exc}") from exc
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = ready.search(text)
        if found:
            return _Server(proc, int(found.group(1)), log)
        if proc.poll() is not None:
            raise EmulatorError(f"{name} exited with {proc.returncode} before listening:\n{text}")
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=10)
    raise EmulatorError(
        f"{name} did not listen within {_START_TIMEOUT:g} s:\n{log.read_text(errors='replace')}"
    )


class Azurite(_Server):
    """Azurite's Blob service, in memory, on 127.0.0.1."""

    @classmethod
    def start(cls, log_dir: Path) -> Azurite:
        node = shutil.which("node")
        if node is None:
            raise EmulatorError(
                "Node.js is not installed (no 'node' on PATH): apt-get install nodejs"
            )
        command = [
            node,
            str(azurite_main()),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            "0",
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            # Path-style URLs (http://host:port/account/container) for any host name.
            "--disableProductStyleUrl",
        ]
        server = _start("Azurite", command, log_dir / "azurite.log", _AZURITE_READY)
        return cls(server.proc, server.port, server.log)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(self.connection_string).create_container(name)

    def blob_names(self, container: str) -> list[str]:
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient.from_connection_string(self.connection_string)
        return sorted(b.name for b in client.get_container_client(container).list_blobs())


class MotoServer(_Server):
    """moto in server mode (every AWS API it mocks, S3 and Glue among them) on 127.0.0.1."""

    region = "us-east-1"
    access_key = "icespool-test-key"
    secret_key = "icespool-test-secret"

    @classmethod
    def start(cls, log_dir: Path) -> MotoServer:
        script = Path(sys.executable).with_name("moto_server")
        if not script.exists():
            raise EmulatorError(
                f"moto_server is not installed next to {sys.executable}: "
                "pip install 'moto[server]' (part of icespool's test extra)"
            )
        command = [str(script), "-H", "127.0.0.1", "-p", "0"]
        server = _start("moto_server", command, log_dir / "moto.log", _MOTO_READY)
        return cls(server.proc, server.port, server.log)

    def client(self, service: str) -> object:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )
