"""Check a local Iceberg Spark runtime: a real local SparkSession reads a pyiceberg table.

    python deploy/spark/check_runtime.py .spark-runtime     # `make spark-runtime` runs it

pyiceberg's SqlCatalog (SQLite) writes a one-row table under a temporary directory; a
SparkSession built from ``icespool spark-conf``'s settings with the directory's jars
(``spark.jars``) reads it back through Iceberg's JdbcCatalog. Exit status 0 when Spark
read exactly that row; otherwise 1, with what failed (a missing class names the jar).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "read_probe_table"]

_EXPECTED = [(1, "icespool")]


def read_probe_table(runtime_dir: Path) -> list[tuple[Any, ...]]:
    """The rows a local SparkSession on ``runtime_dir``'s jars reads from a one-row table
    pyiceberg wrote (SparkConfError when the directory holds no Iceberg runtime)."""
    # Imported here: pyarrow, pyiceberg and pyspark take seconds to import.
    import pyarrow as pa

    from icespool.config import validate_config
    from icespool.iceberg import load_catalog
    from icespool.spark.conf import runtime_jars
    from icespool.spark.session import spark_session

    runtime_jars(runtime_dir)  # names the directory and how to build it when it is not one
    with tempfile.TemporaryDirectory(prefix="icespool-spark-probe-") as tmp:
        catalog_props = {
            "name": "icespool_probe",
            "type": "sql",
            "uri": f"sqlite:///{tmp}/catalog.db",
            "warehouse": Path(tmp, "warehouse").as_uri(),
        }
        catalog = load_catalog("icespool_probe", catalog_props)
        try:
            catalog.create_namespace("probe")
            schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
            table = catalog.create_table("probe.t", schema=schema)
            table.append(pa.table({"id": [1], "v": ["icespool"]}, schema=schema))
            config = validate_config({"catalog": catalog_props, "spool": {"dir": f"{tmp}/spool"}})
            spark = spark_session(
                config,
                runtime_dir=runtime_dir,
                app_name="icespool-runtime-check",
                master="local[1]",
                conf={
                    "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "false",
                    "spark.sql.shuffle.partitions": "1",
                },
            )
            try:
                rows = spark.sql("SELECT id, v FROM icespool_probe.probe.t").collect()
                return [tuple(row) for row in rows]
            finally:
                spark.stop()
        finally:
            engine = getattr(catalog, "engine", None)
            if engine is not None:
                engine.dispose()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python deploy/spark/check_runtime.py RUNTIME_DIR", file=sys.stderr)
        return 2
    runtime_dir = Path(argv[0]).resolve()
    started = time.monotonic()
    try:
        rows = read_probe_table(runtime_dir)
    except Exception as exc:
        print(
            f"error: Spark could not read a pyiceberg table through the runtime in "
            f"{runtime_dir}: {type(exc).__name__}: {str(exc)[:1500]}",
            file=sys.stderr,
        )
        return 1
    if rows != _EXPECTED:
        print(
            f"error: Spark read {rows!r} from the probe table, not {_EXPECTED!r}", file=sys.stderr
        )
        return 1
    print(f"spark-runtime: Spark read the probe table through {runtime_dir} "
          f"in {time.monotonic() - started:.1f}s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
