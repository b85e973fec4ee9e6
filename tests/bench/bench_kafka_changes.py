"""What decoding Kafka changes costs beside decoding the same rows as plain records.

Run: .venv/bin/python tests/bench/bench_kafka_changes.py [--records N] [--trials N]

One fetch of ``--records`` records of the benchmark's 8-column event (`_events`),
decoded for one table keyed by ``event_id``:

- ``rows``: the events as plain JSON values through `JsonValues` (an append
  table's way: the baseline);
- ``debezium``: the same events as Debezium changes (``{"op":"u","before":{...},
  "after":{...},"source":{...},"ts_ms":..}``, every 10th a delete, a fifth of them in
  Kafka Connect's schema envelope) through `decode_changes`;
- ``keyed``: the events as rows with string Kafka keys, every 10th a tombstone.

Best of ``--trials``, interleaved, one run on one machine; records/s and the ratio
to the baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import pyarrow as pa
from _events import JSON_SCHEMA

from icespool.decode import JsonOptions, JsonValues, RecordArrays, Target
from icespool.decode._keyed import decode_changes
from icespool.decode._keyed_rows import json_envelopes, json_keys, string_keys

KEY = ("event_id",)


def _event(i: int) -> dict[str, object]:
    return {
        "event_id": i % 50_000,
        "ts": f"2024-05-01T12:{(i // 60) % 60:02d}:{i % 60:02d}Z",
        "kind": ("click", "view", "buy", "scroll")[i % 4],
        "user": f"user-{i % 9973}",
        "value": i * 0.25,
        "count": i % 1000,
        "ok": i % 2 == 0,
        "payload": f"p{i:012d}",
    }


def _debezium(i: int) -> bytes:
    row = _event(i)
    source = {"version": "2.7.0.Final", "connector": "postgresql", "db": "shop", "lsn": i}
    if i % 10 == 0:
        change: dict[str, object] = {"op": "d", "before": row, "after": None, "source": source}
    else:
        change = {"op": "u", "before": {"event_id": row["event_id"]}, "after": row}
        change |= {"source": source, "ts_ms": 1_714_566_896_000 + i}
    if i % 5 == 0:
        return json.dumps({"schema": {"type": "struct"}, "payload": change}).encode()
    return json.dumps(change).encode()


def _best(trials: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(trials):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    n = args.records
    options = JsonOptions()
    rows = [json.dumps(_event(i)).encode() for i in range(n)]
    keys = [str(i % 50_000).encode() for i in range(n)]
    fetch = RecordArrays(rows, keys)
    changes = pa.array([_debezium(i) for i in range(n)], pa.binary())
    json_key_array = pa.array([b'{"event_id":' + k + b"}" for k in keys], pa.binary())
    keyed = pa.array([None if i % 10 == 0 else v for i, v in enumerate(rows)], pa.binary())
    string_key_array = pa.array(keys, pa.binary())

    def plain() -> None:
        decoded = JsonValues().decode(fetch, Target("t", JSON_SCHEMA, options=options))
        assert decoded.batch is not None and decoded.batch.num_rows == n, decoded.dead[:1]

    def debezium() -> None:
        decoded = decode_changes(
            changes,
            json_key_array,
            JSON_SCHEMA,
            KEY,
            mode="debezium",
            envelopes=json_envelopes(options, ignore_unknown=True),
            key_rows=json_keys(KEY, JSON_SCHEMA, options),
        )
        assert decoded.batch is not None and decoded.batch.num_rows == n, decoded.dead[:1]

    def keyed_rows() -> None:
        decoded = decode_changes(
            keyed,
            string_key_array,
            JSON_SCHEMA,
            KEY,
            mode="keyed",
            envelopes=json_envelopes(options, ignore_unknown=False),
            key_rows=string_keys(KEY, JSON_SCHEMA),
        )
        assert decoded.batch is not None and decoded.batch.num_rows == n, decoded.dead[:1]

    runs = {"rows (baseline)": plain, "debezium": debezium, "keyed": keyed_rows}
    for run in runs.values():  # warm the decode plan caches
        run()
    times = dict.fromkeys(runs, float("inf"))
    for _ in range(args.trials):
        for name, run in runs.items():
            times[name] = min(times[name], _best(1, run))
    base = times["rows (baseline)"]
    print(f"{n:,} records per fetch, best of {args.trials}")
    for name, seconds in times.items():
        print(
            f"  {name:<16} {n / seconds:>12,.0f} records/s  {seconds * 1000:8.1f} ms"
            f"  {seconds / base:5.2f}x the baseline's time"
        )


if __name__ == "__main__":
    main()
