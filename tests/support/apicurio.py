"""Apicurio Registry, the real schema registry the Avro tests run.

    registry = ApicurioRegistry.start(tmp_dir)      # one JVM on a free loopback port
    schema_id = registry.register("orders-value", avro_schema)
    registry.url                                    # the daemon's schema_registry_url
    registry.stop()

Apicurio Registry 3.3 serves the Confluent schema registry API at ``/apis/ccompat/v7``
(``POST /subjects/{subject}/versions``, ``GET /schemas/ids/{id}``), the API icespool's
registry client speaks. Its storage is an in-memory H2 database of its own, so a started
registry knows no schema; ids are global to it (the same schema text under two subjects
is one id, as in Confluent's registry). HTTP basic auth is on: `USERNAME`/`PASSWORD` from
Quarkus' embedded user store, so a client sending no or wrong credentials gets 401.

The distribution is the release's own (tests/support/apicurio/pom.xml pins it), which
`make test-deps` unpacks into .test-tools/apicurio/. It needs Java >= 21, which
`find_java` looks for (JAVA_HOME, PATH, then /usr/lib/jvm/*); ``PYTHONPATH=tests python3
-m support.apicurio --java`` prints the one it finds (the Makefile's check).

Each request the registry answers is a line of its access log, so `lookups` counts the
schema fetches a test made. A registry that cannot start fails the test run with its
log; nothing is skipped.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.jvm import JvmProcess, ToolsMissing, find_java, free_ports

__all__ = [
    "DIST",
    "PASSWORD",
    "USERNAME",
    "ApicurioMissing",
    "ApicurioRegistry",
    "find_java",
]

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / ".test-tools" / "apicurio"
USERNAME = "icespool"
PASSWORD = "s3cret"
CCOMPAT = "/apis/ccompat/v7"
MIN_JAVA = 21
_START_TIMEOUT = 120.0
_LOOKUP = re.compile(rf'method="GET" path="{CCOMPAT}/schemas/ids/(\d+)"')


# Java >= 21 or the registry's distribution is not installed (``make test-deps``).
ApicurioMissing = ToolsMissing


def _auth_header() -> str:
    return "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()


@dataclass
class ApicurioRegistry:
    jvm: JvmProcess
    port: int
    started_in: float = 0.0

    @property
    def url(self) -> str:
        """The Confluent-compatible API's root: a client's ``schema_registry_url``."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    @classmethod
    def start(cls, root: Path) -> ApicurioRegistry:
        java = find_java(MIN_JAVA)
        run_jar = DIST / "quarkus-run.jar"
        if not run_jar.is_file():
            raise ApicurioMissing(
                f"the schema registry's distribution is missing ({run_jar}): run "
                "`make test-deps` (it unpacks the one tests/support/apicurio/pom.xml pins "
                "from Maven Central)"
            )
        root.mkdir(parents=True, exist_ok=True)
        port, management_port = free_ports(2)
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": port,
            # Health and metrics are served apart (a build-time choice): loopback, and a
            # port of their own, or a second registry on the machine would collide.
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": management_port,
            # Basic auth against Quarkus' embedded user store.
            "quarkus.http.auth.basic": "true",
            "apicurio.authn.mechanism.priority": "basic",
            "quarkus.security.users.embedded.plain-text": "true",
            f"quarkus.security.users.embedded.users.{USERNAME}": PASSWORD,
            f"quarkus.security.users.embedded.roles.{USERNAME}": "sr-admin",
            # An in-memory H2 needs no pool of 20 connections.
            "apicurio.datasource.jdbc.initial-size": 2,
            "apicurio.datasource.jdbc.min-size": 2,
            "apicurio.storage.snapshot.location": root,
            "apicurio.import.work-dir": root,
            "java.io.tmpdir": root,
        }
        jvm = JvmProcess(
            java, root, (root / "apicurio.log",), heap=("64m", "512m"), properties=settings
        )
        registry = cls(jvm, port)
        began = time.monotonic()
        jvm.start("-jar", str(run_jar))
        jvm.wait_ready(
            lambda: registry.call("GET", "/subjects"),
            within=_START_TIMEOUT,
            name="the schema registry",
            waiting_for=f"answer GET {CCOMPAT}/subjects",
            retry_on=(OSError, urllib.error.URLError, ValueError),
        )
        registry.started_in = time.monotonic() - began
        return registry

    @property
    def log_path(self) -> Path:
        return self.jvm.logs[0]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request to the Confluent-compatible API (authenticated); an error answer
        raises naming the registry's message."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": _auth_header(),
                "Content-Type": "application/vnd.schemaregistry.v1+json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                data = answer.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(
                f"the schema registry answered {method} {path} with {exc.code}: "
                f"{exc.read(2048).decode(errors='replace')}"
            ) from None
        return json.loads(data) if data else None

    def register(self, subject: str, schema: Any, schema_type: str = "AVRO") -> int:
        """Register ``schema`` (JSON text, or an Avro schema as Python data) as the next
        version of ``subject``, as a producer's serializer does; its global id."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body: dict[str, Any] = {"schema": text}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        schema_id: int = self.call("POST", path, body)["id"]
        return schema_id

    def set_compatibility(self, subject: str, level: str) -> None:
        """The compatibility rule new versions of ``subject`` are checked against."""
        subject = urllib.parse.quote(subject, safe="")
        self.call("PUT", f"/config/{subject}", {"compatibility": level})

    def log_mark(self) -> int:
        """Where the log ends now: `lookups` counts from here."""
        return self.log_path.stat().st_size

    def lookups(self, since: int, settle: float = 0.3) -> Counter[int]:
        """``GET /schemas/ids/{id}`` requests answered since ``since`` (a `log_mark`), by
        id. The access log line is written as the answer ends, so the count is read until
        it holds still for ``settle`` seconds (at most 5 s)."""
        deadline = time.monotonic() + 5.0
        counted = self._lookups(since)
        while time.monotonic() < deadline:
            time.sleep(settle)
            again = self._lookups(since)
            if again == counted:
                break
            counted = again
        return counted

    def _lookups(self, since: int) -> Counter[int]:
        with self.log_path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        return Counter(int(m.group(1)) for m in _LOOKUP.finditer(text))

    def log_tail(self, lines: int = 40) -> str:
        return self.jvm.log_tail(lines)

    def stop(self) -> None:
        """SIGKILL: its state is in memory and a temporary directory nothing else uses."""
        self.jvm.stop()


if __name__ == "__main__":
    # `PYTHONPATH=tests python3 -m support.apicurio --java`: the Makefile's check that a
    # Java the registry runs on is there (stdlib only, so it needs no virtualenv).
    if sys.argv[1:] != ["--java"]:
        sys.exit("usage: python3 -m support.apicurio --java")
    try:
        print(find_java(MIN_JAVA))
    except ApicurioMissing as exc:
        sys.exit(f"error: {exc}")
