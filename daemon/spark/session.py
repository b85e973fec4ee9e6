"""A SparkSession configured to read and write the daemon's catalog, for jobs and tests.

    from icespool import load_config
    from icespool.spark.session import spark_session

    spark = spark_session(load_config("icespool.toml"), runtime_dir=".spark-runtime")
    spark.table("lake.demo.events").count()

pyspark is an optional extra (``pip install 'icespool[spark]'``), so it is imported only
when a session is built, and the session is typed ``Any``: the daemon must type-check and
run without it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, Final

from icespool.config import Config
from icespool.errors import SparkConfError
from icespool.spark.conf import DEFAULT_SPARK, RUNTIME_DIR_ENV, spark_line, spark_settings

__all__ = [
    "DEFAULT_SESSION_CONF",
    "import_pyspark_sql",
    "installed_spark_line",
    "register_catalog",
    "spark_session",
]

#: Settings every session built here starts from; ``conf`` overrides them.
DEFAULT_SESSION_CONF: Final[Mapping[str, str]] = {
    # icespool stores timestamptz as UTC; showing them in the JVM's zone only confuses.
    "spark.sql.session.timeZone": "UTC",
}


def import_pyspark_sql() -> Any:
    """The ``pyspark.sql`` module, or SparkConfError saying how to install pyspark."""
    try:
        return importlib.import_module("pyspark.sql")
    except ModuleNotFoundError as exc:
        raise SparkConfError(
            f"pyspark is not installed ({exc}); install it with \"pip install 'icespool[spark]'\" "
            f"(pyspark {DEFAULT_SPARK}, which needs Java 17 or later)"
        ) from None


def installed_spark_line() -> str:
    """The Spark line of the installed pyspark (SparkConfError when Iceberg's runtimes
    here have none for it): a session started in this process needs that line's jars."""
    import_pyspark_sql()
    version: str = importlib.import_module("pyspark").__version__
    return spark_line(version)


def _runtime_dir(runtime_dir: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    if runtime_dir is not None:
        return runtime_dir
    return os.environ.get(RUNTIME_DIR_ENV) or None


def spark_session(
    config: Config,
    runtime_dir: str | os.PathLike[str] | None = None,
    app_name: str = "icespool",
    *,
    master: str | None = "local[*]",
    catalog_name: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """Build (or get) a SparkSession that sees ``config``'s catalog as ``catalog_name``.

    ``runtime_dir``: a local Iceberg Spark runtime (``make spark-runtime``); None means
    ``$ICESPOOL_SPARK_RUNTIME``, and without that Spark fetches the Maven packages.
    ``master`` None leaves it to spark-submit. The Iceberg runtime is the one for the
    installed pyspark's Spark line. Secrets go into the session's conf (never printed).
    Spark applies jars and extensions only when the JVM starts: a session that already
    runs in this process gets the catalog settings but keeps its jars.
    """
    sql = import_pyspark_sql()
    settings = spark_settings(
        config,
        catalog_name=catalog_name,
        runtime_dir=_runtime_dir(runtime_dir),
        include_secrets=True,
        spark=installed_spark_line(),
    )
    builder = sql.SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in {**DEFAULT_SESSION_CONF, **settings.conf, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def register_catalog(spark: Any, config: Config, catalog_name: str | None = None) -> str:
    """Make a running session see ``config``'s catalog too; returns the Spark catalog name.

    Spark instantiates a catalog on its first use, so setting its properties at runtime is
    enough. The session must already have the Iceberg runtime jars and extensions.
    """
    settings = spark_settings(config, catalog_name=catalog_name, include_secrets=True)
    prefix = f"spark.sql.catalog.{settings.catalog_name}"
    for key, value in settings.conf.items():
        if key == prefix or key.startswith(prefix + "."):
            spark.conf.set(key, value)
    return settings.catalog_name
