"""Real Debezium for tests: Kafka Connect standalone running Debezium's PostgreSQL connector.

The jars are the ones tests/support/debezium/pom.xml pins, copied by ``make test-deps``
into .test-tools/debezium/: the worker's classpath (``runtime/``) and, apart from it,
the connector's plugin.path folder (``plugins/debezium-connector-postgres/``), so the
connector's own Jackson and JDBC driver stay in its plugin class loader. The worker is
support/connect_worker.py's.

``DebeziumPostgres.create(root, bootstrap)`` makes a database of its own in the test
PostgreSQL (127.0.0.1:5432, user postgres); the test creates its source tables there,
then ``start(tables)`` runs one ``ConnectStandalone`` JVM (JSON converters with schemas,
Debezium's defaults otherwise; offsets in a file under ``root``; REST on a free
127.0.0.1 port) with the connector (pgoutput, a slot and publication named for this
source, a topic prefix of its own) and returns once the connector has taken its
snapshot and streams (its replication slot is active). ``stop()`` kills the JVM, drops
the slot and the database. Missing Java or jars raise naming ``make test-deps``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]

from support.apache_kafka import KafkaToolsMissing
from support.connect_worker import RUNTIME, ConnectWorker
from support.postgres import PG, admin

__all__ = ["PLUGINS", "RUNTIME", "DebeziumPostgres"]

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".test-tools" / "debezium"
PLUGINS = TOOLS / "plugins"
_CONVERTERS = {
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "true",
    "value.converter.schemas.enable": "true",
}


def _check_plugin() -> None:
    if not any((PLUGINS / "debezium-connector-postgres").glob("debezium-connector-postgres-*.jar")):
        raise KafkaToolsMissing(
            f"Debezium's PostgreSQL connector is missing from {PLUGINS}: run `make test-deps`"
        )


class DebeziumPostgres:
    """One source database and, after `start`, its Kafka Connect worker and connector."""

    def __init__(self, root: Path, bootstrap: str) -> None:
        tag = uuid.uuid4().hex[:10]
        self.root = root
        self.bootstrap = bootstrap
        self.database = f"dbz_{tag}"
        self.slot = f"dbz_slot_{tag}"
        self.publication = f"dbz_pub_{tag}"
        self.topic_prefix = f"dbz-{tag}"
        self.connector = f"pg-{tag}"
        self.worker: ConnectWorker | None = None
        self.started_in = 0.0

    @classmethod
    def create(cls, root: Path, bootstrap: str) -> DebeziumPostgres:
        root.mkdir(parents=True, exist_ok=True)
        source = cls(root, bootstrap)
        with admin() as cursor:
            cursor.execute(f'CREATE DATABASE "{source.database}"')
        return source

    def connect(self) -> Any:
        """A connection to the source database (autocommit off)."""
        return psycopg2.connect(dbname=self.database, connect_timeout=10, **PG)

    def topic(self, table: str) -> str:
        """The topic Debezium writes ``public.<table>``'s changes to."""
        return f"{self.topic_prefix}.public.{table}"

    # ------------------------------------------------------------------ lifecycle

    def start(self, tables: Sequence[str]) -> None:
        """Until the connector's task is RUNNING and its slot is active: the snapshot is
        done and Debezium reads the WAL."""
        _check_plugin()
        self.worker = ConnectWorker(
            self.root, self.bootstrap, PLUGINS, self._connector_config(tables), _CONVERTERS
        )
        self.worker.start(ready=self._slot_active)
        self.started_in = self.worker.started_in

    def _connector_config(self, tables: Sequence[str]) -> dict[str, str]:
        """Debezium's defaults (decimal.handling.mode precise, time.precision.mode
        adaptive, tombstones on delete, snapshot then stream) except what this test
        database needs."""
        return {
            "name": self.connector,
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "database.hostname": PG["host"],
            "database.port": str(PG["port"]),
            "database.user": PG["user"],
            "database.password": "",
            "database.dbname": self.database,
            "plugin.name": "pgoutput",
            "slot.name": self.slot,
            "publication.name": self.publication,
            "topic.prefix": self.topic_prefix,
            "table.include.list": ",".join(f"public.{t}" for t in tables),
            # The test broker creates no topics by itself: Connect creates Debezium's.
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1",
        }

    def _slot_active(self) -> bool:
        with admin() as cursor:
            cursor.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    def log_tail(self, lines: int = 60) -> str:
        return "" if self.worker is None else self.worker.log_tail(lines)

    def stop(self) -> None:
        """Kill the worker, then drop the slot (once PostgreSQL sees it inactive) and
        the database."""
        if self.worker is not None:
            self.worker.kill()
        with admin() as cursor:
            deadline = time.monotonic() + 30
            while True:
                cursor.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (self.slot,),
                )
                row = cursor.fetchone()
                if row is None:
                    break
                if row[0] is None or time.monotonic() > deadline:
                    if row[0] is not None:  # the walsender outlived its client: end it
                        cursor.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                        time.sleep(0.5)
                    cursor.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    break
                time.sleep(0.2)
            cursor.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
