"""Recovery: verify leftover segments, cut torn tails, quarantine what is corrupt."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ._format import (
    EOS,
    SEALED_BY_RECOVERY,
    Encoder,
    Scan,
    decode,
    empty_batch,
    scan,
    schema_message_of,
)
from ._fs import REAL, FileSystem
from ._names import segment_id_of

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
    # False: sealing failed (full or broken disk); the first `bytes` bytes are a
    # verified prefix, read as such, and the file is sealed at the next start.
    sealed: bool = True
    # Sealed by the process that wrote it: every copy of it holds these records and
    # no more. Not so for a segment sealed by a recovery (its writer died, or this is
    # a copy of a directory taken while it wrote), nor for an unsealed prefix.
    whole: bool = False


@dataclass(slots=True)
class RecoveryReport:
    """What opening the spool found. Every field is also logged."""

    segments: list[SegmentInfo] = field(default_factory=list)
    truncated: list[tuple[Path, int]] = field(default_factory=list)  # (file, bytes cut)
    quarantined: list[tuple[Path, str]] = field(default_factory=list)  # (new path, reason)
    removed_empty: list[Path] = field(default_factory=list)
    unsealed: list[tuple[Path, str]] = field(default_factory=list)  # kept as a prefix: why
    failed: list[tuple[Path, str]] = field(default_factory=list)  # left untouched: why

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


def quarantine(
    directory: Path, path: Path, reason: str, table: str | None = None, fs: FileSystem = REAL
) -> Path:
    """Move a file to ``quarantine/`` (never delete it) with its reason, and say so loudly.

    The reason is written beside it (``<name>.reason.json``) so that a restart,
    ``/v1/status`` and an operator see why, not only that. On a full disk the
    reason may not fit; the file is moved anyway (a rename needs no space) and
    the reason is still logged.
    """
    target_dir = directory / QUARANTINE
    target_dir.mkdir(exist_ok=True)
    target = target_dir / path.name
    sidecar = target_dir / (path.name + REASON_SUFFIX)
    note = {"reason": reason, "table": table, "at": time.time()}
    # The reason first: a crash between the two leaves a reason without a file
    # (ignored), never a quarantined file nobody can explain.
    try:
        fs.write_file(sidecar, json.dumps(note).encode())
    except OSError as exc:
        _log.error("could not record why %s is quarantined (%s): %s", path.name, reason, exc)
        with contextlib.suppress(OSError):
            fs.unlink(sidecar)
    fs.replace(path, target)
    fs.fsync_directory(target_dir)
    fs.fsync_directory(directory)
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


def recover(directory: Path, fs: FileSystem = REAL) -> RecoveryReport:
    """Verify every leftover segment in creation order. Blocking; never raises for one file.

    A file that cannot be handled (an I/O error reading it, no room to seal or
    quarantine it) is logged and left where it is for the next start; the rest
    of the spool and the daemon go on.
    """
    report = RecoveryReport()
    candidates: list[tuple[str, Path]] = []
    for path in directory.iterdir():
        if not path.is_file() or not path.name.endswith(".arrow"):
            continue
        segment_id = segment_id_of(path.name)
        if segment_id is None:
            with _contained(path, report):
                report.quarantined.append(
                    (quarantine(directory, path, "not a segment file name", fs=fs), "bad name")
                )
            continue
        candidates.append((segment_id, path))
    for segment_id, path in sorted(candidates):
        with _contained(path, report):
            _recover_one(directory, segment_id, path, report, fs)
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


@contextlib.contextmanager
def _contained(path: Path, report: RecoveryReport) -> Iterator[None]:
    """One file's trouble stays that file's: logged, reported, left for the next start."""
    try:
        yield
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        report.failed.append((path, reason))
        _log.error(
            "spool recovery could not handle %s (%s); it is left in place for the next "
            "start, its records are not committed yet",
            path.name,
            reason,
            extra={"segment": path.name, "error": reason},
        )


def _recover_one(
    directory: Path, segment_id: str, path: Path, report: RecoveryReport, fs: FileSystem
) -> None:
    data = fs.read_bytes(path)
    try:
        result = scan(data)
    except Exception as exc:  # scan reports damage itself; anything else is still damage
        reason = f"unreadable: {exc}"
        report.quarantined.append((quarantine(directory, path, reason, fs=fs), reason))
        return
    if result.error is not None:
        report.quarantined.append((quarantine(directory, path, result.error, fs=fs), result.error))
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
        fs.unlink(path)
        fs.fsync_directory(directory)
        report.removed_empty.append(path)
        return
    rows = sum(b.num_rows for b in decode(data, result.good_end).batches)
    size, sealed = len(data), True
    if not result.clean_end:
        try:
            size = _finish(path, data, result, fs)
        except OSError as exc:
            # A full or failing disk: the verified prefix is committed as it is
            # (reads stop at `size`); sealing waits for a start with room.
            size, sealed = result.good_end, False
            report.unsealed.append((path, str(exc)))
            _log.error(
                "segment %s could not be sealed (%s); its %d verified batches are "
                "committed from the unsealed file",
                path.name,
                exc,
                result.batches,
                extra={"segment": path.name, "error": str(exc)},
            )
    whole = sealed and result.sealed and result.whole
    report.segments.append(
        SegmentInfo(segment_id, result.table, path, size, result.batches, rows, sealed, whole)
    )


def _finish(path: Path, data: bytes, result: Scan, fs: FileSystem) -> int:
    """Cut the torn tail and seal, so the file is a complete stream from now on.

    Returns the file's new size.
    """
    if result.sealed:
        tail: bytes = EOS
    else:
        schema_message = schema_message_of(data)
        schema = ipc.read_schema(pa.py_buffer(schema_message))
        encoder = Encoder(schema, schema_message)
        tail = bytes(encoder.encode(empty_batch(schema), None, seal=SEALED_BY_RECOVERY)) + EOS
    fd = fs.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        fs.ftruncate(fd, result.good_end)
        try:
            fs.write_all(fd, [tail])
            fs.fsync(fd)
        except OSError:
            # Leave the verified prefix, not half a seal, for the next attempt.
            with contextlib.suppress(OSError):
                fs.ftruncate(fd, result.good_end)
            raise
    finally:
        fs.close(fd)
    return result.good_end + len(tail)
