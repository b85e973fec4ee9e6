"""Another writer on the daemon's tables, with pyiceberg: snapshot expiry, and compaction of
an append table (a few of its files rewritten as one, in one ``overwrite`` snapshot).

Both are plain pyiceberg commits: a commit that loses the race with a replica's is not
retried. Neither deletes a file (pyiceberg's expiry only drops snapshots from the
metadata; the daemon's own expiry deletes what only expired snapshots reached)."""

from __future__ import annotations

import datetime as dt
import random
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io.pyarrow import parquet_file_to_data_file

__all__ = ["compact", "expire"]


def expire(catalog: Catalog, name: str, older_than: float = 2.0) -> str:
    """Expire every snapshot of ``name`` older than ``older_than`` seconds (never a ref
    head); what happened, for the fault's record."""
    table = catalog.load_table(name)
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than)
    before = len(table.snapshots())
    try:
        table.maintenance.expire_snapshots().older_than(cut).commit()
    except CommitFailedException:
        return "lost a race with a replica"
    return f"{before} -> {len(table.snapshots())} snapshots"


def compact(catalog: Catalog, name: str, rng: random.Random) -> str:
    """Rewrite 2-6 of ``name``'s live data files as one."""
    table = catalog.load_table(name)
    files = [task.file for task in table.scan().plan_files()]
    if len(files) < 2:
        return "fewer than 2 files"
    chosen = rng.sample(files, min(len(files), rng.randint(2, 6)))
    parts = []
    for data_file in chosen:
        with table.io.new_input(data_file.file_path).open() as stream:
            parts.append(pq.read_table(stream))
    rows = pa.concat_tables(parts)
    path = f"{table.location()}/data/outside-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(rows, out)
    new_file = parquet_file_to_data_file(table.io, table.metadata, path)
    try:
        with (
            table.transaction() as transaction,
            transaction.update_snapshot().overwrite() as overwrite,
        ):
            for data_file in chosen:
                overwrite.delete_data_file(data_file)
            overwrite.append_data_file(new_file)
    except (CommitFailedException, ValidationException):
        # A replica committed meanwhile: its files match the overwrite's conflict filter
        # (ValidationException), or the catalog refused the stale base.
        table.io.delete(path)
        return "lost a race with a replica"
    return f"{len(chosen)} files ({rows.num_rows} rows) -> 1"
