"""Apache Hive's standalone metastore, the Hive catalog (``type = "hive"``) the tests run.

    metastore = HiveMetastore.start(tmp_dir)      # one JVM on a free loopback port
    props = metastore.catalog_properties(metastore.warehouse())  # emptied per test
    metastore.stop()

``org.apache.hadoop.hive.metastore.HiveMetaStore`` 4.0.0 serves the Thrift API on
127.0.0.1 in front of a database of its own on the suite's PostgreSQL (127.0.0.1:5432),
whose schema its schematool (``MetastoreSchemaTool -initSchema -dbType postgres``) creates
at start: only that schema has the transaction tables behind the table locks pyiceberg's
and Iceberg Java's HiveCatalog take to commit. Not the embedded Derby the metastore
brings: there a lock check and the housekeeper that times locks out wait on each other's
row locks until both time out, over and over, and every commit to the metastore hangs.
Tables live in a local directory (``file://``) both the metastore and the clients on this
machine reach. The jars and schema scripts are the ones tests/support/hive/pom.xml pins,
which `make test-deps` puts under .test-tools/hive/.

It serves one catalog, so a test's fresh warehouse is the metastore emptied:
``warehouse()`` drops every database but ``default`` (with its tables) and deletes their
files. Tests of one session run one after another.

A metastore that cannot start fails the test run with its log; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from xml.sax.saxutils import escape

from hive_metastore.ThriftHiveMetastore import Client
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport

from support.jvm import JvmProcess, ToolsMissing, find_java, free_ports, log4j2_file
from support.postgres import PG, create_database, drop_database

__all__ = ["HIVE_DIR", "HiveMetastore", "HiveMetastoreMissing"]

REPO = Path(__file__).resolve().parents[2]
HIVE_DIR = REPO / ".test-tools" / "hive"
LIBS = HIVE_DIR / "libs"
_START_TIMEOUT = 90.0
_SCHEMA_TIMEOUT = 120.0
_CALL_TIMEOUT_MS = 30_000
_MAIN = "org.apache.hadoop.hive.metastore.HiveMetaStore"
_SCHEMA_TOOL = "org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool"
# One line per Thrift call and per DataNucleus statement would bury what a failed start says.
_QUIET = {"org.apache.hadoop.hive.metastore.HiveMetaStore.audit": "warn", "DataNucleus": "warn"}
_LOG_PATTERN = "%d{ISO8601} %p [%t] %c{2}: %m%n"


# Java or the metastore's jars are not installed (``make test-deps`` installs them).
HiveMetastoreMissing = ToolsMissing


def _installed() -> tuple[str, Path]:
    """(classpath, the distribution home whose scripts/ schematool reads)."""
    homes = sorted((HIVE_DIR / "dist").glob("apache-hive-metastore-*-bin"))
    scripts = homes[-1] / "scripts" / "metastore" / "upgrade" / "postgres" if homes else None
    if not any(LIBS.glob("hive-standalone-metastore-server-*.jar")) or not (
        scripts and scripts.is_dir()
    ):
        raise HiveMetastoreMissing(
            f"the Hive Metastore's jars or schema scripts are missing from {HIVE_DIR}: run "
            "`make test-deps` (it fetches what tests/support/hive/pom.xml pins from Maven "
            "Central)"
        )
    return f"{LIBS}/*", homes[-1]


def _site_xml(settings: dict[str, str]) -> str:
    properties = "\n".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>"
        for k, v in settings.items()
    )
    return f"<configuration>\n{properties}\n</configuration>\n"


@dataclass
class HiveMetastore:
    jvm: JvmProcess
    port: int
    database: str
    started_in: float = 0.0
    schema_in: float = 0.0

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    @property
    def location(self) -> Path:
        """The metastore's warehouse: where a database's tables go by default."""
        return self.jvm.root / "warehouse"

    @classmethod
    def start(cls, root: Path) -> HiveMetastore:
        java = find_java()
        classpath, home = _installed()
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "conf"
        conf.mkdir(exist_ok=True)
        (port,) = free_ports(1)
        # One database per metastore: each test worker runs one.
        database = create_database("icespool_hive")
        log_path = root / "metastore.log"
        (conf / "metastore-log4j2.properties").write_text(
            log4j2_file(log_path, _QUIET, _LOG_PATTERN)
        )
        (conf / "metastore-site.xml").write_text(
            _site_xml(
                {
                    "javax.jdo.option.ConnectionURL": (
                        f"jdbc:postgresql://{PG['host']}:{PG['port']}/{database}"
                    ),
                    "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
                    # Trust authentication on loopback: no password.
                    "javax.jdo.option.ConnectionUserName": PG["user"],
                    "javax.jdo.option.ConnectionPassword": "",
                    # Iceberg tables are external tables, which Hive 4 refuses inside the
                    # managed tables' root: the two are apart.
                    "metastore.warehouse.dir": (root / "managed").as_uri(),
                    "metastore.warehouse.external.dir": (root / "warehouse").as_uri(),
                    "metastore.thrift.bind.host": "127.0.0.1",
                    "metastore.thrift.port": str(port),
                    # Async logging needs LMAX Disruptor, which the metastore does not bring.
                    "metastore.async.log.enabled": "false",
                    # A client killed -9 inside a commit leaves its table lock behind (no
                    # client heartbeats it), and the table's commits wait until the
                    # housekeeper times it out: 300 s by default, 10 s here so that the
                    # kill -9 tests see the same wait, shorter.
                    "metastore.housekeeping.threads.on": "true",
                    "metastore.txn.timeout": "10s",
                    "metastore.acid.housekeeper.interval": "2s",
                    # The loser of two creates of one database waits this long to be told
                    # it exists (its first try fails on the unique key): 2 s by default.
                    "metastore.hmshandler.retry.interval": "100ms",
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "HIVE_"))}
        env["METASTORE_HOME"] = str(home)
        jvm = JvmProcess(
            java,
            root,
            (log_path,),
            heap=("64m", "384m"),
            classpath=f"{conf}:{classpath}",
            properties={"log4j2.configurationFile": conf / "metastore-log4j2.properties"},
            env=env,
        )
        metastore = cls(jvm, port, database)
        began = time.monotonic()
        try:
            jvm.run(
                _SCHEMA_TOOL,
                "-initSchema",
                "-dbType",
                "postgres",
                timeout=_SCHEMA_TIMEOUT,
                what="the Hive Metastore's schematool -initSchema",
            )
            metastore.schema_in = time.monotonic() - began
            jvm.start(_MAIN)
            jvm.wait_ready(
                metastore._list_databases,
                within=_START_TIMEOUT,
                name="the Hive Metastore",
                waiting_for="answer get_all_databases",
                retry_on=(OSError, TTransport.TTransportException),
            )
        except BaseException:
            metastore.stop()
            raise
        metastore.started_in = time.monotonic() - began
        return metastore

    def _list_databases(self) -> None:
        # A plain connect first: thrift logs every refused open as an error.
        socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        with self.client() as client:
            client.get_all_databases()

    @contextlib.contextmanager
    def client(self) -> Iterator[Client]:
        """A Thrift client of the metastore (every call bounded to 30 s)."""
        sock = TSocket.TSocket("127.0.0.1", self.port)
        sock.setTimeout(_CALL_TIMEOUT_MS)
        transport = TTransport.TBufferedTransport(sock)
        transport.open()
        try:
            yield Client(TBinaryProtocol.TBinaryProtocol(transport))
        finally:
            transport.close()

    def warehouse(self) -> str:
        """The metastore emptied of what earlier tests left, as its warehouse location."""
        with self.client() as client:
            for database in client.get_all_databases():
                if database == "default":
                    continue
                location = client.get_database(database).locationUri
                client.drop_database(database, True, True)  # deleteData, cascade
                # Iceberg tables are external: the metastore leaves their files.
                path = urlparse(location).path if location else ""
                if path and Path(path).is_relative_to(self.location):
                    shutil.rmtree(path, ignore_errors=True)
        self.location.mkdir(parents=True, exist_ok=True)
        return self.location.as_uri()

    def catalog_properties(self, warehouse: str) -> dict[str, str]:
        """``[catalog]`` of this metastore as a user writes it."""
        return {"type": "hive", "uri": self.uri, "warehouse": warehouse}

    def log_tail(self, lines: int = 40) -> str:
        return self.jvm.log_tail(lines)

    def stop(self) -> None:
        """SIGKILL, then its database dropped: the rest of its state is a temporary directory
        nothing else uses."""
        self.jvm.stop()
        drop_database(self.database)
