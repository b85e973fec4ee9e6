"""``python -m nemesis`` (with ``tests`` on PYTHONPATH; `make nemesis` runs it): one run
with servers of its own. Exits 0 when the checker passed; on failure its directory (every
replica's logs) is kept and named.

    python -m nemesis --seed 7 --minutes 60 --variant sql
    python -m nemesis --seed 3,11 --seconds 20     (each seed's schedule in turn)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from support.apache_kafka import KafkaBroker
from support.iceberg_rest import IcebergRest
from support.object_store import SeaweedFS

from nemesis.runner import RunConfig, run
from nemesis.world import Servers


async def _main(config: RunConfig, root: Path) -> bool:
    # SIGTERM and SIGINT end the run through its clean-up: no replica, broker or tmpfs
    # outlives it.
    main = asyncio.current_task()
    assert main is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, main.cancel)
    store = SeaweedFS.start(root / "seaweedfs")
    rest = IcebergRest.start(root / "iceberg-rest", store) if config.variant == "rest" else None
    broker = KafkaBroker.start(root / "kafka")
    try:
        report = await run(config, Servers(broker, store, rest), root / "run")
    finally:
        broker.stop()
        if rest is not None:
            rest.stop()
        store.stop()
    print(report.text(), flush=True)
    return report.passed


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m nemesis", description=__doc__)
    parser.add_argument(
        "--seed", default=None, help="a seed, or seeds separated by commas; default: a random one"
    )
    parser.add_argument("--minutes", type=float, default=None, help="of each seed's schedule")
    parser.add_argument("--seconds", type=float, default=None, help="of each seed's schedule")
    parser.add_argument("--variant", choices=("sql", "rest"), default="sql")
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    seeds = (
        tuple(int(s) for s in args.seed.split(",")) if args.seed else (random.randrange(1 << 31),)
    )
    seconds = args.seconds or (args.minutes or 1) * 60
    print(f"nemesis: seeds {seeds}, {seconds:g} s each, {args.variant}", flush=True)
    # A broker stopped on purpose makes aiokafka log every failed attempt.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix=f"nemesis-{seeds[0]}-"))
    config = RunConfig(seeds, seconds, args.variant, args.replicas)
    passed = asyncio.run(_main(config, root))
    if passed:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"nemesis: the run's files (every replica's logs) are in {root}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
