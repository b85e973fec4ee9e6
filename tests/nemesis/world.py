"""The nemesis's world: the servers one run uses, its tables, and the links (proxies) a
fault can cut, slow or make lose answers.

Four tables every replica writes, one of each kind and source:

    t.events  append, HTTP ``/records`` (new ids per request)
    t.stream  append, a Kafka topic of JSON records (new ids per record)
    t.users   upsert (key ``id``), HTTP ``/changes``: each key written through one replica
    t.keyed   upsert (key ``id``), Kafka keyed records (a null value deletes the key)

The catalog is PostgreSQL (the SQL catalog) or Apache Iceberg's REST server, the files
on SeaweedFS's S3 API; each replica reaches both through proxies of its own, so a fault
can cut one replica off while the others commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs
from pyiceberg.catalog import Catalog, load_catalog
from support.apache_kafka import KafkaBroker
from support.daemon_harness import CATALOG_NAME
from support.http_proxy import HttpProxy, Seen
from support.iceberg_rest import IcebergRest
from support.object_store import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS
from support.postgres import create_database, drop_database
from support.proxy import TcpProxy

__all__ = [
    "APPEND_TABLES",
    "EVENTS",
    "KEYED",
    "STREAM",
    "TABLES",
    "UPSERT_TABLES",
    "USERS",
    "Link",
    "Servers",
    "Variant",
    "Warehouse",
    "group_of",
    "table_config",
]

Variant = Literal["sql", "rest"]
EVENTS, STREAM, USERS, KEYED = "t.events", "t.stream", "t.users", "t.keyed"
TABLES = (EVENTS, STREAM, USERS, KEYED)
APPEND_TABLES = (EVENTS, STREAM)
UPSERT_TABLES = (USERS, KEYED)
KAFKA_PARTITIONS = 4
_COLUMNS = '{ name = "id", type = "long", required = true }, { name = "v", type = "string" }'
_CHANGE_COLUMNS = f'{_COLUMNS}, {{ name = "seq", type = "long" }}'


@dataclass
class Servers:
    """What runs beside the replicas: a Kafka broker of the run's own (a fault stops it),
    SeaweedFS, and for the REST variant Apache Iceberg's REST server."""

    broker: KafkaBroker
    store: SeaweedFS
    rest: IcebergRest | None = None


def group_of(topic: str) -> str:
    """The consumer group of the Kafka source reading ``topic``."""
    return f"nemesis-{topic}"


def table_config(stream_topic: str, keyed_topic: str, bootstrap: str) -> tuple[str, str]:
    """The keys of the first ``[[tables]]`` entry (t.events) and the rest of the tables
    and Kafka sources, as `support.daemon_harness.DaemonDir.write_config` takes them."""
    first = f"create = true\nschema = [{_COLUMNS}]"
    rest = f"""
[[tables]]
name = "{STREAM}"
create = true
schema = [{_COLUMNS}]

[[tables]]
name = "{USERS}"
create = true
key = ["id"]
partition_by = ["bucket(4, id)"]
schema = [{_CHANGE_COLUMNS}]

[[tables]]
name = "{KEYED}"
create = true
key = ["id"]
schema = [{_CHANGE_COLUMNS}]

[[kafka]]
bootstrap_servers = "{bootstrap}"
group_id = "{group_of(stream_topic)}"
topics = ["{stream_topic}"]
table = "{STREAM}"
session_timeout = "4s"
offset_commit_interval = "2s"

[[kafka]]
bootstrap_servers = "{bootstrap}"
group_id = "{group_of(keyed_topic)}"
topics = ["{keyed_topic}"]
table = "{KEYED}"
changes = "keyed"
key_format = "string"
session_timeout = "4s"
offset_commit_interval = "2s"
"""
    return first, rest


@dataclass
class Warehouse:
    """Where one run's tables live: a PostgreSQL database of its own (``sql``) or the
    emptied REST catalog (``rest``), and an S3 location on SeaweedFS."""

    servers: Servers
    variant: Variant
    database: str | None = None
    location: str = ""

    @classmethod
    def create(cls, servers: Servers, variant: Variant) -> Warehouse:
        if variant == "rest":
            if servers.rest is None:
                raise AssertionError("the rest variant needs Apache Iceberg's REST server")
            return cls(servers, variant, None, servers.rest.warehouse())
        bucket = f"nemesis-{uuid.uuid4().hex[:10]}"
        fs = pyarrow.fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=servers.store.s3_endpoint,
            scheme="http",
            force_virtual_addressing=False,
            allow_bucket_creation=True,
        )
        fs.create_dir(bucket)
        return cls(servers, variant, create_database("nemesis"), f"s3://{bucket}/warehouse")

    def catalog_properties(self, catalog_port: int | None, s3_port: int | None) -> dict[str, str]:
        """The ``[catalog]`` of a replica whose links listen on these ports (None: the
        servers themselves, for the checker and the outside writer)."""
        store = self.servers.store
        s3 = f"http://127.0.0.1:{s3_port}" if s3_port else store.s3_endpoint
        if self.variant == "rest":
            rest = self.servers.rest
            assert rest is not None
            uri = f"http://127.0.0.1:{catalog_port}" if catalog_port else rest.rest_uri
            return rest.catalog_properties(self.location, s3_endpoint=s3, rest_uri=uri)
        port = catalog_port or 5432
        # No TLS, so that a proxy can tell a COMMIT and lose its answer.
        uri = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{self.database}?sslmode=disable"
        return {
            "type": "sql",
            "uri": uri,
            "warehouse": self.location,
            "s3.endpoint": s3,
            "s3.region": REGION,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.force-virtual-addressing": "false",
        }

    def catalog(self) -> Catalog:
        """A catalog straight on the servers (no proxy): the run's own reads and writes."""
        return load_catalog(CATALOG_NAME, **self.catalog_properties(None, None))

    def catalog_upstream(self) -> tuple[str, int]:
        if self.variant == "rest":
            assert self.servers.rest is not None
            return ("127.0.0.1", self.servers.rest.rest_port)
        return ("127.0.0.1", 5432)

    def drop(self) -> None:
        if self.database is not None:
            drop_database(self.database)


LinkFault = Literal["refuse", "blackhole", "slow", "lose", "errors"]


@dataclass
class Link:
    """One replica's way to a server through a proxy; faults stack (the latest one
    applies; healing one goes back to the one before, or to forwarding)."""

    proxy: TcpProxy | HttpProxy
    active: list[tuple[int, LinkFault]] = field(default_factory=list)
    _next: int = 0
    _rules_on: dict[int, bool] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.proxy.port

    def push(self, fault: LinkFault, chooser: Callable[[], float] | None = None) -> int:
        self._next += 1
        self.active.append((self._next, fault))
        if isinstance(self.proxy, HttpProxy) and fault in ("lose", "errors"):
            self._add_rule(self._next, fault, chooser)
        self._apply()
        return self._next

    def pop(self, token: int) -> None:
        self.active = [(t, f) for t, f in self.active if t != token]
        self._rules_on[token] = False
        self._apply()

    def _add_rule(self, token: int, fault: LinkFault, chooser: Callable[[], float] | None) -> None:
        assert isinstance(self.proxy, HttpProxy)
        self._rules_on[token] = True
        on = self._rules_on

        def matches(seen: Seen) -> bool:
            if not on.get(token):
                return False
            if fault == "lose":  # an Iceberg REST commit: POST .../tables/{t} or /transactions
                return seen.method == "POST" and (
                    "/tables/" in seen.path or seen.path.endswith("/transactions/commit")
                )
            return chooser is None or chooser() < 0.3

        kind: Any = "forward_then_502" if fault == "lose" else "503"
        self.proxy.fail(matches, kind, times=1 << 30)

    def _apply(self) -> None:
        fault = self.active[-1][1] if self.active else None
        proxy = self.proxy
        if isinstance(proxy, TcpProxy):
            proxy.delay = 1.0
            modes: dict[LinkFault | None, Any] = {
                None: "forward",
                "refuse": "refuse",
                "blackhole": "silent",
                "slow": "slow",
                "lose": "lose_commits",
                "errors": "reset",
            }
            proxy.mode = modes[fault]
            return
        proxy.delay = 1.5 if fault == "slow" else 0.0
        proxy.mode = {"refuse": "down", "blackhole": "stall"}.get(fault or "", "forward")  # type: ignore[assignment]
