"""Assemble and check a local Iceberg Spark runtime for pyspark 3.5, from the package registries.

    python -m daemon.spark_runtime --dir .spark-runtime      # what `make spark-runtime` runs

The directory ends up with (every jar of it goes into ``spark.jars``):

- ``iceberg-spark-runtime-3.5_2.12-<v>.jar``, taken from the PyPI wheel
  ``snowpark-connect-deps-iceberg`` (``pip download``, only that jar is unpacked), or from
  ``--iceberg-jar`` / ``--wheel`` when there is no network;
- ``iceberg-shaded-jackson-*.jar``: that copy of the runtime lacks Iceberg's relocated
  Jackson (``org.apache.iceberg.shaded.com.fasterxml.jackson``), so pyspark's own
  jackson-core/databind/annotations jars are relocated into that package with jarjar
  (Debian ``libjarjar-java``). Skipped when the runtime jar has them (Maven Central's does);
- the SQLite and PostgreSQL JDBC drivers (Debian ``libxerial-sqlite-jdbc-java``,
  ``libpostgresql-jdbc-java``, or ``--jdbc-jar``);
- optionally ``iceberg-aws-bundle-<v>.jar`` (``--aws-bundle``), the AWS SDK v2 that Iceberg's
  ``S3FileIO`` needs to read ``s3://`` tables (REST or Glue catalogs on S3). No registry
  reachable here carries it (not PyPI's ``snowpark-connect-deps-*``, not Debian, not npm):
  download ``org.apache.iceberg:iceberg-aws-bundle:<v>`` from Maven Central and pass it
  once; later builds keep it. Without it ``icespool spark-conf`` names it in
  ``spark.jars.packages`` for Spark to fetch.

Then a real local SparkSession reads a table that pyiceberg's SqlCatalog wrote. Any
missing piece fails with a message naming it and how to get it. A second run with the same
inputs does nothing (a stamp records what was verified), so ``make test`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from daemon.errors import SparkConfError
from daemon.spark_conf import ICEBERG_VERSION

__all__ = [
    "AWS_BUNDLE_JAR",
    "DEFAULT_RUNTIME_DIR",
    "ICEBERG_WHEEL",
    "build_runtime",
    "check_runtime_files",
    "main",
    "verify_runtime",
]

DEFAULT_RUNTIME_DIR: Final = ".spark-runtime"
#: The PyPI wheel whose ``jars/`` holds the Iceberg Spark runtime (pinned: its jar is).
ICEBERG_WHEEL: Final = "snowpark-connect-deps-iceberg==1.0.3"
RUNTIME_JAR: Final = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
_WHEEL_MEMBER: Final = f"snowpark_connect_deps_iceberg/jars/{RUNTIME_JAR}"
_JACKSON: Final = ("jackson-core", "jackson-databind", "jackson-annotations")
_JARJAR_RULE: Final = "rule com.fasterxml.** org.apache.iceberg.shaded.com.fasterxml.@1\n"
_JARJAR_JARS: Final = ("/usr/share/java/jarjar.jar", "/usr/share/java/jarjar-1.4.jar")
_STAMP: Final = ".verified.json"

# A class each piece must provide, and where to get the piece when it is missing.
_SHADED: Final = "org/apache/iceberg/shaded/com/fasterxml/jackson"
_PIECES: Final = (
    (
        "the Iceberg Spark runtime",
        "org/apache/iceberg/spark/SparkCatalog.class",
        f"run 'make spark-runtime' (pip download {ICEBERG_WHEEL}) or pass --iceberg-jar",
    ),
    (
        "Iceberg's relocated jackson-core",
        f"{_SHADED}/core/JsonFactory.class",
        "relocate pyspark's jackson-core with jarjar (Debian libjarjar-java)",
    ),
    (
        "Iceberg's relocated jackson-databind",
        f"{_SHADED}/databind/ObjectMapper.class",
        "relocate pyspark's jackson-databind with jarjar (Debian libjarjar-java)",
    ),
    (
        "Iceberg's relocated jackson-annotations",
        f"{_SHADED}/annotation/JsonProperty.class",
        "relocate pyspark's jackson-annotations with jarjar (Debian libjarjar-java)",
    ),
    (
        "the SQLite JDBC driver",
        "org/sqlite/JDBC.class",
        "apt-get install libxerial-sqlite-jdbc-java, or pass --jdbc-jar",
    ),
    (
        "the PostgreSQL JDBC driver",
        "org/postgresql/Driver.class",
        "apt-get install libpostgresql-jdbc-java, or pass --jdbc-jar",
    ),
)
AWS_BUNDLE_JAR: Final = f"iceberg-aws-bundle-{ICEBERG_VERSION}.jar"
_AWS_BUNDLE_MARKER: Final = "software/amazon/awssdk/services/s3/S3Client.class"
_DEBIAN_DRIVERS: Final = (
    ("/usr/share/java/sqlite-jdbc.jar", "libxerial-sqlite-jdbc-java"),
    ("/usr/share/java/postgresql.jar", "libpostgresql-jdbc-java"),
)


def _say(message: str) -> None:
    print(f"spark-runtime: {message}", file=sys.stderr, flush=True)


def _pyspark_jars() -> tuple[Path, str]:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkConfError(
            "pyspark is not installed in this interpreter "
            f"({sys.executable}); install it with \"pip install 'icespool[spark]'\""
        )
    version = metadata.version("pyspark")
    if not version.startswith("3.5."):
        raise SparkConfError(
            f"pyspark {version} is installed, but the Iceberg runtime is built for Spark 3.5; "
            "install pyspark 3.5 (\"pip install 'icespool[spark]'\")"
        )
    jars = Path(spec.origin).parent / "jars"
    if not jars.is_dir():
        raise SparkConfError(f"pyspark has no jars directory at {jars}; reinstall pyspark")
    return jars, version


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise SparkConfError(
            "Java is not installed (no 'java' on PATH, no $JAVA_HOME); Spark 3.5 needs Java 17: "
            "apt-get install openjdk-17-jre-headless"
        )
    return java


def _jar_names(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as jar:
        return set(jar.namelist())


def _atomic_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _fetch_runtime_jar(directory: Path, wheel: Path | None, iceberg_jar: Path | None) -> Path:
    target = directory / RUNTIME_JAR
    if target.exists():
        return target
    if iceberg_jar is not None:
        _say(f"using {iceberg_jar}")
        _atomic_copy(iceberg_jar, target)
        return target
    with tempfile.TemporaryDirectory(prefix="icespool-wheel-") as tmp:
        if wheel is None:
            _say(f"pip download {ICEBERG_WHEEL} (about 77 MB, only one jar is kept)")
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--dest",
                    tmp,
                    ICEBERG_WHEEL,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            wheels = sorted(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or not wheels:
                raise SparkConfError(
                    f"cannot download {ICEBERG_WHEEL} from PyPI (pip said: "
                    f"{proc.stderr.strip()[-400:] or proc.returncode}); without network, "
                    "pass --wheel PATH (that wheel) or --iceberg-jar PATH "
                    f"({RUNTIME_JAR}, e.g. from Maven Central)"
                )
            wheel = wheels[0]
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(_WHEEL_MEMBER) as member:
                tmp_target = target.with_name(f".{target.name}.tmp")
                with open(tmp_target, "wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)
                os.replace(tmp_target, target)
        except KeyError:
            raise SparkConfError(
                f"{wheel} has no {_WHEEL_MEMBER}; use {ICEBERG_WHEEL} or pass --iceberg-jar"
            ) from None
    return target


def _strip_for_relocation(source: Path, target: Path) -> None:
    """Copy a jar without what jarjar mishandles or what must not be relocated.

    Multi-release classes (META-INF/versions/N/...) would be relocated onto the same
    names as the base classes ("Duplicate jar entries"), and a relocated ServiceLoader
    file would register shaded classes under Jackson's unshaded service name.
    """
    skipped = ("META-INF/versions/", "META-INF/services/", "META-INF/maven/")
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not info.filename.startswith(skipped):
                dst.writestr(info, src.read(info))


def _relocate_jackson(directory: Path, pyspark_jars: Path) -> list[Path]:
    jarjar = next((Path(p) for p in _JARJAR_JARS if Path(p).exists()), None)
    outputs: list[Path] = []
    for artifact in _JACKSON:
        found = sorted(pyspark_jars.glob(f"{artifact}-2.*.jar"))
        if not found:
            raise SparkConfError(
                f"pyspark's {artifact} jar is missing from {pyspark_jars}; reinstall pyspark"
            )
        source = found[-1]
        target = directory / f"iceberg-shaded-{source.name}"
        outputs.append(target)
        if target.exists():
            continue
        if jarjar is None:
            raise SparkConfError(
                "jarjar is not installed (needed to relocate pyspark's Jackson into Iceberg's "
                "shaded package): apt-get install libjarjar-java"
            )
        _say(f"relocating {source.name} into org.apache.iceberg.shaded")
        with tempfile.TemporaryDirectory(prefix="icespool-jarjar-") as tmp:
            rules = Path(tmp) / "rules.txt"
            rules.write_text(_JARJAR_RULE)
            stripped = Path(tmp) / source.name
            _strip_for_relocation(source, stripped)
            relocated = Path(tmp) / f"relocated-{source.name}"
            proc = subprocess.run(
                [
                    _java(),
                    "-jar",
                    str(jarjar),
                    "process",
                    str(rules),
                    str(stripped),
                    str(relocated),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0 or not relocated.exists():
                raise SparkConfError(
                    f"jarjar failed to relocate {source.name}: {proc.stdout}{proc.stderr}".strip()
                )
            _atomic_copy(relocated, target)
    return outputs


def _copy_drivers(directory: Path, jdbc_jars: Sequence[Path]) -> list[Path]:
    sources: list[Path] = list(jdbc_jars)
    if not sources:
        for path, package in _DEBIAN_DRIVERS:
            if not Path(path).exists():
                raise SparkConfError(
                    f"{path} is missing: apt-get install {package} (or pass --jdbc-jar PATH)"
                )
            sources.append(Path(path).resolve())
    outputs = []
    for source in sources:
        target = directory / source.name
        outputs.append(target)
        if not target.exists():
            _say(f"adding JDBC driver {source.name}")
            _atomic_copy(source, target)
    return outputs


def _add_aws_bundle(directory: Path, aws_bundle: Path | None) -> list[Path]:
    """The AWS bundle jar: ``aws_bundle`` copied in, else the one an earlier build added."""
    target = directory / AWS_BUNDLE_JAR
    if aws_bundle is None:
        return [target] if target.exists() else []
    try:
        names = _jar_names(aws_bundle)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SparkConfError(f"--aws-bundle {aws_bundle}: not a readable jar ({exc})") from None
    if _AWS_BUNDLE_MARKER not in names:
        raise SparkConfError(
            f"--aws-bundle {aws_bundle} has no {_AWS_BUNDLE_MARKER}; pass "
            f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION} from Maven Central"
        )
    _say(f"adding the AWS bundle {aws_bundle.name} as {AWS_BUNDLE_JAR}")
    _atomic_copy(aws_bundle, target)
    return [target]


def build_runtime(
    directory: Path,
    *,
    wheel: Path | None = None,
    iceberg_jar: Path | None = None,
    jdbc_jars: Sequence[Path] = (),
    aws_bundle: Path | None = None,
) -> list[Path]:
    """Put every jar of the runtime into ``directory`` (kept ones are not rebuilt); returns
    them. Jars of an earlier build that are no longer part of it are removed (an AWS bundle
    added earlier stays: no registry here can bring it back)."""
    pyspark_jars, _ = _pyspark_jars()
    directory.mkdir(parents=True, exist_ok=True)
    runtime = _fetch_runtime_jar(directory, wheel, iceberg_jar)
    jars = [runtime]
    if f"{_SHADED}/databind/ObjectMapper.class" not in _jar_names(runtime):
        jars += _relocate_jackson(directory, pyspark_jars)
    jars += _copy_drivers(directory, jdbc_jars)
    jars += _add_aws_bundle(directory, aws_bundle)
    for stale in sorted(set(directory.glob("*.jar")) - set(jars)):
        _say(f"removing {stale.name} (not part of this build)")
        stale.unlink()
    return jars


def check_runtime_files(directory: Path) -> list[Path]:
    """Check without starting Spark that ``directory`` holds every piece; returns its jars.

    Raises SparkConfError naming the first missing piece and how to get it.
    """
    if not directory.is_dir():
        raise SparkConfError(
            f"Spark runtime directory {str(directory)!r} does not exist; build it with "
            "'make spark-runtime' (or 'python -m daemon.spark_runtime --dir DIR')"
        )
    jars = sorted(directory.glob("*.jar"))
    names: set[str] = set()
    for jar in jars:
        try:
            names |= _jar_names(jar)
        except zipfile.BadZipFile:
            raise SparkConfError(
                f"{jar} is not a valid jar; delete it and run 'make spark-runtime' again"
            ) from None
    for piece, marker, remedy in _PIECES:
        if marker not in names:
            raise SparkConfError(
                f"Spark runtime {directory} lacks {piece} (no {marker} in its jars): {remedy}"
            )
    return jars


def _fingerprint(jars: Sequence[Path], pyspark_version: str) -> str:
    digest = hashlib.sha256(f"pyspark {pyspark_version}\n".encode())
    for jar in jars:
        stat = jar.stat()
        digest.update(f"{jar.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def verify_runtime(directory: Path, *, force: bool = False) -> None:
    """Check the files, then let a real local SparkSession read a pyiceberg-written table.

    The outcome is stamped: with the same jars and pyspark, later calls return at once.
    """
    jars = check_runtime_files(directory)
    _, pyspark_version = _pyspark_jars()
    _java()
    stamp = directory / _STAMP
    fingerprint = _fingerprint(jars, pyspark_version)
    if not force and stamp.exists():
        with contextlib.suppress(ValueError, OSError):
            if json.loads(stamp.read_text()).get("fingerprint") == fingerprint:
                _say(f"{directory} verified earlier, nothing to do")
                return
    started = time.monotonic()
    _say("starting a local SparkSession to read a pyiceberg table through the runtime")
    rows = _read_probe_table(directory)
    if rows != [(1, "icespool")]:
        raise SparkConfError(
            f"Spark read {rows!r} from the probe table instead of [(1, 'icespool')]"
        )
    stamp.write_text(json.dumps({"fingerprint": fingerprint, "pyspark": pyspark_version}) + "\n")
    _say(f"ok: Spark read the probe table through {directory} in {time.monotonic() - started:.1f}s")


def _read_probe_table(directory: Path) -> list[tuple[Any, ...]]:
    # Imported here: pyarrow/pyiceberg are heavy and only the probe needs them.
    import pyarrow as pa

    from daemon.config import validate_config
    from daemon.iceberg import load_catalog
    from daemon.spark_session import spark_session

    with tempfile.TemporaryDirectory(prefix="icespool-spark-probe-") as tmp:
        catalog_props = {
            "name": "icespool_probe",
            "type": "sql",
            "uri": f"sqlite:///{tmp}/catalog.db",
            "warehouse": Path(tmp, "warehouse").as_uri(),
        }
        catalog = load_catalog("icespool_probe", catalog_props)
        catalog.create_namespace("probe")
        table = catalog.create_table(
            "probe.t", schema=pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
        )
        table.append(pa.table({"id": [1], "v": ["icespool"]}))
        config = validate_config({"catalog": catalog_props, "spool": {"dir": f"{tmp}/spool"}})
        try:
            spark = spark_session(
                config,
                runtime_dir=directory,
                app_name="icespool-runtime-check",
                master="local[1]",
                conf={
                    "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "false",
                    "spark.sql.shuffle.partitions": "1",
                },
            )
        except Exception as exc:
            raise SparkConfError(
                f"Spark did not start with the runtime in {directory} ({type(exc).__name__}: "
                f"{str(exc)[:500]}); check Java 17 and pyspark 3.5"
            ) from exc
        try:
            rows = spark.sql("SELECT id, v FROM icespool_probe.probe.t").collect()
            return [tuple(row) for row in rows]
        except Exception as exc:
            text = str(exc)
            missing = next(
                (
                    piece
                    for piece, marker, _ in _PIECES
                    if marker.removesuffix(".class").replace("/", ".") in text
                ),
                None,
            )
            hint = f" ({missing} is missing)" if missing else ""
            raise SparkConfError(
                f"Spark could not read a table through the runtime in {directory}{hint}: "
                f"{type(exc).__name__}: {text[:800]}"
            ) from exc
        finally:
            spark.stop()
            engine = getattr(catalog, "engine", None)
            if engine is not None:
                engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.spark_runtime",
        description="Assemble and check a local Iceberg Spark runtime for pyspark 3.5.",
    )
    parser.add_argument("--dir", default=DEFAULT_RUNTIME_DIR, help="runtime directory")
    parser.add_argument("--wheel", type=Path, help=f"a downloaded {ICEBERG_WHEEL} wheel")
    parser.add_argument("--iceberg-jar", type=Path, help=f"a {RUNTIME_JAR} to use as is")
    parser.add_argument(
        "--jdbc-jar",
        type=Path,
        action="append",
        default=[],
        help="a JDBC driver jar (repeatable; default: Debian's SQLite and PostgreSQL drivers)",
    )
    parser.add_argument(
        "--aws-bundle",
        type=Path,
        help=f"{AWS_BUNDLE_JAR} (Maven Central) for reading s3:// tables; kept by later builds",
    )
    parser.add_argument("--check-only", action="store_true", help="check, do not build")
    parser.add_argument("--force", action="store_true", help="re-run the Spark check")
    args = parser.parse_args(argv)
    directory = Path(args.dir).resolve()
    try:
        if not args.check_only:
            build_runtime(
                directory,
                wheel=args.wheel,
                iceberg_jar=args.iceberg_jar,
                jdbc_jars=args.jdbc_jar,
                aws_bundle=args.aws_bundle,
            )
        verify_runtime(directory, force=args.force)
    except SparkConfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
