"""Progress of long work: start-up recovery and ``icespool replay``.

An operator waiting for a large spool to replay needs to know how far it is and when it
ends. The spool already knows every segment's rows and bytes, so the totals are known
up front and each segment that leaves the spool (committed or quarantined) advances the
count in O(1), with no extra I/O.

Logged at a bounded rate (every ``log_every`` seconds, and at the end), so a
spool of 100,000 small segments does not flood the journal. With ``line`` (a terminal),
one line is redrawn in place as well, a few times a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from icespool.config import human_bytes, human_seconds

if TYPE_CHECKING:  # the CLI renders sizes without importing the spool (and pyarrow)
    from icespool.spool import SegmentInfo

__all__ = ["Progress"]

_log = logging.getLogger("icespool.progress")
_LOG_EVERY = 5.0
_DRAW_EVERY = 0.2
# Cursor to column 0 of the same line and clear it: the next draw or log line starts clean.
_CLEAR_LINE = "\r\x1b[K"


class Progress:
    """Records, bytes and segments done of a known total; rate and ETA."""

    def __init__(
        self,
        what: str,
        *,
        records: int,
        nbytes: int,
        segments: int,
        log_every: float = _LOG_EVERY,
        line: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total_records = records
        self.total_bytes = nbytes
        self.total_segments = segments
        self.records = 0
        self.bytes = 0
        self.segments = 0
        self.finished = False
        self._log_every = log_every
        self._line = line
        self._clock = clock
        self._started = clock()
        self._logged = self._started
        self._drawn = self._started

    @classmethod
    def of_segments(
        cls, what: str, segments: list[SegmentInfo], *, line: TextIO | None = None
    ) -> Progress:
        return cls(
            what,
            records=sum(s.rows for s in segments),
            nbytes=sum(s.bytes for s in segments),
            segments=len(segments),
            line=line,
        )

    def segment_done(self, info: SegmentInfo) -> None:
        """``info`` left the spool (committed, found committed, or quarantined)."""
        self.advance(info.rows, info.bytes)

    def advance(self, records: int, nbytes: int, segments: int = 1) -> None:
        self.records += records
        self.bytes += nbytes
        self.segments += segments
        now = self._clock()
        if self._line is not None and now - self._drawn >= _DRAW_EVERY:
            self._drawn = now
            self._draw()
        if now - self._logged >= self._log_every:
            self._logged = now
            self._emit()

    def finish(self) -> None:
        """Log the last line (it replaces the terminal line). Idempotent."""
        if self.finished:
            return
        self.finished = True
        if self._line is not None:
            self._line.write(_CLEAR_LINE)
            self._line.flush()
        self._emit()

    @property
    def percent(self) -> float:
        if self.total_records:
            return 100.0 * self.records / self.total_records
        if self.total_bytes:
            return 100.0 * self.bytes / self.total_bytes
        return 100.0

    @property
    def elapsed(self) -> float:
        return max(0.0, self._clock() - self._started)

    def rate(self) -> float:
        """Records per second so far (0 before the first second's worth of work)."""
        elapsed = self.elapsed
        return self.records / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at the rate so far (None until there is a rate)."""
        left = self.total_records - self.records
        if left <= 0:
            return 0.0
        rate = self.rate()
        return left / rate if rate > 0 else None

    def text(self) -> str:
        eta = self.eta()
        tail = (
            f"done in {human_seconds(self.elapsed)}"
            if self.finished
            else f"ETA {human_seconds(eta) if eta is not None else '?'}"
        )
        return (
            f"{self.what}: {self.records} of {self.total_records} records "
            f"({self.percent:.1f}%), {human_bytes(self.bytes)} of "
            f"{human_bytes(self.total_bytes)}, {self.segments} of {self.total_segments} "
            f"segments, {self.rate():.0f} records/s, {tail}"
        )

    def snapshot(self) -> dict[str, Any]:
        """For /v1/status: exact figures."""
        eta = self.eta()
        return {
            "records": self.records,
            "total_records": self.total_records,
            "bytes": self.bytes,
            "total_bytes": self.total_bytes,
            "segments": self.segments,
            "total_segments": self.total_segments,
            "percent": round(self.percent, 1),
            "records_per_second": round(self.rate(), 1),
            "eta_seconds": None if eta is None else round(eta, 1),
            "elapsed_seconds": round(self.elapsed, 1),
            "finished": self.finished,
        }

    def draw(self) -> None:
        """Show the terminal line now (at the start, before the first segment is done)."""
        if self._line is not None and not self.finished:
            self._draw()

    def _draw(self) -> None:
        assert self._line is not None
        # Ends with the cursor at column 0: a log line written meanwhile overwrites it
        # instead of being glued to its end.
        self._line.write(f"{_CLEAR_LINE}{self.text()}\r")
        self._line.flush()

    def _emit(self) -> None:
        if self._line is not None and not self.finished:
            self._line.write(_CLEAR_LINE)
        snap = self.snapshot()
        _log.info(
            "%s",
            self.text(),
            extra={"progress": self.what, **{f"progress_{k}": v for k, v in snap.items()}},
        )
        if self._line is not None and not self.finished:
            self._draw()
