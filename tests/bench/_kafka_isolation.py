"""bench_kafka.py --broker apache --isolation both: read_committed against read_uncommitted.

Tansu has no transactions, so this mode runs on a local Apache Kafka broker
(support/apache_kafka.py; `make test-deps` installs its jars). One 6-partition topic
gets --records events (those of the Tansu bench) from a transactional producer, in
committed transactions of --transaction-chunks x 10,000 events, so every partition
holds a commit marker after each transaction's batches. Both isolation levels then
read that same topic (with read_uncommitted every record is read too: all are
committed), each round in both orders in turn:

  (a'') the daemon's client path alone: batch-drained `getmany` (icespool.kafka._upstream._batches)
        + one pyarrow.json decode per partition and poll, nothing durable;
  (c)   icespool: an `icespool run` child with ``isolation_level`` set, until the
        table's committed-records counter reaches --records (the table is checked).

Printed: rows/s of each (min / median / max of the rounds) and the read_committed /
read_uncommitted ratio of each round (measured back to back, under the same load).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median

from bench_kafka import PARTITIONS, TOPIC, Run, bare_pipe, icespool_run, produce_topic, spread
from support.apache_kafka import KafkaBroker
from support.kafka_harness import create_topic

__all__ = ["compare_isolation"]

_SHORT = {"read_uncommitted": "uncommitted", "read_committed": "committed"}


async def compare_isolation(args: argparse.Namespace) -> int:
    levels = (
        ["read_uncommitted", "read_committed"] if args.isolation == "both" else [args.isolation]
    )
    records = args.records or (300_000 if args.quick else 1_000_000)
    trials = args.trials or (1 if args.quick else 3)
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-isolation-", dir=args.dir))
    load1, _, _ = os.getloadavg()
    print(f"cores: {len(os.sched_getaffinity(0))}; load average {load1:.1f}; disk: {directory}")
    broker = KafkaBroker.start(directory / "kafka")
    assert broker.process is not None
    pid = broker.process.pid
    pipes: dict[str, list[Run]] = {level: [] for level in levels}
    daemons: dict[str, list[Run]] = {level: [] for level in levels}
    try:
        print(f"Apache Kafka on {broker.bootstrap} (started in {broker.started_in:.1f}s)")
        await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        seconds = await produce_topic(broker.bootstrap, TOPIC, records, args.transaction_chunks)
        print(
            f"topic {TOPIC!r}: {PARTITIONS} partitions, {records:,} events in committed "
            f"transactions of {args.transaction_chunks * 10_000:,}, produced in "
            f"{seconds:.1f}s",
            flush=True,
        )
        for trial in range(trials):
            order = levels if trial % 2 == 0 else levels[::-1]
            print(f"\nround {trial + 1} (load average {os.getloadavg()[0]:.1f})", flush=True)
            for level in order:
                run = await bare_pipe(
                    broker.bootstrap,
                    TOPIC,
                    records,
                    f"drained-{_SHORT[level]}-{trial}",
                    pid,
                    batched=True,
                    isolation_level=level,
                )
                pipes[level].append(run)
                print(f"  (a'') {level}: {run.rows_per_s:,.0f} rows/s; {run.note}", flush=True)
            for level in order:
                ice = await icespool_run(
                    directory / f"ice-{trial}-{level}",
                    broker.bootstrap,
                    records,
                    f"icespool-{_SHORT[level]}-{trial}",
                    pid,
                    None,
                    args.batch_timeout,
                    args.flush,
                    isolation_level=level,
                )
                shutil.rmtree(directory / f"ice-{trial}-{level}", ignore_errors=True)
                daemons[level].append(ice.committed)
                print(
                    f"  (c) icespool {level}: {ice.committed.rows_per_s:,.0f} rows/s committed; "
                    + "; ".join(ice.notes),
                    flush=True,
                )
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)

    print(
        f"\n== {records:,} events, {PARTITIONS} partitions, Apache Kafka, transactions of "
        f"{args.transaction_chunks * 10_000:,}, {trials} rounds (min / median / max) =="
    )
    for name, runs in (("(a'') batch-drained getmany", pipes), ("(c) icespool committed", daemons)):
        for level in levels:
            rates = [r.rows_per_s for r in runs[level]]
            cpu = [r.cpu_s / r.rows * 1e6 for r in runs[level] if r.rows]
            print(
                f"  {name}, {level:16} rows/s {spread(rates)}; "
                f"CPU-s per million rows {spread(cpu, '.2f')}"
            )
        if len(levels) == 2:
            ratios = [
                c.rows_per_s / u.rows_per_s
                for u, c in zip(runs["read_uncommitted"], runs["read_committed"], strict=True)
            ]
            print(
                f"  {name}, read_committed / read_uncommitted (same round): "
                f"{spread(ratios, '.2f')} (median {median(ratios):.2f})"
            )
    print(f"\nload average now {os.getloadavg()[0]:.1f}; {time.strftime('%H:%M:%S')}")
    return 0
