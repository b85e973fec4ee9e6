"""Who writes during a run, and records what it was promised.

- `HttpAppends`: NDJSON records with new ids to ``t.events`` on any running replica; an
  answer 200 is an ack, anything else (refused, reset, timed out) leaves the ids unacked:
  they may appear in the table, at most once, and are never sent again.
- `HttpChanges`: keyed changes to ``t.users``, one writer per slot for the keys of that
  slot, a request at a time, re-sent as it was until acked: each key's changes reach one
  replica's spool in the order they were made, so the last acked change per key is what
  the table must hold. Each request also upserts the slot's heartbeat key with its
  number: the table shows how far a slot's requests are committed.
- `KafkaWrites`: JSON records with new ids to the stream topic, keyed changes (a null
  value deletes) to the keyed topic; the checker's model of both is the topics' logs.
- `CommitWatcher`: polls the catalog for new data snapshots (for the time to resume).

A slot can be quieted (`Quiet`): its writers hold back and their requests in flight end,
so a copy of its spool is what an atomic volume snapshot would have taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer
from support.daemon_harness import NDJSON, ndjson

from nemesis.recorder import Change, ChangeBatch, History
from nemesis.replicas import Slot
from nemesis.world import EVENTS, KAFKA_PARTITIONS, STREAM, TABLES, USERS, Warehouse

__all__ = [
    "HEARTBEAT",
    "KEYED_KEYS",
    "USER_KEYS",
    "CommitWatcher",
    "HttpAppends",
    "HttpChanges",
    "KafkaWrites",
    "Quiet",
]

USER_KEYS = 120
KEYED_KEYS = 80
# A slot's heartbeat key in t.users: HEARTBEAT + slot; its seq is the request's number.
HEARTBEAT = 1_000_000
_TIMEOUT = aiohttp.ClientTimeout(total=8)


@dataclass
class Quiet:
    """Slots whose HTTP writers hold back, and the requests in flight per slot."""

    held: set[int] = field(default_factory=set)
    in_flight: dict[int, int] = field(default_factory=dict)
    _ended: asyncio.Condition = field(default_factory=asyncio.Condition)

    @contextlib.asynccontextmanager
    async def slot(self, index: int) -> AsyncIterator[None]:
        """Hold ``index``'s writers back until the block ends; it starts once the
        requests in flight to it have ended."""
        self.held.add(index)
        try:
            async with self._ended:
                await self._ended.wait_for(lambda: not self.in_flight.get(index, 0))
            yield
        finally:
            self.held.discard(index)

    @contextlib.asynccontextmanager
    async def request(self, index: int) -> AsyncIterator[None]:
        self.in_flight[index] = self.in_flight.get(index, 0) + 1
        try:
            yield
        finally:
            self.in_flight[index] -= 1
            async with self._ended:
                self._ended.notify_all()


async def _post(
    session: aiohttp.ClientSession, url: str, records: Sequence[dict[str, Any]]
) -> int | None:
    """The answer's status (200 only when every record was accepted); None: no answer."""
    try:
        async with session.post(
            url, data=ndjson(records), headers={"Content-Type": NDJSON}, timeout=_TIMEOUT
        ) as answer:
            body = await answer.text()
            if answer.status == 200 and json.loads(body).get("accepted") != len(records):
                raise AssertionError(f"{url} accepted a part of a request: {body}")
            return answer.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


@dataclass
class HttpAppends:
    slots: list[Slot]
    history: History
    quiet: Quiet
    rng: random.Random
    batch: int = 40
    next_id: int = 0
    refused: int = 0  # requests answered with an error

    async def run(self, stop: asyncio.Event, workers: int = 2) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._worker(session, stop) for _ in range(workers)))

    async def _worker(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ready = [s for s in self.slots if s.url and s.index not in self.quiet.held]
            if not ready:
                await asyncio.sleep(0.2)
                continue
            slot = self.rng.choice(ready)
            url = f"{slot.url}/v1/tables/{EVENTS}/records"
            ids = range(self.next_id, self.next_id + self.batch)
            self.next_id += self.batch
            async with self.quiet.request(slot.index):
                status = await _post(session, url, [{"id": i, "v": f"e{i}"} for i in ids])
            if status == 200:
                self.history.ack(EVENTS, ids, slot.name)
                await asyncio.sleep(0.05)
            else:
                self.history.unacked(EVENTS, ids)
                self.refused += status is not None
                await asyncio.sleep(0.3)


@dataclass
class HttpChanges:
    slots: list[Slot]
    history: History
    quiet: Quiet
    rng: random.Random
    seq: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._writer(session, s.index, stop) for s in self.slots))

    def _batch(self, slot: int, number: int) -> ChangeBatch:
        keys = [k for k in range(USER_KEYS) if k % len(self.slots) == slot]
        changes = []
        for _ in range(8):
            self.seq += 1
            key = self.rng.choice(keys)
            value = None if self.rng.random() < 0.2 else f"u{self.seq}"
            changes.append(Change(key, value, self.seq))
        changes.append(Change(HEARTBEAT + slot, f"h{number}", number))
        return ChangeBatch(slot, number, tuple(changes))

    async def _writer(
        self, session: aiohttp.ClientSession, index: int, stop: asyncio.Event
    ) -> None:
        slot = self.slots[index]
        number = 0
        while not stop.is_set():
            number += 1
            batch = self._batch(index, number)
            self.history.batches.append(batch)
            body = [
                {"id": c.key, "v": c.value, "seq": c.seq, "_op": "upsert"}
                if c.value is not None
                else {"id": c.key, "_op": "delete"}
                for c in batch.changes
            ]
            # Until acked, whatever happens meanwhile: the model needs every request's
            # outcome (re-sending the same changes of one slot's keys is harmless).
            while True:
                url = slot.url
                if url is None or index in self.quiet.held:
                    await asyncio.sleep(0.2)
                    continue
                async with self.quiet.request(index):
                    status = await _post(session, f"{url}/v1/tables/{USERS}/changes", body)
                if status == 200:
                    batch.acked_at = self.history.now()
                    break
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.1)


@dataclass
class KafkaWrites:
    bootstrap: str
    stream_topic: str
    keyed_topic: str
    history: History
    rng: random.Random
    next_id: int = 0
    failures: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                enable_idempotence=True,
                acks="all",
                linger_ms=20,
                request_timeout_ms=5000,
            )
            try:
                await asyncio.wait_for(producer.start(), 10)
                while not stop.is_set():
                    await self._round(producer)
                    await asyncio.sleep(0.1)
            except Exception:
                # The broker is down or was restarted: a new producer, new ids.
                self.failures += 1
                await asyncio.sleep(0.5)
            finally:
                # Without a timeout: a stop cut short leaves its connections and sender
                # task behind (a stop waits at worst for the broker to be back).
                with contextlib.suppress(Exception):
                    await producer.stop()

    async def _round(self, producer: AIOKafkaProducer) -> None:
        ids = range(self.next_id, self.next_id + 40)
        self.next_id += 40
        sent = [
            await producer.send(
                self.stream_topic,
                json.dumps({"id": i, "v": f"k{i}"}).encode(),
                partition=i % KAFKA_PARTITIONS,
            )
            for i in ids
        ]
        for _ in range(20):
            key = self.rng.randrange(KEYED_KEYS)
            value = None
            if self.rng.random() >= 0.2:
                value = json.dumps({"id": key, "v": f"c{self.next_id}", "seq": self.next_id})
            sent.append(
                await producer.send(
                    self.keyed_topic,
                    value.encode() if value is not None else None,
                    key=str(key).encode(),
                )
            )
        try:
            await asyncio.wait_for(asyncio.gather(*sent), 10)
        except BaseException:
            self.history.unacked(STREAM, ids)
            raise
        self.history.ack(STREAM, ids, "kafka")


@dataclass
class CommitWatcher:
    """Notes each table's new data snapshots (the daemon's: they name spool segments)."""

    warehouse: Warehouse
    history: History
    seen: dict[str, int | None] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        catalog = await asyncio.to_thread(self.warehouse.catalog)
        while not stop.is_set():
            for table in TABLES:
                with contextlib.suppress(Exception):
                    current = await asyncio.to_thread(_current_data_snapshot, catalog, table)
                    if current is not None and current != self.seen.get(table, current):
                        self.history.commit_seen(table)
                    if current is not None:
                        self.seen[table] = current
            await asyncio.sleep(1.0)


def _current_data_snapshot(catalog: Any, table: str) -> int | None:
    snapshot = catalog.load_table(table).current_snapshot()
    if snapshot is None or snapshot.summary is None or not snapshot.summary["icespool.segments"]:
        return None
    return int(snapshot.snapshot_id)
