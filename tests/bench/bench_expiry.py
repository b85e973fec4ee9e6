"""Snapshot expiry on a long-lived table: the first maintenance run of a table with
thousands of snapshots, all older than the retention (issue #13).

Run: .venv/bin/python tests/bench/bench_expiry.py [--snapshots N] [--merge-every K] [--dir D]

The table is built directly with pyiceberg's manifest writers (committing N snapshots
one by one costs O(N^2) and takes far longer than the expiry): N appends of one data
file each, as the daemon's fast appends leave them (snapshot k lists k manifests), or
with ``--merge-every K`` as a merging writer leaves them (every K appends the manifests
so far are merged into one, so a list holds at most K + 1); then an overwrite that
replaces every data file by one (a compaction), then 9 appends. Everything but the
newest 10 snapshots is 7 hours old.

The expiry then runs as the daemon's EXPIRE task does (min_snapshots 10): the commit,
the search for files only expired snapshots reached, the deletion. Printed: the time of
each step, manifest lists and manifests read, files removed by kind, and a check that
what remains on disk is exactly what the retained snapshots reach.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, SetSnapshotRefUpdate
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField

from icespool.iceberg import commit_expiry
from icespool.maintenance import choose_expired, delete_files, find_garbage

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))
HOUR_MS = 3_600_000


def _data_file(path: str) -> DataFile:
    Path(path.removeprefix("file://")).write_bytes(b"PAR1" + b"\0" * 60)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=64,
    )


def _manifest(
    table: Table, name: str, snapshot_id: int, entries: list[ManifestEntry]
) -> ManifestFile:
    output = table.io.new_output(f"{table.metadata.location}/metadata/{name}.avro")
    with write_manifest(2, UNPARTITIONED_PARTITION_SPEC, SCHEMA, output, snapshot_id, "zstd") as w:
        for entry in entries:
            w.add_entry(entry)
    return w.to_manifest_file()


def _entry(
    status: ManifestEntryStatus, snapshot_id: int, seq: int | None, f: DataFile
) -> ManifestEntry:
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=seq,
        file_sequence_number=seq,
        data_file=f,
    )


def build(table: Table, snapshots: int, merge_every: int) -> None:
    location = table.metadata.location
    os.makedirs(f"{location.removeprefix('file://')}/data", exist_ok=True)
    old = int(time.time() * 1000) - 7 * HOUR_MS
    live: list[ManifestFile] = []
    files: list[tuple[DataFile, int, int]] = []  # file, adding snapshot, sequence
    updates: list[object] = []
    parent: int | None = None
    seq = 0

    def commit_snapshot(sid: int, manifests: list[ManifestFile], ts: int, op: Operation) -> None:
        nonlocal parent
        path = f"{location}/metadata/snap-{sid}.avro"
        with write_manifest_list(2, table.io.new_output(path), sid, parent, seq, "zstd") as lw:
            lw.add_manifests(manifests)
        updates.append(
            AddSnapshotUpdate(
                snapshot=Snapshot(
                    snapshot_id=sid,
                    parent_snapshot_id=parent,
                    sequence_number=seq,
                    timestamp_ms=ts,
                    manifest_list=path,
                    summary=Summary(op),
                    schema_id=0,
                )
            )
        )
        parent = sid

    def sealed(manifest: ManifestFile) -> ManifestFile:
        manifest.sequence_number = seq
        manifest.min_sequence_number = seq
        return manifest

    def append(k: int, ts: int) -> None:
        nonlocal seq, live
        seq += 1
        sid = random.getrandbits(62)
        f = _data_file(f"{location}/data/f{k:05d}.parquet")
        if merge_every and k % merge_every == 0:
            # This append's manifest merges every live one (as MergeAppend does).
            entries = [_entry(ManifestEntryStatus.EXISTING, s, q, f) for f, s, q in files]
            entries.append(_entry(ManifestEntryStatus.ADDED, sid, None, f))
            merged = _manifest(table, f"merged{k:05d}", sid, entries)
            merged.sequence_number, merged.min_sequence_number = seq, 1
            live = [merged]
        else:
            added = _manifest(
                table, f"m{k:05d}", sid, [_entry(ManifestEntryStatus.ADDED, sid, None, f)]
            )
            live = [sealed(added), *live]
        files.append((f, sid, seq))
        commit_snapshot(sid, live, ts, Operation.APPEND)

    for k in range(1, snapshots + 1):
        append(k, old + k)
    # A compaction: every file replaced by one.
    seq += 1
    sid = random.getrandbits(62)
    deleted = [_entry(ManifestEntryStatus.DELETED, sid, q, f) for f, _, q in files]
    gone = _manifest(table, "overwrite-deleted", sid, deleted)
    gone.sequence_number, gone.min_sequence_number = seq, 1
    compacted = _data_file(f"{location}/data/compacted.parquet")
    files = [(compacted, sid, seq)]
    added = sealed(
        _manifest(
            table, "overwrite-added", sid, [_entry(ManifestEntryStatus.ADDED, sid, None, compacted)]
        )
    )
    live = [added]
    now = int(time.time() * 1000)
    commit_snapshot(sid, [added, gone], now - 10_000, Operation.OVERWRITE)
    for k in range(snapshots + 1, snapshots + 10):
        append(k, now - 10_000 + k - snapshots)
    updates.append(SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=parent))
    transaction = table.transaction()
    transaction._apply(tuple(updates))  # type: ignore[arg-type]
    transaction.commit_transaction()


def on_disk(root: str) -> int:
    return sum(len(names) for _, _, names in os.walk(root))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshots", type=int, default=2000)
    parser.add_argument("--merge-every", type=int, default=0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-expiry-", dir=args.dir)
    try:
        catalog = SqlCatalog(
            "bench", uri=f"sqlite:///{base}/catalog.db", warehouse=f"file://{base}/wh"
        )
        catalog.create_namespace("b")
        table = catalog.create_table("b.t", SCHEMA)
        began = time.perf_counter()
        build(table, args.snapshots, args.merge_every)
        table = catalog.load_table("b.t")
        root = table.metadata.location.removeprefix("file://")
        before = on_disk(root)
        print(
            f"built {len(table.metadata.snapshots)} snapshots "
            f"({'fast appends' if not args.merge_every else f'merged every {args.merge_every}'}), "
            f"{before} files, metadata.json "
            f"{os.path.getsize(table.metadata_location.removeprefix('file://')) / 1024:.0f} KiB "
            f"in {time.perf_counter() - began:.1f}s"
        )

        def choose(metadata: object) -> set[int]:
            return choose_expired(
                metadata,  # type: ignore[arg-type]
                max_age_ms=6 * HOUR_MS,
                min_snapshots=10,
                max_snapshots=2000,
                now_ms=int(time.time() * 1000),
            )

        t0 = time.perf_counter()
        if os.environ.get("PROFILE"):
            import cProfile
            import pstats

            profile = cProfile.Profile()
            expired = profile.runcall(commit_expiry, table, choose)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
        else:
            expired = commit_expiry(table, choose)
        t1 = time.perf_counter()
        assert expired is not None
        garbage = find_garbage(table.io, expired.snapshots, table.metadata, deadline=float("inf"))
        t2 = time.perf_counter()
        outcome = delete_files(table.io, garbage.files, limit=10**9, deadline=float("inf"))
        t3 = time.perf_counter()
        assert not outcome.failed and not outcome.left
        after = on_disk(root)
        reached = set()
        for snapshot in table.metadata.snapshots:
            reached.add(snapshot.manifest_list)
            for manifest in snapshot.manifests(table.io):
                reached.add(manifest.manifest_path)
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    reached.add(entry.data_file.file_path)
        metadata_json = sum(
            1 for n in os.listdir(f"{root}/metadata") if n.endswith(".metadata.json")
        )
        print(
            f"expired {len(expired.snapshots)} snapshots: commit {t1 - t0:.2f}s, "
            f"find garbage {t2 - t1:.2f}s ({garbage.lists_read} manifest lists, "
            f"{garbage.manifests_read} manifests read), delete {t3 - t2:.2f}s; "
            f"total {t3 - t0:.2f}s"
        )
        print(f"removed {sum(outcome.removed.values())} files: {outcome.removed}")
        print(
            f"left {after} files: {len(reached)} reached by the {len(table.metadata.snapshots)} "
            f"retained snapshots + {metadata_json} metadata.json"
        )
        assert after == len(reached) + metadata_json, "unreachable files left, or reachable deleted"
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
