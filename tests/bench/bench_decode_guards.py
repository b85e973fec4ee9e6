"""What the poison guards cost NDJSON decode (issue 11): rows/s with and without them.

Run: .venv/bin/python tests/bench/bench_decode_guards.py [--rows N] [--trials N]

Two bodies of 10,000-row requests, decoded by ``icespool.decode.decode_ndjson``:

- ``flat``: the benchmark's 8-column event (163 B, DESIGN.md's reference record);
- ``nested``: the same plus a list<string>, a struct<string, date> and a
  map<string, string> column (every guard has work: depth, UTF-8 of nested strings,
  temporal range of a nested date).

Each is decoded with the guards as shipped and with the three of them replaced by
no-ops (the decode as it was before), interleaved, best of ``--trials``, in one run
on one machine. The guard's own cost (``too_deep_lines``) is shown on its own too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from _events import JSON_SCHEMA, ndjson_body

import icespool.decode as decode
from icespool.decode import _checks, _ndjson
from icespool.decode._nesting import DEFAULT_MAX_DEPTH, too_deep_lines

REQUEST_ROWS = 10_000

NESTED_SCHEMA = pa.schema(
    [
        *JSON_SCHEMA,
        ("tags", pa.list_(pa.string())),
        ("place", pa.struct([("city", pa.string()), ("since", pa.date32())])),
        ("attrs", pa.map_(pa.string(), pa.string())),
    ]
)


def _nested_body(seed: int) -> bytes:
    flat = ndjson_body(REQUEST_ROWS, seed).splitlines()
    extra = {
        "tags": ["a", "bé", "c"],
        "place": {"city": "Zürich", "since": "2020-02-29"},
        "attrs": [{"key": "k", "value": "v"}, {"key": "ключ", "value": "值"}],
    }
    tail = json.dumps(extra, ensure_ascii=False)[1:].encode()
    return b"\n".join(line[:-1] + b"," + tail for line in flat) + b"\n"


@contextmanager
def _unguarded() -> Iterator[None]:
    # Each guard is patched where the decoder looks it up.
    saved = (_ndjson.check_depth, _checks.find_out_of_range, _checks._check_nested_utf8)
    _ndjson.check_depth = lambda body, limit: None  # type: ignore[assignment]
    _checks.find_out_of_range = lambda values: None  # type: ignore[assignment]
    _checks._check_nested_utf8 = lambda name, values: None  # type: ignore[assignment]
    try:
        yield
    finally:
        _ndjson.check_depth, _checks.find_out_of_range, _checks._check_nested_utf8 = saved


def _rate(run: Callable[[bytes], Any], bodies: list[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        run(body)
    return len(bodies) * REQUEST_ROWS / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    requests = max(1, args.rows // REQUEST_ROWS)
    cases = {
        "flat": (JSON_SCHEMA, [ndjson_body(REQUEST_ROWS, i) for i in range(requests)]),
        "nested": (NESTED_SCHEMA, [_nested_body(i) for i in range(requests)]),
    }
    print(f"{requests} requests x {REQUEST_ROWS} rows, best of {args.trials}")
    print(f"{'body':8} {'B/row':>6} {'before':>12} {'after':>12} {'change':>8} {'guard':>14}")
    for name, (schema, bodies) in cases.items():

        def decode_ndjson(body: bytes, schema: pa.Schema = schema) -> Any:
            return decode.decode_ndjson(body, schema)

        before = after = alone = 0.0
        for _ in range(args.trials):
            with _unguarded():
                before = max(before, _rate(decode_ndjson, bodies))
            after = max(after, _rate(decode_ndjson, bodies))
            alone = max(alone, _rate(lambda b: too_deep_lines(b, DEFAULT_MAX_DEPTH), bodies))
        size = len(bodies[0]) / REQUEST_ROWS
        print(
            f"{name:8} {size:6.0f} {before:12,.0f} {after:12,.0f} "
            f"{(after / before - 1) * 100:+7.1f}% {alone:14,.0f}"
        )


if __name__ == "__main__":
    main()
