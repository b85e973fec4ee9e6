"""Partition transforms: icespool's pyarrow.compute ones beside pyiceberg-core's (Rust).

Run: PYTHONPATH=. .venv/bin/python tests/bench/bench_transforms.py [--rows N]

pyiceberg-core is not a dependency: install it into a copy of the virtualenv to compare
(``pip install pyiceberg-core==0.11.0``). Without it, only icespool's times are printed.

For each transform and source type, on ``--rows`` values (1 % nulls, fixed seed): the best
of 3 runs of ``partition_transform`` and of ``pyiceberg_core.transform``, their ratio
(core / ours: above 1 means ours is faster), and whether the results are equal value for
value (the same nulls, the same numbers; ``type`` notes where only the Arrow type differs).
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    DateType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from icespool.iceberg import partition_transform

SEED = 20_251_129
US_2000 = 946_684_800_000_000  # 2000-01-01 in microseconds
US_SPAN = 40 * 365 * 86_400 * 1_000_000  # 40 years


def _columns(rows: int) -> dict[str, tuple[IcebergType, pa.Array]]:
    rng = random.Random(SEED)

    def values(make: Callable[[], Any]) -> list[Any]:
        return [None if rng.random() < 0.01 else make() for _ in range(rows)]

    micros = values(lambda: US_2000 - US_SPAN // 2 + rng.randrange(US_SPAN))
    return {
        "long": (LongType(), pa.array(values(lambda: rng.getrandbits(64) - 2**63), pa.int64())),
        "int": (IntegerType(), pa.array(values(lambda: rng.getrandbits(32) - 2**31), pa.int32())),
        "date": (
            DateType(),
            pa.array([m // 86_400_000_000 if m else m for m in micros], pa.int32()).cast(
                pa.date32()
            ),
        ),
        "timestamp": (TimestampType(), pa.array(micros, pa.timestamp("us"))),
        "timestamptz": (TimestamptzType(), pa.array(micros, pa.timestamp("us", tz="UTC"))),
        "string": (
            StringType(),
            pa.array(values(lambda: f"user-{rng.randrange(100_000):06d}-événement"), pa.string()),
        ),
    }


def _cases() -> list[
    tuple[str, Transform[Any, Any], list[str], Callable[[Any, pa.Array], pa.Array]]
]:
    return [
        (
            "bucket[16]",
            BucketTransform(16),
            ["long", "int", "date", "timestamp", "string"],
            lambda c, a: c.bucket(a, 16),
        ),
        (
            "truncate[10]",
            TruncateTransform(10),
            ["long", "int", "string"],
            lambda c, a: c.truncate(a, 10),
        ),
        ("year", YearTransform(), ["date", "timestamp", "timestamptz"], lambda c, a: c.year(a)),
        ("month", MonthTransform(), ["date", "timestamp", "timestamptz"], lambda c, a: c.month(a)),
        ("day", DayTransform(), ["date", "timestamp", "timestamptz"], lambda c, a: c.day(a)),
        ("hour", HourTransform(), ["timestamp", "timestamptz"], lambda c, a: c.hour(a)),
    ]


def _best(run: Callable[[], pa.Array]) -> tuple[float, pa.Array]:
    best, result = float("inf"), None
    for _ in range(3):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def _compare(ours: pa.Array, theirs: pa.Array) -> str:
    if isinstance(theirs, pa.ChunkedArray):
        theirs = theirs.combine_chunks()
    if ours.equals(theirs):
        return "equal"
    try:
        cast = theirs.cast(ours.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return f"DIFFERENT (type {theirs.type} vs {ours.type})"
    if ours.equals(cast):
        return f"equal values (type {theirs.type} vs ours {ours.type})"
    differing = sum(1 for a, b in zip(ours.to_pylist(), cast.to_pylist(), strict=True) if a != b)
    return f"DIFFERENT in {differing} rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    try:
        from pyiceberg_core import transform as core
    except ImportError:
        core = None
        print("pyiceberg-core is not installed: icespool's transforms only")
    columns = _columns(args.rows)
    print(f"{args.rows:,} rows per column, best of 3; ratio = core time / icespool time")
    print(
        f"{'transform':<13} {'source':<12} {'icespool ms':>11} {'core ms':>9} {'ratio':>6}  result"
    )
    for name, transform, sources, call in _cases():
        for source in sources:
            iceberg_type, values = columns[source]
            ours_s, ours = _best(
                functools.partial(partition_transform, transform, iceberg_type, values)
            )
            if core is None:
                print(f"{name:<13} {source:<12} {ours_s * 1000:>11.1f}")
                continue
            try:
                core_s, theirs = _best(functools.partial(call, core, values))
            except Exception as exc:  # the Rust side refuses a type: say which
                print(
                    f"{name:<13} {source:<12} {ours_s * 1000:>11.1f} {'-':>9} {'-':>6}  "
                    f"core: {type(exc).__name__}: {exc}"
                )
                continue
            verdict = _compare(ours, theirs)
            print(
                f"{name:<13} {source:<12} {ours_s * 1000:>11.1f} {core_s * 1000:>9.1f} "
                f"{core_s / ours_s:>6.2f}  {verdict}"
            )


if __name__ == "__main__":
    main()
