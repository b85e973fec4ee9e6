"""The Spark settings that make a Spark job see the daemon's catalog (``icespool spark-conf``).

Pure mapping from the ``[catalog]`` section to Iceberg Spark runtime properties:

- ``sql`` (pyiceberg ``SqlCatalog``) -> ``SparkCatalog`` over Iceberg's ``JdbcCatalog`` on the
  same database. Both keep one row per table in ``iceberg_tables`` keyed by a
  ``catalog_name`` column: pyiceberg writes the ``[catalog] name``, ``JdbcCatalog`` the
  Spark catalog name. So the Spark catalog must carry the daemon's catalog name, or Spark
  sees an empty catalog. ``jdbc.schema-version=V1`` makes ``JdbcCatalog`` use the table
  layout pyiceberg creates (with the ``iceberg_type`` column). Spark does not create the
  catalog's tables (``jdbc.init-catalog-tables=false``): start the daemon once first.
- ``rest`` -> ``RESTCatalog`` (same URI, credential/token, warehouse), ``glue`` ->
  ``GlueCatalog``, ``hive`` -> ``HiveCatalog``.

Object stores: a ``gs://`` warehouse adds Iceberg's ``GCSFileIO`` and the Google Cloud
Storage client of ``org.apache.iceberg:iceberg-gcp-bundle``; pyiceberg's ``gcs.*`` keys that
Iceberg Java reads (``gcs.service.host``, ``gcs.project-id``, ``gcs.oauth2.token`` and its
expiry) are spelled the same on both sides. An ``s3://`` warehouse (or a Glue catalog) adds
``S3FileIO``, which needs the AWS SDK v2 of ``iceberg-aws-bundle``. pyiceberg's S3 keys are
mostly Iceberg Java's too; the two that differ are translated: ``s3.region`` is
``client.region``, and ``s3.force-virtual-addressing`` is the inverse of
``s3.path-style-access``. pyiceberg addresses buckets path-style unless told otherwise, the
form S3-compatible stores on a custom ``s3.endpoint`` (MinIO, SeaweedFS, Ceph) need, while
Iceberg Java defaults to virtual-hosted style: with an ``s3.endpoint`` Spark is told
``s3.path-style-access=true`` too, so both address the same bucket the same way. Keys
only pyiceberg reads (its S3 timeouts, region resolution) are left out.

Non-AWS S3 (a custom ``s3.endpoint``): the AWS SDK v2 sends and checks CRC checksums by
default, which some S3-compatible stores refuse, and Iceberg has no catalog key for that
yet; the SDK's own system properties (``aws.requestChecksumCalculation`` /
``aws.responseChecksumValidation`` = ``when_required``) go into the driver's and executors'
``defaultJavaOptions`` (JVM settings: they apply only to a JVM Spark starts with them).

Spark versions: Iceberg publishes one runtime per Spark line and Scala version; ``spark``
picks it (4.1, Scala 2.13, by default; 3.5, Scala 2.12). A Spark session built in this
process takes the line of the installed pyspark.

Jars: with a local runtime directory (``make spark-runtime`` copies the jars
``deploy/spark/pom.xml`` pins from Maven Central) every jar in it goes into ``spark.jars``,
and a package the catalog needs that the directory does not hold is named in
``spark.jars.packages`` beside it; without a directory ``spark.jars.packages`` names all
the Maven coordinates, which Spark resolves itself (needs network access to Maven Central).

Secrets (a password in the SQLAlchemy URI or any other URI, a REST ``credential`` or
``token``, object-store keys: whatever ``check-config`` redacts) are left out unless asked for
(``include_secrets``), and the keys left out are reported, so that printing the settings
never leaks them by accident. Ways to supply them: pass
``--include-secrets`` and keep the output private, set the key at submit time
(``--conf spark.sql.catalog.<name>.jdbc.password=...``), or for PostgreSQL let the JDBC
driver read ``~/.pgpass`` / ``$PGPASSFILE``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import parse_qsl, unquote, urlencode

from icespool.errors import SparkConfError

if TYPE_CHECKING:  # the CLI's parser reads the Spark lines below without the config model
    from icespool.config import CatalogConfig, Config

__all__ = [
    "DEFAULT_SPARK",
    "EXTENSIONS",
    "FORMATS",
    "ICEBERG_VERSION",
    "MAVEN_AWS_BUNDLE",
    "MAVEN_GCP_BUNDLE",
    "MAVEN_POSTGRESQL",
    "MAVEN_SQLITE",
    "RUNTIME_DIR_ENV",
    "S3_COMPATIBLE_JAVA_OPTIONS",
    "SPARK_RUNTIMES",
    "JdbcConnection",
    "SparkConfError",
    "SparkSettings",
    "catalog_options",
    "jdbc_connection",
    "maven_iceberg_runtime",
    "render",
    "runtime_jars",
    "spark_line",
    "spark_settings",
]

#: The Iceberg release the Maven coordinates are pinned to: deploy/spark/pom.xml's (which
#: `make spark-runtime` copies) must be the same.
ICEBERG_VERSION: Final = "1.11.0"
#: Spark line -> the artifact of Iceberg's runtime for it (Spark 4 is built for Scala 2.13,
#: Spark 3.5's pyspark for 2.12). Only lines the tests run on: Iceberg publishes 4.0 too.
SPARK_RUNTIMES: Final = {
    "4.1": "iceberg-spark-runtime-4.1_2.13",
    "3.5": "iceberg-spark-runtime-3.5_2.12",
}
DEFAULT_SPARK: Final = "4.1"
MAVEN_AWS_BUNDLE: Final = f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}"
MAVEN_GCP_BUNDLE: Final = f"org.apache.iceberg:iceberg-gcp-bundle:{ICEBERG_VERSION}"
MAVEN_SQLITE: Final = "org.xerial:sqlite-jdbc:3.54.1.0"
MAVEN_POSTGRESQL: Final = "org.postgresql:postgresql:42.7.14"
# The jar of a runtime directory that stands for a Maven package (Maven's file names).
_PACKAGE_JARS: Final = {
    MAVEN_AWS_BUNDLE: "iceberg-aws-bundle-*.jar",
    MAVEN_GCP_BUNDLE: "iceberg-gcp-bundle-*.jar",
    MAVEN_SQLITE: "sqlite-jdbc-*.jar",
    MAVEN_POSTGRESQL: "postgresql-*.jar",
}
#: JVM options for S3-compatible stores: the AWS SDK v2 computes and checks its checksums
#: only where an S3 API requires them (its default since 2.30 sends CRC headers on every
#: upload, which stores short of S3's newest API refuse).
S3_COMPATIBLE_JAVA_OPTIONS: Final = (
    "-Daws.requestChecksumCalculation=when_required -Daws.responseChecksumValidation=when_required"
)
_JAVA_OPTIONS_KEYS: Final = ("spark.driver.defaultJavaOptions", "spark.executor.defaultJavaOptions")
EXTENSIONS: Final = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
#: Environment variable naming a local runtime directory when --runtime-dir is not given.
RUNTIME_DIR_ENV: Final = "ICESPOOL_SPARK_RUNTIME"
FORMATS: Final = ("spark-submit", "properties", "json")
Format = Literal["spark-submit", "properties", "json"]

# Catalog keys pyiceberg and Iceberg Java spell the same way and mean the same thing: the
# REST client's (only for rest catalogs) and the FileIO/cloud clients' (for every catalog).
_REST_KEYS: Final = frozenset(
    {"credential", "token", "scope", "oauth2-server-uri", "prefix", "audience", "resource"}
)
_REST_PREFIXES: Final = ("header.", "rest.")
_SHARED_PREFIXES: Final = ("s3.", "client.", "gcs.", "adls.")
# Keys only pyiceberg understands (its FileIO choice, its own knobs): never passed on.
_PYICEBERG_ONLY_PREFIXES: Final = ("py-", "downcast-", "pool", "echo", "init_catalog_tables")
_PYICEBERG_ONLY_KEYS: Final = frozenset(
    {
        "s3.connect-timeout",
        "s3.request-timeout",
        "s3.resolve-region",
        # Translated by _s3_java_options.
        "s3.region",
        "s3.force-virtual-addressing",
    }
)
_SECRET_KEYS: Final = frozenset({"credential", "token", "jdbc.password"})


@dataclass(frozen=True)
class JdbcConnection:
    """A JDBC URL and credentials derived from a SQLAlchemy database URI."""

    url: str
    maven_driver: str
    user: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class SparkSettings:
    """Spark properties in a stable order, and the secret keys that were left out."""

    conf: dict[str, str]
    catalog_name: str
    omitted_secrets: tuple[str, ...] = field(default=())


def spark_line(version: str) -> str:
    """The Spark line (``"4.1"``) of a Spark or pyspark version (``"4.1.4"``, ``"4.1"``);
    SparkConfError naming the lines there is a runtime for when it has none."""
    line = ".".join(version.strip().split(".")[:2])
    if line not in SPARK_RUNTIMES:
        raise SparkConfError(
            f"Spark {version.strip()!r}: icespool's Iceberg {ICEBERG_VERSION} runtimes are for "
            f"Spark {' and '.join(SPARK_RUNTIMES)} (pip install 'icespool[spark]' brings "
            f"pyspark {DEFAULT_SPARK})"
        )
    return line


def maven_iceberg_runtime(spark: str = DEFAULT_SPARK) -> str:
    """The Maven coordinates of Iceberg's runtime for the Spark line ``spark``."""
    return f"org.apache.iceberg:{SPARK_RUNTIMES[spark_line(spark)]}:{ICEBERG_VERSION}"


def jdbc_connection(uri: str) -> JdbcConnection:
    """The JDBC form of a pyiceberg SQL catalog's SQLAlchemy ``uri``.

    ``sqlite:////abs/catalog.db`` -> ``jdbc:sqlite:/abs/catalog.db`` (a relative path is
    resolved against the working directory, as the daemon does), and
    ``postgresql+psycopg2://user:pw@host:port/db?sslmode=require`` ->
    ``jdbc:postgresql://host:port/db?sslmode=require`` with user and password apart.
    """
    url = _database_uri(uri)
    backend = url.backend
    if backend == "sqlite":
        database = url.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            raise SparkConfError(
                f"catalog.uri {uri!r}: an in-memory or URI-style SQLite database cannot be "
                "shared with Spark; use a file path, e.g. 'sqlite:////var/lib/icespool/catalog.db'"
            )
        return JdbcConnection(f"jdbc:sqlite:{os.path.abspath(database)}", MAVEN_SQLITE)
    if backend == "postgresql":
        if not url.database:
            raise SparkConfError(f"catalog.uri {uri!r} names no database; add '/dbname'")
        host = url.host or "localhost"
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        port = url.port or 5432
        query = urlencode(url.query, safe="/:")
        suffix = f"?{query}" if query else ""
        return JdbcConnection(
            f"jdbc:postgresql://{host}:{port}/{url.database}{suffix}",
            MAVEN_POSTGRESQL,
            user=url.username,
            password=url.password,
        )
    raise SparkConfError(
        f"catalog.uri {uri!r}: no JDBC mapping for the {backend!r} database; "
        "icespool spark-conf supports SQLite and PostgreSQL SQL catalogs"
    )


# SQLAlchemy's URL grammar (sqlalchemy.engine.url._parse_url), read here without importing
# SQLAlchemy: its import alone is most of spark-conf's start-up time.
_DATABASE_URI: Final = re.compile(
    r"""
    (?P<name>[\w+]+)://
    (?:(?P<username>[^:/]*)(?::(?P<password>[^@]*))?@)?
    (?:(?:\[(?P<ipv6host>[^/?]+)\]|(?P<ipv4host>[^/:?]+))?(?::(?P<port>[^/?]*))?)?
    (?:/(?P<database>[^?]*))?
    (?:\?(?P<query>.*))?
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _DatabaseUri:
    """The parts of a SQLAlchemy database URI that a JDBC URL takes."""

    backend: str  # the dialect: the driver name left of any "+driver"
    host: str | None
    port: int | None
    database: str | None
    username: str | None
    password: str | None
    query: list[tuple[str, str]]


def _database_uri(uri: str) -> _DatabaseUri:
    """``uri`` parsed as SQLAlchemy's ``make_url`` parses it (SparkConfError if it cannot)."""
    match = _DATABASE_URI.match(uri)
    if match is None:
        raise SparkConfError(
            f"catalog.uri {uri!r} is not a database URI: Could not parse SQLAlchemy URL "
            "from given URL string"
        )
    parts = match.groupdict()
    port = parts["port"]
    if port is not None and not port.isdecimal():
        raise SparkConfError(f"catalog.uri {uri!r}: port {port!r} is not a number")

    def unquoted(name: str) -> str | None:
        return None if parts[name] is None else unquote(parts[name])

    # Repeated keys side by side, in the order of their first use (SQLAlchemy's query dict).
    query: dict[str, list[str]] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        query.setdefault(key, []).append(value)

    return _DatabaseUri(
        backend=parts["name"].split("+")[0],
        host=parts["ipv4host"] or parts["ipv6host"],
        port=int(port) if port else None,
        database=unquoted("database"),
        username=unquoted("username"),
        password=unquoted("password"),
        query=[(key, value) for key, values in query.items() for value in values],
    )


def _passed_on(kind: str, key: str) -> bool:
    if key.startswith(_PYICEBERG_ONLY_PREFIXES) or key in _PYICEBERG_ONLY_KEYS:
        return False
    if kind == "rest" and (key in _REST_KEYS or key.startswith(_REST_PREFIXES)):
        return True
    if kind == "glue" and key.startswith("glue.") and key != "glue.region":
        return True
    return key.startswith(_SHARED_PREFIXES)


def catalog_options(catalog: CatalogConfig) -> tuple[dict[str, str], list[str]]:
    """Iceberg catalog options (without the ``spark.sql.catalog.<name>.`` prefix) and the
    Maven packages the catalog needs besides the Iceberg runtime. Secrets included."""
    kind = catalog.type.lower()
    extra = catalog.extra_properties
    options: dict[str, str] = {}
    packages: list[str] = []
    if kind == "sql":
        if catalog.uri is None:  # the config model already insists; keep mypy and users safe
            raise SparkConfError("a sql catalog needs catalog.uri")
        jdbc = jdbc_connection(catalog.uri)
        options["catalog-impl"] = "org.apache.iceberg.jdbc.JdbcCatalog"
        options["uri"] = jdbc.url
        options["jdbc.schema-version"] = "V1"
        # JdbcCatalog's table initialisation leaves a metadata ResultSet open on its pooled
        # connection: on SQLite that read transaction blocks every later commit of the
        # daemon ("database is locked") and pins Spark to a stale view. pyiceberg creates
        # the tables when the daemon starts, so Spark never needs to.
        options["jdbc.init-catalog-tables"] = "false"
        if jdbc.user is not None:
            options["jdbc.user"] = jdbc.user
        if jdbc.password is not None:
            options["jdbc.password"] = jdbc.password
        packages.append(jdbc.maven_driver)
    elif kind == "rest":
        if catalog.uri is None:
            raise SparkConfError("a rest catalog needs catalog.uri (the REST endpoint)")
        options["type"] = "rest"
        options["uri"] = catalog.uri
    elif kind == "hive":
        if catalog.uri is None:
            raise SparkConfError("a hive catalog needs catalog.uri (thrift://metastore:9083)")
        options["type"] = "hive"
        options["uri"] = catalog.uri
    elif kind == "glue":
        options["catalog-impl"] = "org.apache.iceberg.aws.glue.GlueCatalog"
        options["io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        # pyiceberg names the region glue.region; Iceberg's AWS client factory client.region.
        region = extra.get("glue.region") or extra.get("client.region")
        if region:
            options["client.region"] = region
        packages.append(MAVEN_AWS_BUNDLE)
    else:
        raise SparkConfError(
            f"catalog.type {catalog.type!r} has no Spark mapping; "
            "icespool spark-conf supports sql, rest, glue and hive catalogs"
        )
    if catalog.warehouse is not None:
        options["warehouse"] = catalog.warehouse
    # The daemon commits all the time; Spark's table cache would hide its commits from a
    # running session for up to cache.expiration-interval-ms (30 s by default).
    options["cache-enabled"] = "false"
    for key, value in sorted(extra.items()):
        if not _passed_on(kind, key):
            continue
        options.setdefault(key, value)
    # A Glue catalog has S3FileIO and the AWS bundle already.
    if kind != "glue" and _on_s3(catalog):
        options.setdefault("io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
        packages.append(MAVEN_AWS_BUNDLE)
    elif kind != "glue" and _on_gcs(catalog):
        # JdbcCatalog's default HadoopFileIO has no gs:// file system without Hadoop's
        # GCS connector; Iceberg's own GCSFileIO needs only the GCP bundle.
        options.setdefault("io-impl", "org.apache.iceberg.gcp.gcs.GCSFileIO")
        packages.append(MAVEN_GCP_BUNDLE)
    options.update(_s3_java_options(extra))
    return options, packages


def _on_s3(catalog: CatalogConfig) -> bool:
    """Whether the tables are on S3: the warehouse says so, or it names no location (a
    REST catalog's warehouse is often a name: Polaris, Lakekeeper) and S3 is configured."""
    warehouse = catalog.warehouse or ""
    return warehouse.startswith(("s3://", "s3a://")) or (
        "://" not in warehouse and any(key.startswith("s3.") for key in catalog.extra_properties)
    )


def _on_gcs(catalog: CatalogConfig) -> bool:
    """Whether the tables are on Google Cloud Storage (as `_on_s3` decides for S3)."""
    warehouse = catalog.warehouse or ""
    return warehouse.startswith("gs://") or (
        "://" not in warehouse and any(key.startswith("gcs.") for key in catalog.extra_properties)
    )


def _s3_java_options(extra: Mapping[str, str]) -> dict[str, str]:
    """The Iceberg Java spelling of pyiceberg's S3 keys that Java names differently."""
    options: dict[str, str] = {}
    region = extra.get("s3.region")
    if region and "client.region" not in extra:
        options["client.region"] = region
    if "s3.path-style-access" not in extra:
        virtual = extra.get("s3.force-virtual-addressing", "").strip().lower()
        if virtual in ("true", "false"):
            options["s3.path-style-access"] = "false" if virtual == "true" else "true"
        elif extra.get("s3.endpoint"):
            options["s3.path-style-access"] = "true"
    return options


def runtime_jars(runtime_dir: str | os.PathLike[str], spark: str = DEFAULT_SPARK) -> list[Path]:
    """Every jar of a local runtime directory for the Spark line ``spark``, the Iceberg
    runtime first.

    Raises SparkConfError naming the directory when it holds no Iceberg runtime for that
    line (and the other Spark's runtime jar it holds, if any).
    """
    directory = Path(runtime_dir).resolve()
    if not directory.is_dir():
        raise SparkConfError(
            f"Spark runtime directory {str(directory)!r} does not exist; build it with "
            "'make spark-runtime' (deploy/spark/pom.xml's jars from Maven Central)"
        )
    pattern = f"{SPARK_RUNTIMES[spark_line(spark)]}-*.jar"
    runtime = sorted(directory.glob(pattern))
    if not runtime:
        held = sorted(jar.name for jar in directory.glob("iceberg-spark-runtime-*.jar"))
        found = f" (it holds {', '.join(held)}: another Spark's)" if held else ""
        raise SparkConfError(
            f"Spark runtime directory {str(directory)!r} has no {pattern}{found}; build it "
            "with 'make spark-runtime' (deploy/spark/pom.xml's jars from Maven Central)"
        )
    others = sorted(p for p in directory.glob("*.jar") if p not in runtime)
    return [*runtime, *others]


def spark_settings(
    config: Config,
    *,
    catalog_name: str | None = None,
    runtime_dir: str | os.PathLike[str] | None = None,
    include_secrets: bool = False,
    spark: str = DEFAULT_SPARK,
) -> SparkSettings:
    """The Spark properties that read (and write) the daemon's catalog.

    ``catalog_name`` defaults to the daemon's ``[catalog] name``; a SQL catalog cannot be
    renamed (see the module docstring). ``runtime_dir``: a local runtime directory whose
    jars go into ``spark.jars``; None means ``spark.jars.packages`` (Maven). ``spark``: the
    Spark line whose Iceberg runtime is named (or looked for in ``runtime_dir``).
    """
    from icespool.config import is_secret_key, redact_uri

    spark = spark_line(spark)
    catalog = config.catalog
    name = catalog_name or catalog.name
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise SparkConfError(
            f"catalog name {name!r} is not a Spark identifier (letters, digits, '_', not "
            "starting with a digit); pass --catalog-name NAME"
        )
    if catalog.type.lower() == "sql" and name != catalog.name:
        raise SparkConfError(
            f"a sql catalog is seen by Spark only under the daemon's catalog name "
            f"{catalog.name!r} (Iceberg's JdbcCatalog and pyiceberg's SqlCatalog both key the "
            f"iceberg_tables rows by it), not {name!r}; drop --catalog-name or rename "
            "[catalog] name"
        )
    options, packages = catalog_options(catalog)
    conf: dict[str, str] = {}
    if runtime_dir is not None:
        jars = runtime_jars(runtime_dir, spark)
        conf["spark.jars"] = ",".join(str(jar) for jar in jars)
        missing = [package for package in packages if not _held(package, jars)]
        if missing:
            conf["spark.jars.packages"] = ",".join(missing)
    else:
        conf["spark.jars.packages"] = ",".join([maven_iceberg_runtime(spark), *packages])
    if catalog.extra_properties.get("s3.endpoint") and (
        catalog.type.lower() == "glue" or _on_s3(catalog)
    ):
        for key in _JAVA_OPTIONS_KEYS:
            conf[key] = S3_COMPATIBLE_JAVA_OPTIONS
    conf["spark.sql.extensions"] = EXTENSIONS
    prefix = f"spark.sql.catalog.{name}"
    conf[prefix] = "org.apache.iceberg.spark.SparkCatalog"
    omitted: list[str] = []
    for key, value in options.items():
        # A URI with a password (the REST uri, an S3 proxy) is one too: check-config
        # redacts it, so printing it here would be the one place it leaks.
        secret = key in _SECRET_KEYS or is_secret_key(key) or redact_uri(value) != value
        if secret and not include_secrets:
            omitted.append(f"{prefix}.{key}")
            continue
        conf[f"{prefix}.{key}"] = value
    return SparkSettings(conf=conf, catalog_name=name, omitted_secrets=tuple(omitted))


def _held(package: str, jars: Sequence[Path]) -> bool:
    """Whether a runtime directory's ``jars`` hold the Maven ``package``."""
    pattern = _PACKAGE_JARS.get(package)
    return pattern is not None and any(jar.match(pattern) for jar in jars)


def render(conf: Mapping[str, str], fmt: Format) -> str:
    """``spark-submit``: ``--conf k=v`` lines (shell-quoted where needed); ``properties``:
    spark-defaults.conf lines; ``json``: one object."""
    if fmt == "json":
        return json.dumps(dict(conf), indent=2) + "\n"
    if fmt == "properties":
        return "".join(f"{key} {value}\n" for key, value in conf.items())
    if fmt == "spark-submit":
        return "".join(f"--conf {shlex.quote(f'{key}={value}')}\n" for key, value in conf.items())
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
