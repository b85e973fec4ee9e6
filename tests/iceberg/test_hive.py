"""The Hive Metastore as the catalog (``type = "hive"``): real ``icespool run`` processes
against Apache Hive's standalone metastore 4.0.0 (tests/support/hive_metastore.py), tables
in a local directory, read back with pyiceberg's own HiveCatalog.

1. Two replicas (spools of their own) commit concurrently to one table: every id once.
2. The maintenance lease: refused on Hive with the reason, in /v1/status and the log.
3. ``lease = "none"``: one replica maintains a Hive table (expiry), nothing lost.
4. A table whose first metadata file the metastore deleted (a lost create_database race
   rolls back by deleting the database's directory) is written back and ingests; a table
   that had a commit is never rewritten: it is reported, with the missing file named; and
   the race itself, run by three catalogs creating one new namespace and table at once.
   A written-back table is the table as created (key, spec, sort order, format version),
   and the replica that created it commits through the written-back file.
5. Spools claiming their identities in one namespace at once each get theirs (the
   metastore replaces a namespace's whole property map on every write), also when each
   takes over its own ended incarnation's claim.

The kill -9 rounds on Hive are tests/faults/test_daemon.py's ``hive`` variant; Spark
reading a Hive table is tests/spark/test_spark_hive.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.hive_metastore import HiveMetastore

from icespool.errors import CatalogError
from icespool.iceberg import ensure_table, load_catalog
from icespool.iceberg._defaults import TABLE_DEFAULTS, with_defaults
from icespool.lifecycle.spool_claim import SpoolClaim, SpoolContestedError, holder_key
from icespool.spool import Incarnation

# Two replicas' commits queue on the metastore's table lock, and pyiceberg backs off between
# lock checks (up to lock-check-max-wait-time, 60 s by default): a flush behind the other
# replica's may take tens of seconds on two loaded cores. What is asserted is every id once.
_TIMEOUT = aiohttp.ClientTimeout(total=120)
_LEASE_REFUSED = (
    "a hive catalog cannot hold the maintenance lease; "
    'set [maintenance] lease = "none" on one replica'
)

MakeDaemon = Callable[..., tuple[DaemonDir, Daemon]]


@pytest.fixture
def make_daemon(tmp_path: Path, hive_metastore: HiveMetastore) -> Iterator[MakeDaemon]:
    """Daemons on the metastore, emptied once for the test (they share its table); every
    child is SIGKILLed and reaped at teardown."""
    catalog = hive_metastore.catalog_properties(hive_metastore.warehouse())
    made: list[Daemon] = []

    def make(extra: str = "", **config: Any) -> tuple[DaemonDir, Daemon]:
        home = DaemonDir(tmp_path / f"d{len(made)}", catalog=catalog)
        home.write_config(extra=extra, **config)
        daemon = Daemon(home)
        made.append(daemon)
        return home, daemon

    yield make
    for daemon in made:
        daemon.cleanup()


def _records(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}"} for i in ids]


async def _status(session: aiohttp.ClientSession, daemon: Daemon) -> dict[str, Any]:
    async with session.get(f"{daemon.url}/v1/status") as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = json.loads(await resp.text())
        return body


async def test_two_replicas_commit_to_one_hive_table_every_id_once(
    make_daemon: MakeDaemon,
) -> None:
    """Both replicas create-or-load the table and commit every ~200 ms at once: the
    metastore's table lock serialises their commits, each conflict is refreshed and
    retried, and every acked id is in the table exactly once."""
    homes_daemons = [make_daemon(batch_timeout="200ms") for _ in range(2)]
    daemons = [d for _, d in homes_daemons]
    for daemon in daemons:
        daemon.start()
    await asyncio.gather(*(d.wait_ready() for d in daemons))
    batches, size = 20, 250
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:

        async def feed(replica: int) -> None:
            for batch in range(batches):
                first = (replica * batches + batch) * size
                await daemons[replica].ingest(session, _records(range(first, first + size)))
                await asyncio.sleep(0.05)

        await asyncio.gather(feed(0), feed(1))
        for daemon in daemons:
            await daemon.flush(session)
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
    codes = [await d.wait_exit(35) for d in daemons]
    assert codes == [0, 0], "\n".join(d.tail() for d in daemons)
    rows, table = homes_daemons[0][0].read_rows()
    counts = Counter(row["id"] for row in rows)
    expected = set(range(2 * batches * size))
    assert set(counts) == expected, sorted(expected ^ set(counts))[:20]
    assert [i for i, c in counts.items() if c > 1] == []
    assert all(row["v"] == f"v{row['id']}" for row in rows)
    # Each replica's commits record its last segments under a property of its spool's own.
    spools = [
        key
        for key in table.metadata.properties
        if key.startswith("icespool.spool.") and key.endswith(".last-segments")
    ]
    assert len(spools) == 2, spools
    conflicts = sum(d.all_logs().count("commit conflict") for d in daemons)
    print(f"two replicas on Hive: {len(table.metadata.snapshots)} snapshots, {conflicts} conflicts")


async def test_maintenance_lease_is_refused_on_hive_with_the_reason(
    make_daemon: MakeDaemon,
) -> None:
    """pyiceberg's HiveCatalog checks requirements under a metastore lock that nothing
    heartbeats and that the metastore times out, not by compare-and-swap: the daemon does
    not take the lease there and says why, per table and in its log; ingest goes on."""
    _, daemon = make_daemon(batch_timeout="200ms", extra='[maintenance]\ninterval = "1s"\n')
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, _records(range(100)))
        await daemon.flush(session)
        deadline = time.monotonic() + 15
        while True:
            maintenance = (await _status(session, daemon))["tables"][TABLE]["maintenance"]
            if maintenance["disabled"] is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert maintenance["disabled"] == _LEASE_REFUSED, maintenance
    assert maintenance["lease"] is None
    assert "maintenance is off: a hive catalog cannot hold the maintenance lease" in daemon.log()
    rows, _ = daemon.home.read_rows()
    assert sorted(row["id"] for row in rows) == list(range(100))


async def test_one_replica_maintains_a_hive_table_with_lease_none(
    make_daemon: MakeDaemon,
) -> None:
    """``lease = "none"``: expiry runs on the Hive table (its commits go through the
    metastore like ingest's) and keeps every id once."""
    maintenance = (
        '[maintenance]\nlease = "none"\ninterval = "1s"\nmin_snapshots = 1\nmax_snapshots = 2\n'
    )
    home, daemon = make_daemon(extra=maintenance)
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for batch in range(6):
            await daemon.ingest(session, _records(range(batch * 100, (batch + 1) * 100)))
            await daemon.flush(session)
        deadline = time.monotonic() + 30
        while True:
            table, _ = home.load_table()
            if len(table.metadata.snapshots) <= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        status = (await _status(session, daemon))["tables"][TABLE]["maintenance"]
    assert len(table.metadata.snapshots) <= 2, (len(table.metadata.snapshots), status)
    assert status["disabled"] is None
    rows, _ = home.read_rows()
    assert sorted(row["id"] for row in rows) == list(range(600))


def _local_path(location: str) -> Path:
    return Path(urlparse(location).path)


def _lose(location: str) -> Path:
    """The metadata file at ``location`` deleted, as the metastore's rollback of a lost
    create_database does to the database's whole directory."""
    path = _local_path(location)
    path.unlink()
    return path


def _delete_current_metadata(home: DaemonDir) -> Path:
    table, _ = home.load_table()
    return _lose(table.metadata_location)


async def test_a_new_tables_lost_first_metadata_file_is_written_back(
    make_daemon: MakeDaemon,
) -> None:
    """The table the daemon created (no commit yet) lost its first metadata file: the
    restarted daemon writes it back from its declaration, says so, and ingests into it."""
    home, daemon = make_daemon()
    daemon.start()
    await daemon.wait_ready()
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()
    lost = _delete_current_metadata(home)
    assert lost.name.startswith("00000-"), lost
    daemon.start()
    await daemon.wait_ready()
    assert lost.exists()
    assert f"its first metadata file file:{lost} was missing" in daemon.log(), daemon.tail()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, _records(range(100)))
        await daemon.flush(session)
    rows, table = home.read_rows()
    assert sorted(row["id"] for row in rows) == list(range(100))
    assert [field.name for field in table.schema().fields] == ["id", "v"]


async def test_a_committed_tables_lost_metadata_file_is_reported_not_rewritten(
    make_daemon: MakeDaemon,
) -> None:
    """A table with a commit whose current metadata file is gone is not rebuilt from the
    declaration (that would drop its snapshots): it is degraded with the file named, its
    records stay spooled, and the file stays missing."""
    home, daemon = make_daemon()
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, _records(range(10)))
        await daemon.flush(session)
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()
    lost = _delete_current_metadata(home)
    assert not lost.name.startswith("00000-"), lost
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        status, text = await daemon.post_records(session, _records(range(10, 20)))
    assert status == 503, text
    assert "cannot load table 't.events'" in text and lost.name in text, text
    assert not lost.exists()
    assert "first metadata file" not in daemon.log()


async def test_another_writers_table_at_its_lost_first_metadata_is_not_rewritten(
    make_daemon: MakeDaemon,
) -> None:
    """A table at its first metadata file that another writer created (not from this
    declaration: a first file may hold a snapshot, as CREATE TABLE AS SELECT writes) is not
    rebuilt from the declaration when that file is gone: it is degraded, the file named."""
    home, daemon = make_daemon()
    catalog = pyiceberg_load_catalog(CATALOG_NAME, **home.catalog_properties)
    catalog.create_namespace("t")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "v", StringType(), required=False),
    )
    catalog.create_table(TABLE, schema, properties={"owner": "another-writer"})
    lost = _delete_current_metadata(home)
    assert lost.name.startswith("00000-"), lost
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        status, text = await daemon.post_records(session, _records(range(10)))
    assert status == 503, text
    assert "cannot load table 't.events'" in text and lost.name in text, text
    assert not lost.exists()
    assert "first metadata file" not in daemon.log()


def test_replicas_creating_one_new_namespace_and_table_at_once_all_load_it(
    hive_metastore: HiveMetastore, caplog: pytest.LogCaptureFixture
) -> None:
    """Three catalogs (replicas) create-or-load one table in a namespace that does not
    exist yet, at once, 20 times over: each gets the table and it loads afterwards. The
    metastore's create_database loser deletes the new database's directory, with the
    winner's first metadata file in it (about one round in five on this machine); the
    first replica to see that writes the file back, the others load it."""
    props = hive_metastore.catalog_properties(hive_metastore.warehouse())
    catalogs = [load_catalog("replica", props) for _ in range(3)]
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    failures: list[str] = []
    for round_ in range(20):
        name = f"race{round_}.events"
        barrier = threading.Barrier(len(catalogs))

        def create_or_load(catalog: Any, name: str = name, barrier: Any = barrier) -> None:
            barrier.wait()
            try:
                ensure_table(catalog, name, schema, PartitionSpec(), {}, True)
            except CatalogError as exc:
                failures.append(f"{name}: {exc}")

        threads = [threading.Thread(target=create_or_load, args=(c,)) for c in catalogs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), name
        assert [f.name for f in catalogs[0].load_table(name).schema().fields] == ["id"]
    assert failures == []
    restored = caplog.text.count("was missing (the Hive Metastore deletes")
    print(f"create race on Hive: first metadata written back in {restored} of 20 rounds")


async def test_spools_claiming_in_one_namespace_at_once_each_get_their_claim(
    hive_metastore: HiveMetastore,
) -> None:
    """Four spools take their claims in one namespace at once, 10 times over: each takes
    its own (a write that another replaced with a map without it is written again), and
    each gives it back."""
    props = hive_metastore.catalog_properties(hive_metastore.warehouse())
    catalogs = [load_catalog("replica", props) for _ in range(4)]
    for round_ in range(10):
        namespace = (f"claims{round_}",)
        catalogs[0].create_namespace(namespace)
        claims = [
            SpoolClaim(
                c, namespace, f"spool-{i}", Incarnation.current(), ttl=30, request_timeout=10
            )
            for i, c in enumerate(catalogs)
        ]
        await asyncio.gather(*(claim.acquire() for claim in claims))
        for claim in claims:
            await claim.release()
        left = catalogs[0].load_namespace_properties(namespace)
        assert [k for k in left if k.startswith("icespool.spool.")] == [], left


# ------------------------------------------------------- a written-back table, used


_KEYED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "v", StringType(), required=False),
    NestedField(3, "k", StringType(), required=False),
    identifier_field_ids=[1],
)
_KEYED_ROWS = pa.Table.from_pylist(
    [{"id": i, "v": f"v{i}", "k": "a"} for i in range(5)],
    schema=pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("v", pa.string()),
            pa.field("k", pa.string()),
        ]
    ),
)


def _hive_catalog(hive_metastore: HiveMetastore) -> Any:
    return load_catalog("lake", hive_metastore.catalog_properties(hive_metastore.warehouse()))


def test_a_written_back_keyed_table_is_the_table_as_created(
    hive_metastore: HiveMetastore,
) -> None:
    """An upsert-style table (identifier key, identity partition, sort order, format
    version 2) written back: every part of its metadata but the uuid is the original's,
    and it takes an append."""
    catalog = _hive_catalog(hive_metastore)
    spec = PartitionSpec(
        PartitionField(source_id=3, field_id=1000, transform=IdentityTransform(), name="k")
    )
    order = SortOrder(SortField(source_id=2, transform=IdentityTransform()))
    props = {"format-version": "2"}
    before = ensure_table(catalog, "t.keyed", _KEYED, spec, props, True, order).metadata
    _lose(catalog.load_table("t.keyed").metadata_location)
    table = ensure_table(catalog, "t.keyed", _KEYED, spec, props, True, order)
    after = table.metadata
    assert after.format_version == before.format_version == 2
    assert after.schemas == before.schemas
    assert after.schema().identifier_field_ids == [1]
    assert (after.partition_specs, after.default_spec_id) == (
        before.partition_specs,
        before.default_spec_id,
    )
    assert (after.sort_orders, after.default_sort_order_id) == (
        before.sort_orders,
        before.default_sort_order_id,
    )
    assert (after.last_column_id, after.last_partition_id) == (
        before.last_column_id,
        before.last_partition_id,
    )
    assert (after.properties, after.location) == (before.properties, before.location)
    assert after.table_uuid != before.table_uuid
    table.append(_KEYED_ROWS)
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == [0, 1, 2, 3, 4]


def test_a_first_file_with_a_snapshot_and_the_daemons_properties_is_not_rewritten(
    hive_metastore: HiveMetastore,
) -> None:
    """Another writer created the table with a snapshot in its first metadata file
    (create_table_transaction and an append, as CREATE TABLE AS SELECT), with every
    property the daemon would give it but its creator mark: not rebuilt when lost."""
    catalog = _hive_catalog(hive_metastore)
    catalog.create_namespace("t")
    props = {"write.parquet.compression-codec": "zstd", **with_defaults({}, TABLE_DEFAULTS)}
    transaction = catalog.create_table_transaction("t.ctas", _KEYED, properties=props)
    transaction.append(_KEYED_ROWS)
    transaction.commit_transaction()
    loaded = catalog.load_table("t.ctas")
    assert loaded.metadata.current_snapshot_id is not None
    lost = _lose(loaded.metadata_location)
    assert lost.name.startswith("00000-"), lost
    with pytest.raises(CatalogError, match=lost.name):
        ensure_table(catalog, "t.ctas", _KEYED, PartitionSpec(), {}, True)
    assert not lost.exists()


def test_a_declaration_with_another_property_value_is_not_written_back(
    hive_metastore: HiveMetastore,
) -> None:
    """The lost first file of a table created with ``commit.retry.num-retries = 7`` is not
    rebuilt from a declaration that says 8: that table is not the one declared."""
    catalog = _hive_catalog(hive_metastore)
    created = ensure_table(
        catalog, "t.pv", _KEYED, PartitionSpec(), {"commit.retry.num-retries": "7"}, True
    )
    lost = _lose(created.metadata_location)
    with pytest.raises(CatalogError, match=lost.name):
        ensure_table(
            catalog, "t.pv", _KEYED, PartitionSpec(), {"commit.retry.num-retries": "8"}, True
        )
    assert not lost.exists()


def test_a_first_file_that_cannot_be_written_back_reports_the_load_error(
    hive_metastore: HiveMetastore,
) -> None:
    """Nothing can be written where the lost file was (a plain file stands in for its
    directory): the load's own error, naming the file, not the restore's."""
    catalog = _hive_catalog(hive_metastore)
    created = ensure_table(catalog, "t.ro", _KEYED, PartitionSpec(), {}, True)
    lost = _local_path(created.metadata_location)
    shutil.rmtree(lost.parent)
    lost.parent.write_text("not a directory")
    with pytest.raises(CatalogError, match=f"cannot load table 't.ro'.*{lost.name}"):
        ensure_table(catalog, "t.ro", _KEYED, PartitionSpec(), {}, True)


async def test_the_replica_that_created_a_table_commits_after_another_wrote_it_back(
    make_daemon: MakeDaemon,
) -> None:
    """The create race as it happens: a daemon created the table (its metadata, with its
    uuid, in memory), the metastore's loser deleted the first metadata file, another
    replica wrote it back (a uuid of its own). The first daemon's records still evolve
    the table (a new column) and commit."""
    home, daemon = make_daemon(batch_timeout="200ms", extra='evolve = "add-columns"\n')
    daemon.start()
    await daemon.wait_ready()
    table, _ = home.load_table()
    lost = _lose(table.metadata_location)
    assert lost.name.startswith("00000-"), lost
    declared = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "v", StringType(), required=False),
    )
    replica = load_catalog("lake", home.catalog_properties)
    ensure_table(replica, TABLE, declared, PartitionSpec(), {}, True)
    assert lost.exists()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, [{**r, "extra": "x"} for r in _records(range(10))])
        await daemon.flush(session)
    rows, _ = home.read_rows()
    assert sorted(row["id"] for row in rows) == list(range(10)), daemon.tail()
    assert {row["extra"] for row in rows} == {"x"}


async def test_spools_taking_over_their_ended_claims_at_once_each_get_theirs(
    hive_metastore: HiveMetastore,
) -> None:
    """Four replicas on one machine were killed -9 (their claims stay, their pids are
    gone) and start again at once, 10 times over: each takes its own ended claim over.
    Another replica's write of the whole property map may put back this one's old claim,
    which it then writes again; only a live holder's claim (a new beat) is a contest."""
    props = hive_metastore.catalog_properties(hive_metastore.warehouse())
    catalogs = [load_catalog("replica", props) for _ in range(4)]
    for round_ in range(10):
        namespace = (f"ended{round_}",)
        mes = [Incarnation.current() for _ in catalogs]
        # An earlier incarnation of this pid (another start time): it has ended.
        ended = {
            holder_key(f"spool-{i}"): (
                f"{dataclasses.replace(me, tag=secrets.token_hex(6), start_ticks='1').record} 7"
            )
            for i, me in enumerate(mes)
        }
        catalogs[0].create_namespace(namespace, ended)
        claims = [
            SpoolClaim(c, namespace, f"spool-{i}", mes[i], ttl=30, request_timeout=10)
            for i, c in enumerate(catalogs)
        ]
        results = await asyncio.gather(*(c.acquire() for c in claims), return_exceptions=True)
        contested = [str(r) for r in results if isinstance(r, SpoolContestedError)]
        assert contested == [], (round_, contested)
        assert not [r for r in results if isinstance(r, BaseException)], results
        for claim in claims:
            await claim.release()
