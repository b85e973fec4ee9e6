"""Run Spark SQL queries in the Spark 3.5 venv (which holds pyspark alone, so nothing of
icespool is imported here): the request as JSON on stdin, the results as JSON on stdout.

    stdin:  {"conf": {"spark.jars": "...", ...}, "queries": {"name": "SELECT ...", ...}}
    stdout: {"spark": "3.5.9", "results": {"name": [[column, ...], ...], ...}}

Spark's own logging goes to stderr. Values JSON has no type for are written as strings.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession


def main() -> int:
    request = json.load(sys.stdin)
    builder = SparkSession.builder.master("local[1]").appName("icespool-spark35")
    for key, value in request["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        results = {
            name: [list(row) for row in spark.sql(sql).collect()]
            for name, sql in request["queries"].items()
        }
        json.dump({"spark": spark.version, "results": results}, sys.stdout, default=str)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
