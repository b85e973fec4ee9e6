"""Quick start: Kafka -> icespool -> Iceberg -> Spark on one machine, in about a minute.

    make demo                                   # installs what it needs, then runs this
    python deploy/demo/demo.py [--dir icespool-demo] [--events 10000]

Steps (each bounded in time; a failing step is named and the daemon's log tail shown):

1. start a local Apache Kafka broker (one KRaft JVM, the jars ``make demo`` copies from
   Maven Central) on free loopback ports, and create the topic ``shop-orders``;
2. write ``<dir>/icespool.toml``: the embedded default (SQLite catalog, local warehouse
   and spool, all under ``<dir>``) plus a table ``shop.orders`` and a ``[[kafka]]``
   source feeding it, with a 2 s ``batch_timeout`` so commits come quickly (and
   ``<dir>/icespool-http.toml``, the same without the Kafka source, for a daemon started
   by hand afterwards, when the broker is gone);
3. start ``icespool run --config <dir>/icespool.toml`` as a child process;
4. produce sample shop orders (JSON, ids 1..N, timestamps, amounts, a few kinds);
5. wait until the table holds all of them;
6. run a Spark SQL aggregate over the table in a local Spark, configured with the output
   of ``icespool spark-conf`` (the Iceberg runtime is found as that command finds it:
   ``--runtime-dir``, else ``$ICESPOOL_SPARK_RUNTIME``, else Maven), and print it (Spark
   starts in the background before the daemon, so it is warmed up by then);
7. stop the daemon (SIGTERM: it commits and exits) and the broker, and print the commands
   that run the same query, and a daemon on the demo's tables, by hand.

This is a demonstration, not production code: it lives in deploy/, not in daemon/.
``<dir>`` is wiped at the start (only if an earlier demo made it): the broker's data
lives in it too, so a fresh topic meets a fresh table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

TABLE = "shop.orders"
TOPIC = "shop-orders"
GROUP = "icespool-demo"
PARTITIONS = 3
KINDS = ("web", "app", "store", "phone")
_KIND_WEIGHTS = (5, 3, 2, 1)
_T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
SCHEMA = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "kind", "type": "string"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "decimal(10,2)"},
]
_MARKER = ".icespool-demo"  # marks a directory this script may wipe
# Where `make demo` (and `make test-deps`) put the broker's jars.
_KAFKA_LIBS = Path(__file__).resolve().parents[2] / ".test-tools" / "kafka" / "libs"
_READY_RE = re.compile(r"icespool ready: http://(?P<host>[^\s,]+):(?P<port>\d+)")

_KAFKA_LOG4J2 = """\
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
"""

# Bounds of every wait, in seconds.
BROKER_START_S = 60
TOPIC_S = 30
DAEMON_READY_S = 60
PRODUCE_S = 120
# The commits follow within batch_timeout (2 s) of the last record.
COMMIT_S = 120
SPARK_S = 240
DAEMON_STOP_S = 45  # the daemon's shutdown grace is 30 s and it ends within grace + 5 s


class DemoError(Exception):
    """A step failed; the message names it."""


# ---------------------------------------------------------------- sample data


def sample_orders(count: int, seed: int = 15) -> list[dict[str, Any]]:
    """``count`` shop orders with ids 1..count, the same for the same arguments."""
    rng = random.Random(seed)
    orders = []
    for order_id in range(1, count + 1):
        ts = _T0 + dt.timedelta(seconds=order_id * 17 + rng.randrange(17))
        cents = rng.randrange(199, 50_000)
        orders.append(
            {
                "order_id": order_id,
                "ts": ts.isoformat().replace("+00:00", "Z"),
                "kind": rng.choices(KINDS, _KIND_WEIGHTS)[0],
                "customer": f"c{rng.randrange(1, 500):04d}",
                "amount": f"{cents // 100}.{cents % 100:02d}",  # exact decimal text
            }
        )
    return orders


def expected_by_kind(orders: list[dict[str, Any]]) -> dict[str, tuple[int, Decimal]]:
    """kind -> (orders, sum of amounts): what the Spark query must print."""
    counts: Counter[str] = Counter()
    sums: dict[str, Decimal] = {}
    for order in orders:
        counts[order["kind"]] += 1
        sums[order["kind"]] = sums.get(order["kind"], Decimal(0)) + Decimal(order["amount"])
    return {kind: (counts[kind], sums[kind]) for kind in sorted(counts)}


def query(catalog: str) -> str:
    return (
        f"SELECT kind, count(*) AS orders, sum(amount) AS revenue "
        f"FROM {catalog}.{TABLE} GROUP BY kind ORDER BY kind"
    )


# ---------------------------------------------------------------- output


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    say(f"{name} ...")
    started = time.monotonic()
    try:
        yield
    except DemoError as exc:
        raise DemoError(f"step '{name}' failed: {exc}") from None
    except Exception as exc:  # any other failure of the step gets its name too
        raise DemoError(f"step '{name}' failed: {type(exc).__name__}: {exc}") from exc
    say(f"{name}: done in {time.monotonic() - started:.1f} s")


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} cannot be read)"
    return "\n".join(f"    {line}" for line in text[-lines:]) or "    (empty)"


# ---------------------------------------------------------------- the demo directory


def prepare_dir(root: Path) -> None:
    if root.exists():
        if not root.is_dir():
            raise DemoError(f"{root} exists and is not a directory")
        if any(root.iterdir()) and not (root / _MARKER).exists():
            raise DemoError(
                f"{root} is not empty and was not made by this demo; "
                "pass --dir with a new or demo directory"
            )
        _refuse_if_daemon_runs(root / "spool" / "LOCK")
        shutil.rmtree(root)
        say(f"removed the previous demo data in {root}")
    (root / "logs").mkdir(parents=True)
    (root / _MARKER).write_text("made by deploy/demo/demo.py; wiped by its next run\n")


def _refuse_if_daemon_runs(lock: Path) -> None:
    """A daemon started by hand on the demo's config holds the spool's flock: keep its data."""
    if not lock.exists():
        return
    with lock.open("rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().decode(errors="replace").strip() or "?"
            raise DemoError(
                f"an icespool daemon (pid {holder}) still runs on {lock.parent}; stop it first"
            ) from None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def write_config(root: Path, bootstrap: str) -> tuple[Path, Path]:
    """The embedded default under ``root`` plus the demo table and its Kafka source; and
    the same without the Kafka source (``icespool-http.toml``), for a daemon started by
    hand once the demo's broker is gone (one with the source would wait for the broker)."""
    from icespool.config import embedded_default, render_toml, validate_config

    raw = embedded_default(root)
    raw["defaults"] = {"batch_timeout": "2s"}
    raw["encode"] = {"workers": 2}
    raw["tables"].append(
        {"name": TABLE, "create": True, "schema": SCHEMA, "partition_by": ["day(ts)"]}
    )
    raw["kafka"] = [
        {
            "bootstrap_servers": bootstrap,
            "group_id": GROUP,
            "topics": [TOPIC],
            "table": TABLE,
            "format": "json",
            "dead_letter": "table",
        }
    ]
    validate_config(raw)  # a mistake here is the demo's, not the user's: fail before starting
    path = root / "icespool.toml"
    path.write_text(
        render_toml(
            raw,
            header="icespool demo config (deploy/demo/demo.py): embedded default "
            "+ shop.orders fed from Kafka",
        )
    )
    del raw["kafka"]
    validate_config(raw)
    http = root / "icespool-http.toml"
    http.write_text(
        render_toml(
            raw,
            header="icespool demo config without Kafka (deploy/demo/demo.py): the demo's "
            "tables over HTTP only",
        )
    )
    return path, http


def load_table(root: Path) -> Any:
    """``shop.orders`` through pyiceberg, on the demo's catalog (None while it is missing)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    from icespool.config import embedded_default

    catalog_conf = dict(embedded_default(root)["catalog"])
    catalog = load_catalog(catalog_conf.pop("name"), **catalog_conf)
    try:
        return catalog.load_table(TABLE)
    except NoSuchTableError:
        return None
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


def table_records(root: Path) -> int:
    table = load_table(root)
    snapshot = None if table is None else table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get("total-records", "0"))


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def icespool_command() -> list[str]:
    """The console script next to this interpreter, else ``python -m icespool``."""
    script = Path(sys.executable).parent / "icespool"
    return [str(script)] if script.exists() else [sys.executable, "-m", "icespool"]


class Broker:
    """A one-node Apache Kafka (KRaft: broker and controller in one JVM) on free loopback
    ports, its log and data under ``<dir>/kafka``; the jars are those ``make demo`` copies
    from Maven Central (tests/support/kafka/pom.xml pins them)."""

    def __init__(self, root: Path, libs: Path) -> None:
        self.root = root / "kafka"
        self.libs = libs
        self.port = free_port()
        self.controller_port = free_port()
        self.log = root / "logs" / "kafka.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def properties(self) -> str:
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:"
            f"{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "metadata.log.dir": str(self.root / "metadata"),
            # One node: the internal topics with one replica (their default of 3 would
            # never be met), and a new group joins at once.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def java(self, *args: str) -> list[str]:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home else "java"
        log4j = self.root / "log4j2.properties"
        return [java, "-Xmx512m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{self.libs}/*", *args]  # fmt: skip

    def start(self) -> None:
        self.root.mkdir(parents=True)
        (self.root / "log4j2.properties").write_text(_KAFKA_LOG4J2.format(log=self.log))
        config = self.root / "server.properties"
        config.write_text(self.properties())
        # A Kafka UUID: 22 URL-safe base64 characters, never led by "-" (StorageTool
        # would read it as an option).
        cluster_id = "A" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[1:22]
        command = self.java(
            "kafka.tools.StorageTool", "format", "--config", str(config), "--cluster-id", cluster_id
        )
        formatted = subprocess.run(
            command, capture_output=True, text=True, timeout=BROKER_START_S, check=False
        )
        if formatted.returncode != 0:
            raise DemoError(f"formatting Kafka's storage failed:\n{formatted.stderr[-2000:]}")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.java("kafka.Kafka", str(config)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + BROKER_START_S
        # aiokafka logs every refused connect as an error ("Unable connect to ..."): while
        # the JVM starts, wait for the port with a plain connect, and ask for metadata with
        # those lines held back (a real failure still ends the wait, with its reason).
        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise DemoError(
                        f"Kafka exited with {self.process.returncode}:\n{tail(self.log)}"
                    )
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        pass
                    run_bounded(list_topics(self.bootstrap), 10, "listing the topics")
                    return
                except (OSError, DemoError):  # refused or not yet serving metadata
                    time.sleep(0.2)
        finally:
            quiet.setLevel(level)
        raise DemoError(f"Kafka did not answer on {self.bootstrap} within {BROKER_START_S} s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # a controlled shutdown: Kafka flushes and exits
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class Daemon:
    def __init__(self, root: Path, config: Path) -> None:
        self.config = config
        self.log = root / "logs" / "icespool.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        # The config keeps the embedded default's 127.0.0.1:8080 (what a user gets by hand);
        # the demo binds a free port instead, through the documented environment override.
        env = {**os.environ, "ICESPOOL__HTTP__LISTEN": "127.0.0.1:0"}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*icespool_command(), "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        deadline = time.monotonic() + DAEMON_READY_S
        while time.monotonic() < deadline:
            match = _READY_RE.search(self.log.read_text(errors="replace"))
            if match:
                self.url = f"http://{match['host']}:{match['port']}"
                return
            self.check_alive()
            time.sleep(0.1)
        raise DemoError(f"no 'icespool ready' line within {DAEMON_READY_S} s")

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise DemoError(f"icespool exited with status {self.process.returncode}")

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/v1/status", timeout=5) as response:
            status: dict[str, Any] = json.load(response)
            return status

    def stop(self) -> None:
        """SIGTERM: the daemon commits what is pending and exits 0 ("stopped cleanly")."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(DAEMON_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise DemoError(f"icespool did not exit within {DAEMON_STOP_S} s of SIGTERM") from None
        if code != 0:
            raise DemoError(f"icespool exited with status {code} after SIGTERM")
        if "stopped cleanly" not in self.log.read_text(errors="replace"):
            raise DemoError("icespool exited without 'stopped cleanly' in its log")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


# ---------------------------------------------------------------- Kafka


async def list_topics(bootstrap: str) -> None:
    """Answers once the broker serves metadata; raises DemoError until then."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    try:
        await admin.start()
        await admin.list_topics()
    except (KafkaError, OSError) as exc:
        raise DemoError(f"Kafka on {bootstrap}: {exc}") from None
    finally:
        await admin.close()


async def create_topic(bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)]
        )
    finally:
        await admin.close()


async def produce(bootstrap: str, orders: list[dict[str, Any]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        max_batch_size=256 << 10,
        acks="all",
        request_timeout_ms=20_000,
    )
    await producer.start()
    try:
        pending = []
        for order in orders:
            value = json.dumps(order, separators=(",", ":")).encode()
            key = str(order["order_id"]).encode()
            pending.append(await producer.send(TOPIC, value=value, key=key))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def run_bounded(coro: Any, seconds: float, what: str) -> None:
    async def bounded() -> None:
        try:
            async with asyncio.timeout(seconds):
                await coro
        except TimeoutError:
            raise DemoError(f"{what} did not finish within {seconds:g} s") from None

    asyncio.run(bounded())


# ---------------------------------------------------------------- waiting for the commits


def wait_committed(root: Path, daemon: Daemon, expected: int) -> None:
    deadline = time.monotonic() + COMMIT_S
    last_report = 0.0
    committed = 0
    while time.monotonic() < deadline:
        daemon.check_alive()
        committed = table_records(root)
        if committed >= expected:
            break
        if time.monotonic() - last_report >= 2:
            last_report = time.monotonic()
            status = daemon.status()
            pending = status["tables"].get(TABLE, {}).get("pending_records", 0)
            lags = status["kafka"]["lag"].values()
            kafka = (
                f"Kafka lag {sum(v or 0 for v in lags):,}"
                if lags
                else "waiting for the partition assignment"
            )
            say(f"  committed {committed:,} of {expected:,} (spooled {pending:,}, {kafka})")
        time.sleep(0.25)
    else:
        raise DemoError(f"the table holds {committed:,} of {expected:,} records after {COMMIT_S} s")
    if committed != expected:
        raise DemoError(f"the table holds {committed:,} records, {expected:,} were produced")
    status = daemon.status()
    if status["degraded"] or status["quarantine"]["segments"]:
        raise DemoError(f"the daemon reports problems: degraded {status['degraded']}, "
                        f"quarantine {status['quarantine']}")  # fmt: skip
    dead = status["tables"].get(f"{TABLE}_dead_letter", {}).get("last_commit")
    if dead and dead.get("records"):
        raise DemoError(f"{dead['records']} records went to {TABLE}_dead_letter")
    say(f"  committed {committed:,} of {expected:,}")


# ---------------------------------------------------------------- Spark


def spark_conf_command(config: Path, runtime_dir: str | None) -> list[str]:
    command = [*icespool_command(), "spark-conf", "--config", str(config)]
    return [*command, "--runtime-dir", runtime_dir] if runtime_dir else command


class SparkQuery:
    """The aggregate in a child process (so a stuck JVM cannot outlive the bound), started
    early: the JVM and the Spark session come up, and warm up, while the daemon starts
    and consumes. A JVM, a session and a first Iceberg query take tens of seconds on a
    busy machine; after the warm-up only the query itself is left.

    The child reads two lines from its stdin: the first once the daemon created the table
    (its catalog is warmed up then, not before: Iceberg's JDBC catalog would create the
    catalog tables itself if it came first), the second once the table holds every record
    (the query)."""

    def __init__(self, root: Path, config: Path, runtime_dir: str | None) -> None:
        self.command = [sys.executable, str(Path(__file__).resolve()), "_spark-query", str(config)]
        if runtime_dir:
            self.command += ["--runtime-dir", runtime_dir]
        self.log = root / "logs" / "spark.log"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        with self.log.open("ab") as err:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )

    def catalog_ready(self) -> None:
        """The daemon is up: its catalog and the table exist."""
        assert self.process is not None and self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it ended: `run` reports its log
            self.process.stdin.write("catalog\n")
            self.process.stdin.flush()

    def run(self) -> str:
        """Ask for the query (the table holds every record by now); its printed output."""
        assert self.process is not None
        try:
            out, _ = self.process.communicate("query\n", timeout=SPARK_S)
        except subprocess.TimeoutExpired:
            raise DemoError(f"Spark did not answer within {SPARK_S} s:\n{tail(self.log)}") from None
        if self.process.returncode != 0:  # (also when it ended before it was asked)
            raise DemoError(
                f"the Spark query failed (status {self.process.returncode}):\n{tail(self.log)}"
            )
        return out

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def spark_query_main(config: Path, runtime_dir: str | None) -> int:
    """Child process: Spark settings from ``icespool spark-conf``, a session and warm-ups,
    then the query, shown (see `SparkQuery` for the two lines it waits for)."""
    started = time.monotonic()

    def progress(message: str) -> None:  # to stderr: the demo's logs/spark.log
        print(f"[demo spark] {message} after {time.monotonic() - started:.1f} s", file=sys.stderr)

    def wait_for_parent() -> bool:
        if sys.stdin.readline():
            return True
        print("[demo spark] the demo ended before asking for the query", file=sys.stderr)
        return False

    from pyspark.sql import SparkSession

    spark_conf = subprocess.run(
        [*spark_conf_command(config, runtime_dir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    if spark_conf.returncode != 0:
        print(f"icespool spark-conf failed: {spark_conf.stderr.strip()}", file=sys.stderr)
        return 2
    conf_text = spark_conf.stdout
    conf: dict[str, str] = json.loads(conf_text)
    catalog = next(
        key.removeprefix("spark.sql.catalog.")
        for key, value in conf.items()
        if value == "org.apache.iceberg.spark.SparkCatalog"
    )
    builder = SparkSession.builder.appName("icespool-demo").master("local[2]")
    quiet = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(config.parent / "spark-warehouse"),
        # A short-lived JVM running one small query: the JIT's quick C1 tier only (about
        # half the CPU time of tiered compilation here).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
    for key, value in {**quiet, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        progress("session up")
        # An aggregate of the query's shape, without a table.
        spark.sql(
            "SELECT id % 4 AS k, count(*), sum(CAST(id AS DECIMAL(10,2))) FROM range(100) "
            "GROUP BY k ORDER BY k"
        ).collect()
        progress("warmed up")
        if not wait_for_parent():
            return 1
        # The catalog: listing the tables loads none, so no table is cached before the
        # commits (Iceberg's SparkCatalog caches a loaded table's snapshot).
        spark.sql(f"SHOW TABLES IN {catalog}.{TABLE.split('.')[0]}").collect()
        progress("catalog warmed up")
        if not wait_for_parent():
            return 1
        sql = query(catalog)
        print(f"spark.sql({sql!r}).show()")
        spark.sql(sql).show(truncate=False)
        progress("query shown")
    finally:
        spark.stop()
    return 0


# ---------------------------------------------------------------- main


def _shown(path: Path | str) -> str:
    """``path`` relative to the working directory when it is below it, shell-quoted."""
    path = Path(path).resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return shlex.quote(str(path))


def by_hand(root: Path, config: Path, http_config: Path, runtime_dir: str | None) -> str:
    """The commands that run the same query by hand (checked by tests/ops/test_demo.py)."""
    activate = Path(sys.executable).parent / "activate"
    setup = (
        f"  . {_shown(activate)}    # icespool and spark-sql on PATH\n"
        if activate.exists()
        else "  # (with icespool and pyspark installed, icespool and spark-sql on PATH)\n"
    )
    conf = f"icespool spark-conf --config {_shown(config)}"
    if runtime_dir:
        conf += f" --runtime-dir {_shown(runtime_dir)}"
    return f"""\
The same query by hand (the table stays in {_shown(root)}):

{setup}  {conf}    # the Spark settings that see the daemon's catalog
  spark-sql --conf spark.sql.catalogImplementation=in-memory $({conf}) \\
      -e {shlex.quote(query("icespool"))}

The daemon on the demo's tables (HTTP on 127.0.0.1:8080, the embedded default's), without
Kafka: the demo's broker is stopped, and a daemon on {_shown(config)} would wait for it:

  icespool run --config {_shown(http_config)}
"""


def check_prerequisites(runtime_dir: str | None, kafka_libs: Path) -> None:
    """Fail at once, naming the missing piece, rather than after the broker and daemon."""
    import importlib.util

    missing = [m for m in ("aiokafka", "pyspark") if not importlib.util.find_spec(m)]
    if missing:
        raise DemoError(
            f"missing Python packages {missing}: pip install -e '.[demo]' (or run make demo)"
        )
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise DemoError(
            "no java on PATH (Spark needs Java 17): apt-get install openjdk-17-jre-headless"
        )
    if not any(kafka_libs.glob("kafka_2.13-*.jar")):
        raise DemoError(
            f"no Apache Kafka jars in {kafka_libs}: make demo copies them from Maven Central "
            "(or pass --kafka-libs)"
        )
    if runtime_dir:
        from icespool.spark.conf import runtime_jars

        runtime_jars(runtime_dir)  # SparkConfError names the directory and how to build it


def run_demo(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    runtime_dir = args.runtime_dir or os.environ.get("ICESPOOL_SPARK_RUNTIME") or None
    kafka_libs = Path(args.kafka_libs or os.environ.get("ICESPOOL_KAFKA_LIBS") or _KAFKA_LIBS)
    orders = sample_orders(args.events)
    broker: Broker | None = None
    daemon: Daemon | None = None
    spark: SparkQuery | None = None
    try:
        with step("checking the prerequisites"):
            check_prerequisites(runtime_dir, kafka_libs)
        with step(f"preparing {root}"):
            prepare_dir(root)
        with step("starting a local Apache Kafka broker"):
            broker = Broker(root, kafka_libs)
            broker.start()
            say(f"  broker on {broker.bootstrap}, log {broker.log}")
        with step(f"creating topic {TOPIC} ({PARTITIONS} partitions)"):
            run_bounded(create_topic(broker.bootstrap), TOPIC_S, "creating the topic")
        with step("writing the config"):
            config, http_config = write_config(root, broker.bootstrap)
            say(f"  {config}: embedded default + table {TABLE} + [[kafka]] {TOPIC} -> {TABLE}")
        with step("starting Spark in the background"):
            if runtime_dir:
                say(f"  Iceberg Spark runtime: {runtime_dir}")
            else:
                say("  no --runtime-dir or $ICESPOOL_SPARK_RUNTIME: Spark fetches the Iceberg "
                    "runtime from Maven Central (make demo uses .spark-runtime)")  # fmt: skip
            spark = SparkQuery(root, config, runtime_dir)
            spark.start()
            say(f"  log {spark.log}")
        with step("starting icespool run"):
            daemon = Daemon(root, config)
            daemon.start()
            spark.catalog_ready()
            say(f"  daemon on {daemon.url}, log {daemon.log}")
        with step(f"producing {len(orders):,} orders to {TOPIC}"):
            run_bounded(produce(broker.bootstrap, orders), PRODUCE_S, "producing")
        with step(f"waiting until {TABLE} holds all {len(orders):,}"):
            wait_committed(root, daemon, len(orders))
        with step("querying the table with Spark"):
            shown = spark.run()
        print(shown, end="", flush=True)
        expected = expected_by_kind(orders)
        say("produced: " + ", ".join(f"{kind} {n:,} ({s})" for kind, (n, s) in expected.items()))
        with step("stopping icespool (SIGTERM)"):
            daemon.stop()
        with step("stopping the broker"):
            broker.stop()
        print(by_hand(root, config, http_config, runtime_dir), flush=True)
        say("done")
        return 0
    except DemoError as exc:
        print(f"[demo] FAILED: {exc}", file=sys.stderr, flush=True)
        if daemon is not None:
            print(f"[demo] icespool log tail ({daemon.log}):\n{tail(daemon.log)}", file=sys.stderr)
        if broker is not None:
            print(
                f"[demo] broker log tail ({broker.log}):\n{tail(broker.log, 10)}", file=sys.stderr
            )
        return 1
    finally:
        if spark is not None:
            spark.kill()
        if daemon is not None:
            daemon.kill()
        if broker is not None:
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_spark-query"]:
        inner = argparse.ArgumentParser(prog="demo.py _spark-query")
        inner.add_argument("config", type=Path)
        inner.add_argument("--runtime-dir")
        spark_args = inner.parse_args(argv[1:])
        return spark_query_main(spark_args.config, spark_args.runtime_dir)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--dir", default="icespool-demo", help="demo data directory (default: ./icespool-demo)"
    )
    parser.add_argument(
        "--events", type=int, default=10_000, help="orders to produce (default: 10000)"
    )
    parser.add_argument(
        "--kafka-libs",
        help=f"Apache Kafka's jars (default: $ICESPOOL_KAFKA_LIBS, else {_KAFKA_LIBS})",
    )
    parser.add_argument(
        "--runtime-dir",
        help="local Iceberg Spark runtime (default: $ICESPOOL_SPARK_RUNTIME, else Maven)",
    )
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error("--events must be at least 1")
    return run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
