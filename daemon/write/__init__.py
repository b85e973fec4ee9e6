"""The write path: from a decoded batch to a committed Iceberg snapshot, per table.

ingest       the one way in (HTTP, Kafka, Python API): decode, evolve or create, append
writer       `TableWriter`: owns a table's queue and flush job, and what they share
             (the table, its schema, the settings a SIGHUP replaces, the cadence)
queue        spool appends (the ack), pending counts, the flush triggers
flush        seal -> read back -> encode -> commit; strikes and quarantine
result       `FlushResult`: what a flush committed
rows         how spooled rows become one commit: `AppendRows` (append tables)
upserts      `UpsertRows`: last change per key, deletes by position through the key index
upsert_changes  one upsert commit attempt's changes: merged position deletes, the tail
index_keeper `IndexKeeper`: an upsert table's key index, ready for its commits or not
cadence      how long past ``batch_timeout`` a table waits while its commits collide
pressure     an append the spool refused for room commits the tables holding it
early_acks   acks while the start waits for the catalog
encode_pool  the threads a flush's heavy work runs in, at a lower priority
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.write.cadence import Cadence
    from icespool.write.early_acks import EarlyAcks, known_schemas
    from icespool.write.encode_pool import NICENESS, flush_calls, flush_executor, in_flush_thread
    from icespool.write.flush import SEGMENT_ATTEMPTS, FlushJob, Ledger, UncommittableSegmentError
    from icespool.write.ingest import AUTO_CREATED, Column, Ingest, TableInput, Tables
    from icespool.write.pressure import PressureRelief
    from icespool.write.queue import Flusher, TableQueue
    from icespool.write.result import FlushResult
    from icespool.write.rows import AppendRows, CommitMarks, Encoded, TableRows
    from icespool.write.upserts import UpsertRows
    from icespool.write.writer import KEY_INDEX_DIR, TableWriter

__all__ = [
    "AUTO_CREATED",
    "KEY_INDEX_DIR",
    "NICENESS",
    "SEGMENT_ATTEMPTS",
    "AppendRows",
    "Cadence",
    "Column",
    "CommitMarks",
    "EarlyAcks",
    "Encoded",
    "FlushJob",
    "FlushResult",
    "Flusher",
    "Ingest",
    "Ledger",
    "PressureRelief",
    "TableInput",
    "TableQueue",
    "TableRows",
    "TableWriter",
    "Tables",
    "UncommittableSegmentError",
    "UpsertRows",
    "flush_calls",
    "flush_executor",
    "in_flush_thread",
    "known_schemas",
]

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.write.cadence": ("Cadence",),
        "icespool.write.early_acks": ("EarlyAcks", "known_schemas"),
        "icespool.write.encode_pool": (
            "NICENESS",
            "flush_calls",
            "flush_executor",
            "in_flush_thread",
        ),
        "icespool.write.flush": (
            "SEGMENT_ATTEMPTS",
            "FlushJob",
            "Ledger",
            "UncommittableSegmentError",
        ),
        "icespool.write.ingest": (
            "AUTO_CREATED",
            "Column",
            "Ingest",
            "TableInput",
            "Tables",
        ),
        "icespool.write.pressure": ("PressureRelief",),
        "icespool.write.queue": ("Flusher", "TableQueue"),
        "icespool.write.result": ("FlushResult",),
        "icespool.write.rows": ("AppendRows", "CommitMarks", "Encoded", "TableRows"),
        "icespool.write.upserts": ("UpsertRows",),
        "icespool.write.writer": ("KEY_INDEX_DIR", "TableWriter"),
    },
)
