"""icespool's durable on-disk spool: Arrow IPC segments, group commit, verified recovery.

Knows nothing about Iceberg or Kafka; the daemon owns what the batches mean.
"""

from ._errors import (
    SegmentCorruptError,
    SpoolClosedError,
    SpoolError,
    SpoolFullError,
    SpoolLockedError,
    UnknownSegmentError,
)
from ._names import segment_file_name
from ._recovery import QuarantinedSegment, RecoveryReport, SegmentInfo
from ._spool import AppendAck, Durability, SegmentData, Spool, SpoolStats, TableUsage

__all__ = [
    "AppendAck",
    "Durability",
    "QuarantinedSegment",
    "RecoveryReport",
    "SegmentCorruptError",
    "SegmentData",
    "SegmentInfo",
    "Spool",
    "SpoolClosedError",
    "SpoolError",
    "SpoolFullError",
    "SpoolLockedError",
    "SpoolStats",
    "TableUsage",
    "UnknownSegmentError",
    "segment_file_name",
]
