"""icespool's durable on-disk spool: Arrow IPC segments, group commit, verified recovery.

Knows nothing about Iceberg or Kafka; the daemon owns what the batches mean.
"""

from ._errors import (
    SegmentCorruptError,
    SpoolClosedError,
    SpoolError,
    SpoolFullError,
    SpoolIOError,
    SpoolLockedError,
    UnknownSegmentError,
)
from ._fs import FileSystem
from ._incarnation import Incarnation
from ._names import new_segment_id as new_uuid7
from ._names import segment_file_name, segment_writer, table_file_stem
from ._recovery import QuarantinedSegment, RecoveryReport, SegmentInfo
from ._spool import AppendAck, Durability, SegmentData, Spool, SpoolStats, TableUsage

__all__ = [
    "AppendAck",
    "Durability",
    "FileSystem",
    "Incarnation",
    "QuarantinedSegment",
    "RecoveryReport",
    "SegmentCorruptError",
    "SegmentData",
    "SegmentInfo",
    "Spool",
    "SpoolClosedError",
    "SpoolError",
    "SpoolFullError",
    "SpoolIOError",
    "SpoolLockedError",
    "SpoolStats",
    "TableUsage",
    "UnknownSegmentError",
    "new_uuid7",
    "segment_file_name",
    "segment_writer",
    "table_file_stem",
]
