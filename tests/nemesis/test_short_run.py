"""The suite's nemesis run: two fixed seeds whose schedules together draw every kind of
fault, then a random seed (printed), each for a few seconds of faults on the same replicas
and tables, checked record by record. ``make nemesis`` runs long ones."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apache_kafka import KafkaBroker
from support.object_store import SeaweedFS

from nemesis.runner import RunConfig, run
from nemesis.world import Servers

# Together, in their first 12 s, these two draw every kind of fault: 1726 kills, pauses,
# clocks, copies, full disks and the outside writer among others, 19371 an old spool
# restored, lost commit answers, a read-only disk and a broker restart among others.
FIXED_SEEDS = (1726, 19371)
SECONDS_EACH = 12.0


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker of the run's own: the nemesis stops and restarts it."""
    broker = KafkaBroker.start(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.stop()


# aiokafka leaves a client stopped while its broker was killed to the garbage collector
# (its connections, its sender task pending): ended and collected before the test ends,
# their warnings fall under this filter.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_a_short_nemesis_run(
    tmp_path: Path,
    object_store: SeaweedFS,
    own_broker: KafkaBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A broker stopped on purpose makes aiokafka log every failed attempt.
    caplog.set_level(logging.CRITICAL, logger="aiokafka")
    seeds = (*FIXED_SEEDS, random.randrange(1 << 31))
    print(f"nemesis seeds {seeds}", flush=True)
    config = RunConfig(seeds, SECONDS_EACH)
    try:
        report = await run(config, Servers(own_broker, object_store), tmp_path / "run")
    finally:
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        gc.collect()
    print(report.text(), flush=True)
    assert report.passed, report.text()
