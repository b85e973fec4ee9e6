"""The history of one run, as the checker needs it: what was acked (by whom, when), what
may have landed without an ack, the faults as they were injected and healed, the data
commits seen in the catalog, and every process exit nobody asked for."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Change", "ChangeBatch", "Exit", "FaultEvent", "History"]


@dataclass(frozen=True)
class Change:
    """One keyed change: an upsert of ``(key, value, seq)``, or a delete (value None)."""

    key: int
    value: str | None
    seq: int


@dataclass
class ChangeBatch:
    """One ``/changes`` request of a slot's writer, re-sent until acked: the slot's
    batches are acked in ``number`` order, one at a time."""

    slot: int
    number: int
    changes: tuple[Change, ...]
    acked_at: float | None = None
    lost: bool = False  # acked, then lost with a disk restored from an older snapshot


@dataclass(frozen=True)
class FaultEvent:
    kind: str
    target: str
    started: float
    healed: float | None
    detail: str = ""


@dataclass(frozen=True)
class Exit:
    """A replica process that ended by itself (nobody killed or stopped it)."""

    slot: str
    at: float
    status: int
    tail: str


@dataclass
class History:
    started: float = field(default_factory=time.monotonic)
    # table -> id -> (monotonic time of the ack, slot that acked it)
    acked: dict[str, dict[int, tuple[float, str]]] = field(default_factory=dict)
    # table -> ids sent without an ack (a timeout, a reset): in the table at most once
    maybe: dict[str, set[int]] = field(default_factory=dict)
    # table -> ids acked and then lost with a disk restored from an older snapshot
    lost: dict[str, set[int]] = field(default_factory=dict)
    batches: list[ChangeBatch] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    # table -> monotonic times a new data snapshot was seen current in the catalog
    commits: dict[str, list[float]] = field(default_factory=dict)
    exits: list[Exit] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def ack(self, table: str, ids: range | list[int], slot: str) -> None:
        at = self.now()
        acked = self.acked.setdefault(table, {})
        for i in ids:
            acked[i] = (at, slot)

    def unacked(self, table: str, ids: range | list[int]) -> None:
        self.maybe.setdefault(table, set()).update(ids)

    def commit_seen(self, table: str) -> None:
        self.commits.setdefault(table, []).append(self.now())

    def fault_counts(self) -> Counter[str]:
        return Counter(event.kind for event in self.faults)
