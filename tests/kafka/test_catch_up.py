"""A source that drains a backlog commits the last, partial batch once it has caught up,
not ``batch_timeout`` later; live traffic and small backlogs keep to the timer
(in-process daemon, the tests' Apache Kafka broker).

The batch that would wait is the dead-letter table's: a few poison records among a
backlog of good ones never reach its size trigger, so only the catch-up (or the
10-minute timer) commits them. (The data table's last rows usually ride on a size-
triggered flush that was queued behind another while the backlog was read.)"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from support.kafka_harness import Broker, create_topic, produce, produce_transaction, unique_name
from support.service_helpers import metric, table_rows, wait_rows

from icespool.config import Config
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
TABLE = "demo.events"
DEAD = f"{TABLE}_dead_letter"
SCHEMA = [{"name": "id", "type": "long", "required": True}, {"name": "kind", "type": "string"}]
BATCH = 1_000
PARTITIONS = 3


def _config(make_config: MakeConfig, broker: Broker, topic: str, **kafka: Any) -> Config:
    return make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        # A timer no test waits for: every commit here is by size, catch-up or flush.
        defaults={"batch_timeout": "10m", "max_batch_records": BATCH},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "table": TABLE,
                "session_timeout": "6s",
                **kafka,
            }
        ],
    )


def _commits(service: Icespool, table: str = TABLE) -> dict[str, float]:
    return {
        reason: metric(service, "icespool_commits_total", table=table, reason=reason)
        for reason in ("records", "caught_up", "age", "manual")
    }


def _assert_once(rows: list[dict[str, Any]], ids: range) -> None:
    counts = Counter(r["id"] for r in rows)
    assert [i for i, n in counts.items() if n > 1] == []
    assert sorted(counts) == list(ids)


async def test_a_drained_backlog_is_committed_when_caught_up_and_live_records_wait(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("catchup")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    backlog = 5_500
    poison = [{"id": "not a number", "kind": str(n)} for n in range(10)]
    await produce(
        broker.bootstrap, topic, [{"id": i, "kind": "old"} for i in range(backlog)] + poison
    )
    async with Icespool(_config(make_config, broker, topic)) as service:
        _assert_once(await wait_rows(service, TABLE, backlog, within=60), range(backlog))
        dead = await wait_rows(service, DEAD, 10, within=60)
        assert sorted(json.loads(d["value"])["kind"] for d in dead) == [str(n) for n in range(10)]
        assert _commits(service, DEAD)["caught_up"] == 1, _commits(service, DEAD)
        assert _commits(service)["age"] == _commits(service, DEAD)["age"] == 0

        # Live records fewer than a batch: the source never fell a batch behind, so
        # they keep to the timer (no catch-up commit, nothing visible yet).
        await produce(broker.bootstrap, topic, [{"id": backlog + i} for i in range(300)])
        writer = service.tables.writer(TABLE)
        for _ in range(200):
            if writer.pending_records == 300:
                break
            await asyncio.sleep(0.05)
        assert writer.pending_records == 300
        await asyncio.sleep(2.0)
        assert writer.pending_records == 300
        assert len(await asyncio.to_thread(table_rows, service, TABLE)) == backlog

        # A second backlog (more than a batch while the source is at the end): its
        # poison is committed by a second catch-up.
        second = range(backlog + 300, backlog + 300 + 2_500)
        await produce(broker.bootstrap, topic, [{"id": i} for i in second] + poison[:4])
        total = backlog + 300 + 2_500
        _assert_once(await wait_rows(service, TABLE, total, within=60), range(total))
        assert len(await wait_rows(service, DEAD, 14, within=60)) == 14
        assert _commits(service, DEAD)["caught_up"] == 2
        assert _commits(service)["age"] == _commits(service, DEAD)["age"] == 0


async def test_a_transactional_backlog_counts_as_caught_up_despite_its_markers(
    make_config: MakeConfig, broker: Broker
) -> None:
    """Each committed transaction leaves a marker at an offset no record has: the
    source's position stops one short of the end after it, which is still the end."""
    topic = unique_name("catchup-txn")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{topic}", enable_idempotence=True
    )
    await producer.start()
    try:
        for n in range(5):  # 2,500 records, 5 markers per partition
            ids = range(n * 500, (n + 1) * 500)
            await produce_transaction(
                producer, topic, [{"id": i} for i in ids], partitions=PARTITIONS, commit=True
            )
        await produce_transaction(
            producer, topic, [{"id": "poison"}] * 6, partitions=PARTITIONS, commit=True
        )
        await produce_transaction(
            producer, topic, [{"id": -1}] * 50, partitions=PARTITIONS, commit=False
        )
    finally:
        await producer.stop()
    config = _config(make_config, broker, topic, isolation_level="read_committed")
    async with Icespool(config) as service:
        _assert_once(await wait_rows(service, TABLE, 2_500, within=60), range(2_500))
        assert len(await wait_rows(service, DEAD, 6, within=60)) == 6
        assert _commits(service, DEAD)["caught_up"] == 1
        assert _commits(service)["age"] == _commits(service, DEAD)["age"] == 0


async def test_a_burst_commits_only_the_tables_whose_batch_it_reaches(
    make_config: MakeConfig, broker: Broker
) -> None:
    """A routed source whose tables take batches of different sizes: the backlog at the
    start is more than either batch, so both are committed once it is drained; a live burst
    bigger than the small table's batch but smaller than the big one's is no backlog
    for the big table, which keeps to its timer (it is not committed at every burst)."""
    topic = unique_name("catchup-mixed")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    small, big = "demo.ev_small", "demo.ev_big"
    config = make_config(
        tables=[
            {"name": small, "create": True, "schema": SCHEMA, "max_batch_records": 100},
            {"name": big, "create": True, "schema": SCHEMA, "max_batch_records": 2_000},
        ],
        defaults={"batch_timeout": "10m"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "route_field": "kind",
                "table_template": "demo.ev_{value}",
                "session_timeout": "6s",
            }
        ],
    )
    backlog = [{"id": i, "kind": "big" if i % 10 else "small"} for i in range(2_750)]
    await produce(broker.bootstrap, topic, backlog, partitions=PARTITIONS)
    async with Icespool(config) as service:
        _assert_once(await wait_rows(service, small, 275, within=60), range(0, 2_750, 10))
        big_ids = [r["id"] for r in backlog if r["kind"] == "big"]
        assert sorted(r["id"] for r in await wait_rows(service, big, 2_475)) == big_ids
        # (By size or at the catch-up: the timer is 10 minutes away.)
        commits = _commits(service, big)

        writer = service.tables.writer(big)
        live = range(2_750, 2_750 + 5 * 300)
        for start in live[::300]:
            await produce(
                broker.bootstrap,
                topic,
                [{"id": i, "kind": "big"} for i in range(start, start + 300)],
            )
            await asyncio.sleep(1.0)
        for _ in range(100):
            if writer.pending_records == len(live):
                break
            await asyncio.sleep(0.05)
        assert writer.pending_records == len(live)
        assert _commits(service, big) == commits
        await writer.flush()
        rows = await asyncio.to_thread(table_rows, service, big)
        assert sorted(r["id"] for r in rows) == [*big_ids, *live]
