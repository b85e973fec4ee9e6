"""The verdict on one run, from its history and the tables as they end.

- append tables: every acked id exactly once; an id sent without an ack at most once;
  an id acked and then lost with a disk restored from an older snapshot at most once; no
  id nobody sent. ``t.stream``: every record of the topic's log exactly once.
- upsert tables: the merged state equal to a model: ``t.users`` applies each slot's
  acked requests in order (a slot's keys are its own), ``t.keyed`` the topic's log in
  each partition's order (a key's records are in one partition); no key twice.
- commits resumed after each moment every fault was healed, within a bound (the worst
  reported); no replica process ended by itself.

On failure the first id or key that differs is named; the runner prints the seed and
the schedule with it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nemesis.reader import KafkaRecord
from nemesis.recorder import ChangeBatch, FaultEvent, History

__all__ = [
    "Verdict",
    "changes_by_key",
    "check_appends",
    "check_upserts",
    "keyed_model",
    "resume_times",
    "users_model",
]


@dataclass
class Verdict:
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)

    def fail(self, line: str) -> None:
        self.failures.append(line)
        self.lines.append(f"FAILED: {line}")


def check_appends(
    verdict: Verdict,
    table: str,
    found: Counter[int],
    acked: Iterable[int],
    maybe: Iterable[int],
    lost: Iterable[int] = (),
) -> None:
    """``found``: id -> times in the table."""
    must, may, gone = set(acked), set(maybe), set(lost)
    missing = sorted(i for i in must - gone if found[i] == 0)
    doubled = sorted(i for i, n in found.items() if n > 1)
    strange = sorted(i for i in found if i not in must and i not in may and i not in gone)
    verdict.say(
        f"{table}: {len(must)} acked ({len(gone)} lost with a restored disk), "
        f"{len(may)} unacked, {sum(found.values())} rows; missing {len(missing)}, "
        f"duplicated {len(doubled)}, never sent {len(strange)}"
    )
    for what, ids in (("missing", missing), ("duplicated", doubled), ("never sent", strange)):
        if ids:
            verdict.fail(f"{table}: {len(ids)} ids {what}; the first: {ids[0]} ({ids[:10]})")


def users_model(batches: Iterable[ChangeBatch]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The state of ``t.users`` the acked requests make, and what makes it unknowable
    (a request whose outcome nobody knows)."""
    state: dict[int, dict[str, Any]] = {}
    problems = []
    for batch in sorted(batches, key=lambda b: (b.slot, b.number)):
        if batch.lost:
            continue
        if batch.acked_at is None:
            problems.append(f"request {batch.number} of slot {batch.slot} was never acked")
            continue
        for change in batch.changes:
            if change.value is None:
                state.pop(change.key, None)
            else:
                state[change.key] = {"id": change.key, "v": change.value, "seq": change.seq}
    return state, problems


def keyed_model(log: Iterable[KafkaRecord]) -> dict[int, dict[str, Any]]:
    """The state of ``t.keyed`` its topic's log makes: per partition in offset order."""
    state: dict[int, dict[str, Any]] = {}
    for record in sorted(log, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None, record
        key = int(record.key)
        if record.value is None:
            state.pop(key, None)
        else:
            row = json.loads(record.value)
            state[key] = {"id": key, "v": row["v"], "seq": row["seq"]}
    return state


def check_upserts(
    verdict: Verdict,
    table: str,
    found: Mapping[int, dict[str, Any]],
    doubled: list[int],
    model: Mapping[int, dict[str, Any]],
    history: Mapping[int, list[str]] | None = None,
) -> None:
    wrong = sorted(k for k in set(model) | set(found) if model.get(k) != found.get(k))
    verdict.say(
        f"{table}: {len(model)} keys expected, {len(found)} found; {len(wrong)} keys wrong, "
        f"{len(doubled)} keys twice"
    )
    if doubled:
        verdict.fail(f"{table}: keys held by two live rows; the first: {doubled[0]}")
    if wrong:
        key = wrong[0]
        changes = "; ".join((history or {}).get(key, [])[-6:])
        verdict.fail(
            f"{table}: {len(wrong)} keys differ from the model; the first: key {key}: "
            f"expected {model.get(key)}, found {found.get(key)} (its last changes: {changes})"
        )


def _healed_moments(faults: Iterable[FaultEvent]) -> list[tuple[float, float | None]]:
    """Each moment every fault was healed, and when the next fault started (None: none)."""
    spans = sorted((f.started, f.healed if f.healed is not None else f.started) for f in faults)
    moments: list[tuple[float, float | None]] = []
    end = None
    for start, stop in spans:
        if end is not None and start > end:
            moments.append((end, start))
        end = stop if end is None else max(end, stop)
    if end is not None:
        moments.append((end, None))
    return moments


def resume_times(
    faults: Iterable[FaultEvent], commits: Mapping[str, list[float]], tables: Iterable[str]
) -> list[tuple[float, str, float | None]]:
    """For each moment all was healed and each table: seconds to its next data commit;
    None where the next fault came first (not measured)."""
    found = []
    for healed, next_fault in _healed_moments(faults):
        for table in tables:
            after = [t for t in commits.get(table, []) if t >= healed]
            first = after[0] if after else None
            if first is not None and (next_fault is None or first <= next_fault):
                found.append((healed, table, first - healed))
            elif next_fault is None:
                found.append((healed, table, float("inf")))
    return found


def changes_by_key(history: History) -> dict[int, list[str]]:
    """Each ``t.users`` key's acked changes, for naming what led to a wrong key."""
    by_key: dict[int, list[str]] = {}
    for batch in sorted(history.batches, key=lambda b: (b.slot, b.number)):
        for change in batch.changes:
            state = "lost" if batch.lost else "acked" if batch.acked_at is not None else "unacked"
            text = f"r{batch.slot}#{batch.number} {change.value or 'delete'} ({state})"
            by_key.setdefault(change.key, []).append(text)
    return by_key
