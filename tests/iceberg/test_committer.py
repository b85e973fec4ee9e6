"""One-snapshot commits: round trip, idempotence, unknown outcomes (also of property and
schema commits), concurrent writers.

Runs against a real SQLite SQL catalog and, for the multi-process race, the real
PostgreSQL on 127.0.0.1:5432 (a fresh database per run, dropped afterwards).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.manifest import DataFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.transforms import IdentityTransform
from sqlalchemy import event
from support.postgres import scratch_database, sqlalchemy_uri

from icespool.errors import CommitError
from icespool.iceberg import (
    SEGMENTS_SUMMARY_KEY,
    CommitResult,
    IcespoolSqlCatalog,
    StaleEncodingError,
    commit_evolution,
    commit_files,
    commit_properties,
    find_committed_segments,
    last_segments_key,
)
from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.iceberg._parquet import encode_data_files
from icespool.runtime.retry import Backoff
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

REPO = Path(__file__).resolve().parents[2]
FAST = Backoff(attempts=6, base=0.001, cap=0.02)
COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "kind", "type": "string"},
    # Not a valid Avro name: stored sanitized in Parquet, read back by field id.
    {"name": "event-type", "type": "string"},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "ok", "type": "boolean"},
]


def _props(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return load_catalog("lake", _props(tmp_path))


def _create(catalog: Catalog, properties: dict[str, str] | None = None) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, ["day(ts)"])
    return ensure_table(catalog, "demo.events", schema, spec, properties or {}, create=True)


def _rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": ids,
            "ts": [dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(hours=7 * i) for i in ids],
            "kind": [None if i % 5 == 0 else f"k{i % 3}" for i in ids],
            "event-type": [f"type-{i % 4}" for i in ids],
            "amount": [decimal.Decimal(i) / 100 for i in ids],
            "ok": [i % 2 == 0 for i in ids],
        }
    )


def _encode(table: Table, rows: pa.Table, prefix: str) -> list[DataFile]:
    return encode_data_files(
        table,
        [conform(rows, arrow_schema_for(table))],
        target_file_size=1 << 20,
        row_group_records=10_000,
        compression="zstd",
        file_prefix=prefix,
    )


def _read_back(table: Table) -> pa.Table:
    return table.scan().to_arrow().sort_by("id")


def test_round_trip_one_snapshot_with_segments_and_summary(catalog: Catalog) -> None:
    table = _create(catalog)
    rows = _rows(0, 500)
    files = _encode(table, rows, "seg-1")
    assert len(files) > 1  # day(ts) partitions: several files, still one snapshot
    result = commit_files(
        table,
        files,
        segment_ids=["seg-1", "seg-2"],
        summary={"icespool.reason": "records", "kafka.offsets": '{"t/0": 41}'},
        retry=FAST,
    )
    assert result == CommitResult(
        snapshot_id=result.snapshot_id,
        records=500,
        files=len(files),
        bytes=sum(f.file_size_in_bytes for f in files),
        already_committed=False,
        attempts=1,
    )
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    summary = table.snapshots()[0].summary
    assert summary is not None
    assert summary[SEGMENTS_SUMMARY_KEY] == "seg-1,seg-2"
    assert summary["icespool.reason"] == "records"
    assert summary["kafka.offsets"] == '{"t/0": 41}'
    assert summary["added-records"] == "500"
    assert summary.operation.value == "append"

    fresh = catalog.load_table("demo.events")
    back = _read_back(fresh)
    expected = conform(rows, arrow_schema_for(fresh))
    assert back.schema.types == expected.schema.types
    assert back.column_names == expected.schema.names
    assert back.to_pylist() == expected.to_pylist()


def test_same_segments_twice_give_one_snapshot(catalog: Catalog) -> None:
    table = _create(catalog)
    files = _encode(table, _rows(0, 100), "seg-9")
    first = commit_files(table, files, segment_ids=["seg-9"], summary={}, retry=FAST)
    # A second process (e.g. after a crash before the spool delete) with its own table.
    other = catalog.load_table("demo.events")
    second = commit_files(other, files, segment_ids=["seg-9"], summary={}, retry=FAST)
    assert second == CommitResult(
        snapshot_id=first.snapshot_id,
        records=100,
        files=len(files),
        bytes=first.bytes,
        already_committed=True,
        attempts=1,
    )
    other.refresh()
    assert len(other.snapshots()) == 1
    assert other.scan().to_arrow().num_rows == 100
    assert find_committed_segments(other, ["seg-9", "seg-10"]) == {"seg-9": first.snapshot_id}


def test_partly_committed_segment_set_is_refused(catalog: Catalog) -> None:
    table = _create(catalog)
    commit_files(table, _encode(table, _rows(0, 10), "a"), segment_ids=["a"], summary={})
    files = _encode(table, _rows(10, 10), "a-b")
    with pytest.raises(CommitError, match=r"segments \['a'\] are already committed") as info:
        commit_files(table, files, segment_ids=["a", "b"], summary={}, retry=FAST)
    assert "['b'] are not" in str(info.value)
    assert len(table.snapshots()) == 1


def test_rolled_back_snapshot_still_counts_as_committed(catalog: Catalog) -> None:
    table = _create(catalog)
    first = commit_files(table, _encode(table, _rows(0, 10), "a"), segment_ids=["a"], summary={})
    b_files = _encode(table, _rows(10, 10), "b")
    second = commit_files(table, b_files, segment_ids=["b"], summary={})
    table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    table.refresh()
    assert table.current_snapshot() is not None
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # type: ignore[union-attr]
    # B's snapshot is no longer an ancestor of the current one, but it is in the metadata.
    assert find_committed_segments(table, ["a", "b"]) == {
        "a": first.snapshot_id,
        "b": second.snapshot_id,
    }
    again = commit_files(table, b_files, segment_ids=["b"], summary={}, retry=FAST)
    assert again.already_committed
    assert again.snapshot_id == second.snapshot_id
    assert table.scan().to_arrow().num_rows == 10  # the operator's rollback stands


class _LossyCatalog(IcespoolSqlCatalog):
    """The daemon's SQL catalog, its commits failing in scripted ways (fault injection).

    ``faults`` is consumed one entry per commit: "after" commits and then reports an
    unknown outcome (a lost response); "before" fails without committing (a connection
    reset before the request reached the database); None commits normally.
    ``load_failures``: that many reads of the table's catalog row fail (a refresh,
    whether it loads the metadata or only asks whether it changed).
    """

    faults: list[str | None]
    load_failures = 0

    def fail_reads(self) -> None:
        event.listen(self.engine, "before_cursor_execute", self._read)

    def _read(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        reads_row = statement.lstrip().upper().startswith("SELECT")
        if self.load_failures and reads_row and "iceberg_tables" in statement:
            self.load_failures -= 1
            raise ConnectionRefusedError("catalog unreachable (injected)")

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        fault = self.faults.pop(0) if self.faults else None
        if fault == "before":
            raise ConnectionResetError("connection reset by peer (injected)")
        response = super().commit_table(table, requirements, updates)
        if fault == "after":
            raise CommitStateUnknownException("response lost after commit (injected)")
        return response


def _lossy(tmp_path: Path, faults: list[str | None]) -> Table:
    props = _props(tmp_path)
    del props["type"]
    lossy = _LossyCatalog("lake", **props)
    lossy.faults = faults
    lossy.fail_reads()
    return lossy.load_table("demo.events")


def test_unknown_outcome_that_landed_is_not_committed_again(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    table = _lossy(tmp_path, ["after"])
    files = _encode(table, _rows(0, 50), "s1")
    result = commit_files(table, files, segment_ids=["s1"], summary={}, retry=FAST)
    assert result.already_committed is False  # it was our attempt that landed
    assert result.attempts == 2  # resolved by looking, not by committing again
    assert result.records == 50
    check = catalog.load_table("demo.events")
    assert [s.snapshot_id for s in check.snapshots()] == [result.snapshot_id]
    assert check.scan().to_arrow().num_rows == 50


def test_unknown_outcome_that_did_not_land_is_retried_once(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    table = _lossy(tmp_path, ["before"])
    files = _encode(table, _rows(0, 50), "s1")
    result = commit_files(table, files, segment_ids=["s1"], summary={}, retry=FAST)
    assert result.already_committed is False
    assert result.attempts == 2
    check = catalog.load_table("demo.events")
    assert [s.snapshot_id for s in check.snapshots()] == [result.snapshot_id]
    assert check.scan().to_arrow().num_rows == 50


def test_unreachable_catalog_during_refresh_is_retried(catalog: Catalog, tmp_path: Path) -> None:
    _create(catalog)
    table = _lossy(tmp_path, [])
    assert isinstance(table.catalog, _LossyCatalog)
    table.catalog.load_failures = 2
    files = _encode(table, _rows(0, 7), "s1")
    result = commit_files(table, files, segment_ids=["s1"], summary={}, retry=FAST)
    assert (result.attempts, result.records, result.already_committed) == (3, 7, False)
    assert len(catalog.load_table("demo.events").snapshots()) == 1


def test_a_property_commit_whose_answer_was_lost_is_found_by_looking(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    table = _lossy(tmp_path, ["after"])
    assert commit_properties(table, lambda _: {"icespool.test": "x"}, retry=FAST)
    assert catalog.load_table("demo.events").properties["icespool.test"] == "x"


def test_a_property_commit_that_failed_before_landing_leaves_the_retry_to_its_caller(
    catalog: Catalog, tmp_path: Path
) -> None:
    """Property commits run on their callers' schedule (the next tick, the next run):
    a catalog that failed them ends the call with its error, nothing committed."""
    _create(catalog)
    table = _lossy(tmp_path, ["before"])
    with pytest.raises(ConnectionResetError):
        commit_properties(table, lambda _: {"icespool.test": "x"}, retry=FAST)
    assert "icespool.test" not in catalog.load_table("demo.events").properties


def test_a_schema_change_whose_answer_was_lost_is_found_by_looking(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    table = _lossy(tmp_path, ["after"])
    incoming = pa.schema([("extra", pa.string())])
    plan = commit_evolution(table, incoming, "add-columns", max_columns=100)
    assert plan.describe() == "add extra string"
    assert "extra" in catalog.load_table("demo.events").schema().column_names
    assert not commit_evolution(table, incoming, "add-columns", max_columns=100)


def test_gives_up_after_bounded_attempts_and_says_the_spool_keeps_the_data(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    table = _lossy(tmp_path, ["before"] * 3)
    files = _encode(table, _rows(0, 5), "s1")
    policy = Backoff(attempts=3, base=0.001, cap=0.002)
    with pytest.raises(CommitError, match="the spool still holds the records") as info:
        commit_files(table, files, segment_ids=["s1"], summary={}, retry=policy)
    assert "failed after 3 attempts (ConnectionResetError" in str(info.value)
    assert catalog.load_table("demo.events").snapshots() == []


def test_a_commit_that_gives_up_on_conflicts_says_how_many(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits before each of our swaps: every attempt conflicts, the
    call gives up, and its error carries the count (the writer's metric reads it)."""
    _create(catalog)
    ours = load_catalog("lake", _props(tmp_path)).load_table("demo.events")
    other = load_catalog("lake", _props(tmp_path)).load_table("demo.events")
    send = ours.catalog.commit_table
    raced: list[int] = []

    def commit_table(table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        first = 1000 + 10 * len(raced)
        raced.append(first)
        theirs = f"other-{first}"
        commit_files(
            other, _encode(other, _rows(first, 2), theirs), segment_ids=[theirs], summary={}
        )
        return send(table, requirements, updates)

    monkeypatch.setattr(ours.catalog, "commit_table", commit_table)
    files = _encode(ours, _rows(0, 5), "s1")
    policy = Backoff(attempts=3, base=0.001, cap=0.002)
    with pytest.raises(CommitError, match="failed after 3 attempts") as info:
        commit_files(ours, files, segment_ids=["s1"], summary={}, retry=policy)
    assert "CommitFailedException" in str(info.value)
    assert info.value.conflicts == 3
    table = catalog.load_table("demo.events")
    assert raced == [1000, 1010, 1020]
    assert len(table.snapshots()) == 3  # the other writer's, none of ours
    assert find_committed_segments(table, ["s1"]) == {}
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == [1000, 1001, 1010, 1011, 1020, 1021]


def test_a_stale_table_is_refreshed_first_and_is_no_conflict(
    catalog: Catalog, tmp_path: Path
) -> None:
    _create(catalog)
    ours = load_catalog("lake", _props(tmp_path)).load_table("demo.events")
    other = load_catalog("lake", _props(tmp_path)).load_table("demo.events")
    files = _encode(ours, _rows(0, 5), "s1")
    ours.refresh()
    commit_files(other, _encode(other, _rows(1000, 2), "o1"), segment_ids=["o1"], summary={})
    # ``ours`` is stale, but commit_files refreshes before each attempt: no conflict.
    result = commit_files(ours, files, segment_ids=["s1"], summary={}, retry=FAST)
    assert (result.conflicts, result.attempts, result.records) == (0, 1, 5)


def test_files_encoded_for_an_old_partition_spec_are_refused(catalog: Catalog) -> None:
    table = _create(catalog)
    files = _encode(table, _rows(0, 20), "s1")
    with table.update_spec() as update:
        update.add_field("kind", IdentityTransform(), "kind")
    with pytest.raises(StaleEncodingError, match="re-encode the segments"):
        commit_files(table, files, segment_ids=["s1"], summary={}, retry=FAST)
    assert table.snapshots() == []


@pytest.mark.parametrize(
    ("segments", "summary", "message"),
    [
        ([], {}, "needs the spool segment ids"),
        (["a,b"], {}, "without commas"),
        (["a", "a"], {}, "duplicates"),
        (["a"], {"operation": "x"}, "'operation' is reserved"),
        (["a"], {SEGMENTS_SUMMARY_KEY: "x"}, "is reserved"),
        (["a"], {"total-records": "1"}, "is reserved"),
    ],
)
def test_invalid_requests_are_rejected_before_touching_the_table(
    catalog: Catalog, segments: list[str], summary: dict[str, str], message: str
) -> None:
    table = _create(catalog)
    files = _encode(table, _rows(0, 3), "s1")
    with pytest.raises(ValueError, match=message):
        commit_files(table, files, segment_ids=segments, summary=summary)
    with pytest.raises(ValueError, match="at least one data file"):
        commit_files(table, [], segment_ids=["a"], summary={})
    assert table.snapshots() == []


def test_threads_committing_concurrently_all_land_exactly_once(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = _create(catalog, {"commit.retry.num-retries": "0"})
    writers, commits_each, rows_each = 4, 5, 40
    work: dict[tuple[int, int], list[DataFile]] = {
        (w, c): _encode(table, _rows((w * commits_each + c) * rows_each, rows_each), f"w{w}-{c}")
        for w in range(writers)
        for c in range(commits_each)
    }
    results: dict[int, list[CommitResult]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def writer(w: int) -> None:
        try:
            own = load_catalog("lake", _props(tmp_path)).load_table("demo.events")
            start.wait()
            results[w] = [
                commit_files(
                    own,
                    work[(w, c)],
                    segment_ids=[f"w{w}-{c}"],
                    summary={},
                    retry=Backoff(attempts=50, base=0.002, cap=0.05),
                )
                for c in range(commits_each)
            ]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    table.refresh()
    assert len(table.snapshots()) == writers * commits_each
    segments = [str(s.summary[SEGMENTS_SUMMARY_KEY]) for s in table.snapshots() if s.summary]
    assert sorted(segments) == sorted(
        f"w{w}-{c}" for w in range(writers) for c in range(commits_each)
    )
    ids = table.scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(writers * commits_each * rows_each))
    assert all(not r.already_committed for rs in results.values() for r in rs)
    retries = sum(r.attempts - 1 for rs in results.values() for r in rs)
    print(f"sqlite threads: {retries} conflict retries in {writers * commits_each} commits")


# ---------------------------------------------------------------- PostgreSQL, two processes

_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, os.environ["ICESPOOL_REPO"])
    import pyarrow as pa
    from icespool.iceberg._catalog import load_catalog
    from icespool.iceberg import commit_files
    from icespool.runtime.retry import Backoff
    from icespool.iceberg._parquet import encode_data_files
    from icespool.schema import arrow_schema_for, conform

    worker, commits, rows = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    props = json.loads(os.environ["ICESPOOL_CATALOG"])
    table = load_catalog("lake", props).load_table("race.events")
    prepared = []
    for c in range(commits):
        first = (worker * commits + c) * rows
        batch = pa.table({"id": list(range(first, first + rows)), "w": [worker] * rows})
        files = encode_data_files(
            table, [conform(batch, arrow_schema_for(table))], target_file_size=1 << 20,
            row_group_records=1000, compression="zstd", file_prefix=f"p{worker}-{c}",
        )
        prepared.append((f"p{worker}-{c}", files))
    go = os.environ["ICESPOOL_GO"]
    open(f"{go}.ready{worker}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    attempts = []
    policy = Backoff(attempts=60, base=0.005, cap=0.1)
    for segment, files in prepared:
        result = commit_files(table, files, segment_ids=[segment], summary={}, retry=policy)
        attempts.append(result.attempts)
    print(json.dumps({"attempts": attempts}))
    """
)


@pytest.fixture
def postgres_catalog_props(tmp_path: Path) -> Iterator[dict[str, str]]:
    with scratch_database("icespool_test") as database:
        yield {
            "type": "sql",
            "uri": sqlalchemy_uri(database),
            "warehouse": f"file://{tmp_path}/warehouse",
        }


def test_two_processes_race_on_postgres_and_every_commit_lands_once(
    postgres_catalog_props: dict[str, str], tmp_path: Path
) -> None:
    catalog = load_catalog("lake", postgres_catalog_props)
    schema = parse_schema(
        [{"name": "id", "type": "long", "required": True}, {"name": "w", "type": "int"}]
    )
    # Without pyiceberg's inner retries every conflict goes through our retry loop.
    table = ensure_table(
        catalog,
        "race.events",
        schema,
        parse_partition_spec(schema, []),
        {"commit.retry.num-retries": "0"},
        create=True,
    )
    workers, commits, rows = 2, 12, 50
    go = tmp_path / "go"
    env = {
        **os.environ,
        "ICESPOOL_REPO": str(REPO),
        "ICESPOOL_CATALOG": json.dumps(postgres_catalog_props),
        "ICESPOOL_GO": str(go),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-W", "error", "-c", _WORKER, str(w), str(commits), str(rows)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    # Start both commit loops at the same instant so that they really race.
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}.ready{w}").exists() for w in range(workers)):
        assert time.monotonic() < deadline, "workers did not get ready"
        assert all(p.poll() is None for p in processes), "a worker died early"
        time.sleep(0.01)
    go.touch()
    outputs: list[dict[str, Any]] = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))

    table.refresh()
    assert len(table.snapshots()) == workers * commits
    segments = sorted(str(s.summary[SEGMENTS_SUMMARY_KEY]) for s in table.snapshots() if s.summary)
    assert segments == sorted(f"p{w}-{c}" for w in range(workers) for c in range(commits))
    data = table.scan().to_arrow()
    assert sorted(data.column("id").to_pylist()) == list(range(workers * commits * rows))
    attempts = [a for output in outputs for a in output["attempts"]]
    assert len(attempts) == workers * commits
    assert all(a >= 1 for a in attempts)
    retries = sum(a - 1 for a in attempts)
    print(f"postgres race: {retries} conflict retries in {len(attempts)} commits")
    assert retries > 0, "the two processes never conflicted: the race did not happen"


def test_the_spool_mark_survives_expiry_and_names_only_the_latest_commit(
    catalog: Catalog,
) -> None:
    table = _create(catalog)
    for n, segments in enumerate((["a1", "a2"], ["a3"])):
        files = _encode(table, _rows(n * 100, 100), segments[0])
        commit_files(table, files, segment_ids=segments, summary={}, retry=FAST, spool_id="s1")
    other = _encode(table, _rows(900, 10), "b1")
    commit_files(table, other, segment_ids=["b1"], summary={}, retry=FAST, spool_id="s2")
    assert table.properties[last_segments_key("s1")] == "a3"
    assert table.properties[last_segments_key("s2")] == "b1"
    ours = [s.snapshot_id for s in table.snapshots()[:2]]
    table.maintenance.expire_snapshots().by_ids(ours).commit()
    table.refresh()
    # Summaries of a1..a3 are gone; the property still proves a3 (the only one of
    # spool s1 that can be committed but still spooled), and only for spool s1.
    assert find_committed_segments(table, ["a1", "a2", "a3"]) == {}
    assert find_committed_segments(table, ["a1", "a2", "a3"], "s1") == {"a3": -1}
    assert find_committed_segments(table, ["a1", "a2", "a3"], "s2") == {}
