"""One real local SparkSession for every Spark test, and helpers to point it at a daemon.

The session is built once (a JVM start costs seconds) with the local Iceberg Spark runtime
(``make spark-runtime``: deploy/spark/pom.xml's jars; ``$ICESPOOL_SPARK_RUNTIME`` or
``.spark-runtime/`` at the repo root). A missing runtime FAILS every Spark test with the
missing piece named: these tests are the proof that Spark reads the daemon's tables, so
they never skip. The JVM starts with the AWS SDK settings ``icespool spark-conf`` prints for
an S3-compatible store, so S3 catalogs (tests/spark/test_spark_s3.py) register on the same
session.

Each test gives its daemon a catalog name of its own and registers it on the running
session (``register_catalog``): a SQL catalog is visible to Spark only under the daemon's
catalog name, and Spark caches a catalog by name once it was used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.spark_helpers import unique_catalog_name

from icespool.config import Config, validate_config
from icespool.errors import SparkConfError
from icespool.spark.conf import (
    DEFAULT_SPARK,
    RUNTIME_DIR_ENV,
    S3_COMPATIBLE_JAVA_OPTIONS,
    runtime_jars,
)
from icespool.spark.session import installed_spark_line, register_catalog, spark_session

REPO = Path(__file__).resolve().parents[2]
RUNTIME_DIR = Path(os.environ.get(RUNTIME_DIR_ENV) or REPO / ".spark-runtime")

# Small, fast, quiet: two local cores, two shuffle partitions, no UI or progress bars.
TEST_SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.enabled": "false",  # keeps the scan node (and its metrics) in the plan
    # The JIT's C1 tier only, and the serial GC: the tests run many small queries, which
    # this runs in about half the CPU time of the default tiered C2 and parallel GC.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    # JVM settings cannot follow a catalog registered later: those of S3 catalogs on
    # SeaweedFS (a custom s3.endpoint) are set from the start.
    "spark.driver.defaultJavaOptions": S3_COMPATIBLE_JAVA_OPTIONS,
}
# The jars every Spark test needs in the runtime directory besides the Iceberg runtime
# (S3 tables need the AWS SDK, gs:// tables the Google Cloud Storage client).
REQUIRED_JARS = ("iceberg-aws-bundle-*.jar", "iceberg-gcp-bundle-*.jar")


# pyspark (4.1 as 3.5) reads every collect()'s result from a fresh local socket to the JVM
# and never closes it (its _load_from_socket leaves the socket to the garbage collector), so
# each collect() emits a ResourceWarning for an unclosed socket to 127.0.0.1. Ignored for
# the Spark tests only, and only that exact shape of warning.
_PYSPARK_SOCKET_LEAK = r"ignore:unclosed <socket\.socket .*raddr=\('127\.0\.0\.1':ResourceWarning"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings(_PYSPARK_SOCKET_LEAK))
    # Under pytest-xdist (--dist loadgroup) every Spark test runs on one worker, one JVM
    # for the run: tests/support/xdist_groups.py (an xdist_group mark is ignored there).


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        line = installed_spark_line()
        jars = runtime_jars(RUNTIME_DIR, line)
    except SparkConfError as exc:
        pytest.fail(f"the Iceberg Spark runtime is not usable: {exc}", pytrace=False)
    if line != DEFAULT_SPARK:
        pytest.fail(
            f"the Spark tests run on Spark {DEFAULT_SPARK}, but this venv has Spark {line}'s "
            "pyspark: reinstall the test extra ('make pytest' does)",
            pytrace=False,
        )
    for pattern in REQUIRED_JARS:
        if not any(jar.match(pattern) for jar in jars):
            pytest.fail(
                f"the Iceberg Spark runtime {RUNTIME_DIR} has no {pattern}: run 'make "
                "spark-runtime' (deploy/spark/pom.xml)",
                pytrace=False,
            )
    home = tmp_path_factory.mktemp("spark-session")
    # The session needs some catalog at start; tests register their own daemons' catalogs.
    placeholder = validate_config(
        {
            "catalog": {
                "name": "spark_tests",
                "type": "sql",
                "uri": f"sqlite:///{home}/catalog.db",
                "warehouse": (home / "warehouse").as_uri(),
            },
            "spool": {"dir": str(home / "spool")},
        }
    )
    session = spark_session(
        placeholder,
        runtime_dir=RUNTIME_DIR,
        app_name="icespool-tests",
        master="local[2]",
        conf={**TEST_SESSION_CONF, "spark.sql.warehouse.dir": str(home / "spark-warehouse")},
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def catalog_name() -> str:
    return unique_catalog_name()


Register = Callable[[Config], str]


@pytest.fixture
def register(spark: Any) -> Register:
    """``register(config)``: the session sees the daemon's catalog; returns its Spark name."""

    def run(config: Config) -> str:
        return register_catalog(spark, config)

    return run
