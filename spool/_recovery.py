"""Recovery: verify leftover segments, cut torn tails, quarantine what is corrupt."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ._format import EOS, Encoder, Scan, decode, empty_batch, scan, schema_message_of
from ._names import fsync_directory, segment_id_of

QUARANTINE = "quarantine"
REASON_SUFFIX = ".reason.json"
_log = logging.getLogger("icespool.spool")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A sealed segment waiting for its owner to commit and delete it."""

    id: str
    table: str
    path: Path
    bytes: int
    batches: int
    rows: int


@dataclass(slots=True)
class RecoveryReport:
    """What opening the spool found. Every field is also logged."""

    segments: list[SegmentInfo] = field(default_factory=list)
    truncated: list[tuple[Path, int]] = field(default_factory=list)  # (file, bytes cut)
    quarantined: list[tuple[Path, str]] = field(default_factory=list)  # (new path, reason)
    removed_empty: list[Path] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(s.rows for s in self.segments)


@dataclass(frozen=True, slots=True)
class QuarantinedSegment:
    """A segment in ``quarantine/``: kept, never committed until restored."""

    id: str | None  # None when the file name is not a segment's
    table: str | None  # None when nothing readable says which table owns it
    path: Path
    bytes: int
    reason: str
    at: float  # when it was quarantined (seconds since the epoch)


def quarantine(directory: Path, path: Path, reason: str, table: str | None = None) -> Path:
    """Move a file to ``quarantine/`` (never delete it) with its reason, and say so loudly.

    The reason is written beside it (``<name>.reason.json``) so that a restart,
    ``/v1/status`` and an operator see why, not only that.
    """
    target_dir = directory / QUARANTINE
    target_dir.mkdir(exist_ok=True)
    target = target_dir / path.name
    sidecar = target_dir / (path.name + REASON_SUFFIX)
    note = {"reason": reason, "table": table, "at": time.time()}
    # The reason first: a crash between the two leaves a reason without a file
    # (ignored), never a quarantined file nobody can explain.
    _write_small(sidecar, json.dumps(note).encode())
    os.replace(path, target)
    fsync_directory(target_dir)
    fsync_directory(directory)
    _log.error(
        "segment quarantined: %s (%s); its records are NOT committed - inspect it, "
        "it is kept at %s",
        path.name,
        reason,
        target,
        extra={"segment": path.name, "reason": reason},
    )
    return target


def list_quarantined(directory: Path) -> list[QuarantinedSegment]:
    """Every file in ``quarantine/`` with its reason, oldest segment id first."""
    target_dir = directory / QUARANTINE
    if not target_dir.is_dir():
        return []
    found: list[QuarantinedSegment] = []
    for path in target_dir.iterdir():
        if path.name.endswith(REASON_SUFFIX) or not path.is_file():
            continue
        note: dict[str, object] = {}
        sidecar = target_dir / (path.name + REASON_SUFFIX)
        try:
            loaded = json.loads(sidecar.read_bytes())
            if isinstance(loaded, dict):
                note = loaded
        except (OSError, ValueError):
            pass  # quarantined by an older version, or the note is damaged
        table = note.get("table")
        at = note.get("at")
        try:
            size = path.stat().st_size
        except OSError:
            continue  # removed by an operator while we looked
        found.append(
            QuarantinedSegment(
                id=segment_id_of(path.name),
                table=table if isinstance(table, str) else None,
                path=path,
                bytes=size,
                reason=str(note.get("reason", "unknown (no reason recorded)")),
                at=float(at) if isinstance(at, (int, float)) else path.stat().st_mtime,
            )
        )
    return sorted(found, key=lambda q: (q.id or "", q.path.name))


def _write_small(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def recover(directory: Path) -> RecoveryReport:
    """Verify every leftover segment in creation order. Blocking."""
    report = RecoveryReport()
    candidates: list[tuple[str, Path]] = []
    for path in directory.iterdir():
        if not path.is_file() or not path.name.endswith(".arrow"):
            continue
        segment_id = segment_id_of(path.name)
        if segment_id is None:
            report.quarantined.append(
                (quarantine(directory, path, "not a segment file name"), "bad name")
            )
            continue
        candidates.append((segment_id, path))
    for segment_id, path in sorted(candidates):
        _recover_one(directory, segment_id, path, report)
    if report.segments or report.truncated or report.quarantined or report.removed_empty:
        _log.info(
            "spool recovery: %d segments (%d records) to commit, %d torn tails cut, "
            "%d quarantined, %d empty removed",
            len(report.segments),
            report.records,
            len(report.truncated),
            len(report.quarantined),
            len(report.removed_empty),
            extra={
                "segments": len(report.segments),
                "records": report.records,
                "truncated": len(report.truncated),
                "quarantined": len(report.quarantined),
            },
        )
    return report


def _recover_one(directory: Path, segment_id: str, path: Path, report: RecoveryReport) -> None:
    data = path.read_bytes()
    try:
        result = scan(data)
    except Exception as exc:  # scan reports damage itself; anything else is still damage
        reason = f"unreadable: {exc}"
        report.quarantined.append((quarantine(directory, path, reason), reason))
        return
    if result.error is not None:
        report.quarantined.append((quarantine(directory, path, result.error), result.error))
        return
    cut = 0 if result.clean_end else len(data) - result.good_end
    if cut:
        report.truncated.append((path, cut))
        _log.warning(
            "segment %s: torn tail of %d bytes cut off (kill or crash mid-append); "
            "%d complete batches recovered",
            path.name,
            cut,
            result.batches,
            extra={"segment": path.name, "bytes_cut": cut, "batches": result.batches},
        )
    if result.batches == 0 or result.table is None:
        # Acks happen only after a whole batch is written, so a file without one
        # holds nothing anybody was promised.
        path.unlink()
        fsync_directory(directory)
        report.removed_empty.append(path)
        return
    if not result.clean_end:
        _finish(path, data, result)
        data = path.read_bytes()
    rows = sum(b.num_rows for b in decode(data, len(data)).batches)
    report.segments.append(
        SegmentInfo(segment_id, result.table, path, len(data), result.batches, rows)
    )


def _finish(path: Path, data: bytes, result: Scan) -> None:
    """Cut the torn tail and seal, so the file is a complete stream from now on."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, result.good_end)
        os.lseek(fd, result.good_end, os.SEEK_SET)
        if result.sealed:
            tail: bytes = EOS
        else:
            schema_message = schema_message_of(data)
            schema = ipc.read_schema(pa.py_buffer(schema_message))
            encoder = Encoder(schema, schema_message)
            tail = bytes(encoder.encode(empty_batch(schema), None, seal=True)) + EOS
        os.write(fd, tail)
        os.fsync(fd)
    finally:
        os.close(fd)
