"""Apache Iceberg's reference REST catalog server, the second REST catalog the tests run.

    server = IcebergRest.start(tmp_dir, object_store)   # one JVM on a free loopback port
    props = server.catalog_properties(server.warehouse())  # an empty catalog per test
    server.stop()

``org.apache.iceberg.rest.RESTCatalogServer`` (iceberg-open-api's test fixtures, the
server behind the apache/iceberg-rest-fixture image) serves the Iceberg REST API in front
of a JDBC catalog: here a SQLite file of its own, with its tables' metadata written by
``S3FileIO`` into a bucket of their own on the session's SeaweedFS (`object_store`), the S3
API the daemon writes its data files through. Its jars are the ones
tests/support/iceberg_rest/pom.xml pins, which `make test-deps` copies into
.test-tools/iceberg-rest/libs/.

It serves one catalog (the client's ``warehouse`` is not used to pick one), so a test's
fresh warehouse is the catalog emptied: ``warehouse()`` drops (and purges) every table and
namespace the previous test left. Tests of one session run one after another.

A server that cannot start fails the test run with its log; nothing is skipped.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs

from support.jvm import JvmProcess, ToolsMissing, find_java, free_ports
from support.object_store import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

__all__ = ["LIBS", "IcebergRest", "IcebergRestMissing"]

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / ".test-tools" / "iceberg-rest" / "libs"
BUCKET = "iceberg-rest"
CLIENT_ID = "icespool-test-client"
CLIENT_SECRET = "icespool-test-client-secret"
_START_TIMEOUT = 90.0
_MAIN = "org.apache.iceberg.rest.RESTCatalogServer"


# Java or the server's jars are not installed (``make test-deps`` installs them).
IcebergRestMissing = ToolsMissing


def _check_jars() -> None:
    if not any(LIBS.glob("iceberg-open-api-*-test-fixtures.jar")):
        raise IcebergRestMissing(
            f"the Iceberg REST catalog server's jars are missing from {LIBS}: run "
            "`make test-deps` (it copies those tests/support/iceberg_rest/pom.xml pins "
            "from Maven Central)"
        )


def _create_bucket(store: SeaweedFS, bucket: str) -> None:
    fs = pyarrow.fs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region=REGION,
        endpoint_override=store.s3_endpoint,
        scheme="http",
        force_virtual_addressing=False,
        allow_bucket_creation=True,
        connect_timeout=5,
        request_timeout=30,
    )
    fs.create_dir(bucket)


@dataclass
class IcebergRest:
    jvm: JvmProcess
    rest_port: int
    store: SeaweedFS
    started_in: float = 0.0

    @property
    def rest_uri(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def s3_port(self) -> int:
        """The S3 API the tables' files are on (the session's SeaweedFS)."""
        return self.store.s3_port

    @property
    def s3_endpoint(self) -> str:
        return self.store.s3_endpoint

    @property
    def location(self) -> str:
        """The server's warehouse: where it puts the tables it creates."""
        return f"s3://{BUCKET}/warehouse"

    @classmethod
    def start(cls, root: Path, store: SeaweedFS) -> IcebergRest:
        java = find_java()
        _check_jars()
        root.mkdir(parents=True, exist_ok=True)
        _create_bucket(store, BUCKET)
        (port,) = free_ports(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CATALOG_"))}
        # RESTCatalogServer reads its catalog's properties from CATALOG_* variables
        # (CATALOG_ dropped, "__" -> "-", "_" -> ".", lower case).
        env |= {
            "CATALOG_URI": f"jdbc:sqlite:{root / 'catalog.db'}",
            "CATALOG_WAREHOUSE": f"s3://{BUCKET}/warehouse",
            "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
            "CATALOG_S3_ENDPOINT": store.s3_endpoint,
            "CATALOG_S3_PATH__STYLE__ACCESS": "true",
            "CATALOG_S3_ACCESS__KEY__ID": ACCESS_KEY,
            "CATALOG_S3_SECRET__ACCESS__KEY": SECRET_KEY,
            "CATALOG_CLIENT_REGION": REGION,
            "CATALOG_REST_PORT": str(port),
            "AWS_REGION": REGION,
        }
        jvm = JvmProcess(
            java,
            root,
            (root / "iceberg-rest.log",),
            heap=("64m", "384m"),
            classpath=f"{LIBS}/*",
            properties={"org.slf4j.simpleLogger.showDateTime": "true"},
            env=env,
        )
        server = cls(jvm, port, store)
        began = time.monotonic()
        jvm.start(_MAIN)
        jvm.wait_ready(
            lambda: server._call("GET", "/v1/config"),
            within=_START_TIMEOUT,
            name="the Iceberg REST catalog server",
            waiting_for="answer GET /v1/config",
            retry_on=(OSError, urllib.error.URLError, ValueError),
        )
        server.started_in = time.monotonic() - began
        return server

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(f"{self.rest_uri}{path}", method=method)
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def _empty(self) -> None:
        """Drop every table (purging its files) and namespace of the catalog."""
        namespaces = [tuple(ns) for ns in self._call("GET", "/v1/namespaces")["namespaces"]]
        for ns in namespaces:
            encoded = urllib.parse.quote("\x1f".join(ns), safe="")
            for ident in self._call("GET", f"/v1/namespaces/{encoded}/tables")["identifiers"]:
                name = urllib.parse.quote(ident["name"], safe="")
                self._call("DELETE", f"/v1/namespaces/{encoded}/tables/{name}?purgeRequested=true")
            self._call("DELETE", f"/v1/namespaces/{encoded}")

    def warehouse(self) -> str:
        """The catalog, emptied of what earlier tests left, as its warehouse location."""
        self._empty()
        return self.location

    def catalog_properties(
        self,
        warehouse: str,
        *,
        s3_endpoint: str | None = None,
        rest_uri: str | None = None,
    ) -> dict[str, str]:
        """``[catalog]`` of this REST catalog as a user writes it (OAuth2 client
        credentials against the server's token endpoint, S3 endpoint/region/keys,
        path-style); ``s3_endpoint``/``rest_uri`` put a proxy in between."""
        uri = rest_uri or self.rest_uri
        return {
            "type": "rest",
            "uri": uri,
            "warehouse": warehouse,
            "credential": f"{CLIENT_ID}:{CLIENT_SECRET}",
            "oauth2-server-uri": f"{uri}/v1/oauth/tokens",
            "s3.endpoint": s3_endpoint or self.s3_endpoint,
            "s3.region": REGION,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.force-virtual-addressing": "false",
        }

    def log_tail(self, lines: int = 40) -> str:
        return self.jvm.log_tail(lines)

    def stop(self) -> None:
        """SIGKILL: its state is a temporary directory and a bucket nothing else uses."""
        self.jvm.stop()
