"""Render ``/v1/status`` for people: ``icespool status`` and ``icespool tables``.

Pure functions of the status object, tolerant of keys an older daemon does not send,
so the CLI of one version can look at a daemon of another during a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from icespool.config import human_bytes, human_seconds

__all__ = ["render_status", "render_tables"]


def render_status(status: Mapping[str, Any], url: str) -> str:
    lines = [_headline(status, url), _spool_line(status)]
    problem = (status.get("spool") or {}).get("problem")
    if problem:  # the spool figures are the last ones the daemon could read
        lines.append(f"SPOOL PROBLEM: {problem}")
    recovery = status.get("recovery")
    if recovery:
        lines.append(_recovery_line(recovery))
    lines.append("")
    lines.extend(_table_rows(status))
    degraded: Mapping[str, str] = status.get("degraded") or {}
    if degraded:
        lines += ["", f"degraded tables ({len(degraded)}):"]
        lines += [f"  {name}: {reason}" for name, reason in sorted(degraded.items())]
    quarantine = status.get("quarantine") or {}
    if quarantine.get("segments"):
        lines += [
            "",
            f"quarantine: {quarantine['segments']} segments, "
            f"{human_bytes(quarantine.get('bytes', 0))} (`icespool replay --segment ID` "
            "retries one)",
        ]
        lines += [
            f"  {q.get('id')}  {q.get('table')}  {human_bytes(q.get('bytes', 0))}  "
            f"{q.get('reason')}"
            for q in quarantine.get("listed", [])
        ]
    lines += _kafka_lines(status.get("kafka") or {})
    return "\n".join(lines) + "\n"


def render_tables(status: Mapping[str, Any]) -> str:
    """One line per table: name, pending records, last commit, state."""
    tables: Mapping[str, Any] = status.get("tables") or {}
    degraded: Mapping[str, str] = status.get("degraded") or {}
    rows = [["TABLE", "PENDING", "LAST COMMIT", "STATE"]]
    for name in sorted(set(tables) | set(degraded)):
        table = tables.get(name)
        state = f"degraded: {degraded[name]}" if name in degraded else "ok"
        if table is None:  # could not even be loaded: no writer, nothing pending known
            rows.append([name, "-", "-", state])
            continue
        rows.append([name, str(table.get("pending_records", 0)), _last_commit(table), state])
    if len(rows) == 1:
        return "no tables\n"
    return "\n".join(_aligned(rows, numeric={1})) + "\n"


def _headline(status: Mapping[str, Any], url: str) -> str:
    if status.get("draining"):
        state = "DRAINING (shutting down)"
    elif status.get("not_ready"):
        state = f"NOT READY: {status['not_ready']}"
    else:
        state = "ready"
    return f"icespool at {url}: {state}, up {human_seconds(status.get('uptime_seconds'))}"


def _spool_line(status: Mapping[str, Any]) -> str:
    spool = status.get("spool") or {}
    used, limit = spool.get("bytes", 0), spool.get("max_bytes", 0)
    share = f" ({100 * used / limit:.1f}%)" if limit else ""
    quarantined = spool.get("quarantined_segments", 0)
    return (
        f"spool: {human_bytes(used)} of {human_bytes(limit)}{share}, "
        f"{spool.get('segments', 0)} segments, {spool.get('durability', '?')}; "
        f"quarantine: {quarantined} segments, {human_bytes(spool.get('quarantine_bytes', 0))}"
    )


def _recovery_line(recovery: Mapping[str, Any]) -> str:
    state = (
        f"done in {human_seconds(recovery.get('elapsed_seconds'))}"
        if recovery.get("finished")
        else f"ETA {human_seconds(recovery.get('eta_seconds'))}"
    )
    return (
        f"start-up recovery: {recovery.get('records')} of {recovery.get('total_records')} "
        f"records ({recovery.get('percent')}%), {recovery.get('segments')} of "
        f"{recovery.get('total_segments')} segments, {state}"
    )


def _table_rows(status: Mapping[str, Any]) -> list[str]:
    tables: Mapping[str, Any] = status.get("tables") or {}
    if not tables:
        return ["no tables"]
    rows = [
        ["TABLE", "PENDING", "BYTES", "OLDEST", "QUEUE", "SEGMENTS", "LAST COMMIT", "MAINTENANCE"]
    ]
    for name in sorted(tables):
        t = tables[name]
        oldest = t.get("oldest_pending_age_seconds", 0)
        rows.append(
            [
                name,
                str(t.get("pending_records", 0)),
                human_bytes(t.get("pending_bytes", 0)),
                human_seconds(oldest) if oldest else "-",
                str(t.get("encode_queue", 0)),
                str(t.get("spool_segments", 0)),
                _last_commit(t),
                _maintenance(t.get("maintenance")),
            ]
        )
    return _aligned(rows, numeric={1, 2, 3, 4, 5})


def _last_commit(table: Mapping[str, Any]) -> str:
    last = table.get("last_commit")
    if not last:
        return "none yet"
    age = last.get("age_seconds")
    when = f", {human_seconds(age)} ago" if age is not None else ""
    return f"{last.get('reason')}, {last.get('records')} records{when}"


def _maintenance(state: Mapping[str, Any] | None) -> str:
    """``ok, next in 4m``; ``skipped (another replica maintains it), ...``; ``failed
    (3 in a row): <error>, next in 10m``; ``off: <why>``."""
    if not state:
        return "-"
    if state.get("disabled"):
        return f"off: {state['disabled']}"
    upcoming = f"next in {human_seconds(state.get('next_due_in_seconds'))}"
    last = state.get("last_run")
    if state.get("running"):
        return "running"
    if not last:
        return f"not run yet, {upcoming}"
    outcome = str(last.get("outcome"))
    if outcome == "skipped":
        return f"skipped (another replica maintains it), {upcoming}"
    failures = state.get("consecutive_failures") or 0
    if last.get("error"):
        streak = f" ({failures} in a row)" if failures > 1 else ""
        return f"{outcome}{streak}: {last['error']}, {upcoming}"
    return f"{outcome}, {upcoming}"


def _kafka_lines(kafka: Mapping[str, Any]) -> list[str]:
    sources: Sequence[Mapping[str, Any]] = kafka.get("sources") or []
    if not sources:
        return []
    lines = ["", "kafka:"]
    for source in sources:
        if source.get("connected"):
            state = "connected"
        else:
            state = f"NOT CONNECTED: {source.get('last_error') or 'connecting'}"
        lines.append(f"  {source.get('name')} (group {source.get('group_id')}): {state}")
        assignments = source.get("assignments") or []
        if not assignments:
            lines.append("    no partitions assigned")
            continue
        rows = [["PARTITION", "POSITION", "LAG", "STATE"]]
        for a in assignments:
            state = "paused" if a.get("paused") else str(a.get("state", ""))
            rows.append(
                [
                    f"{a.get('topic')}[{a.get('partition')}]",
                    _or_dash(a.get("position")),
                    _or_dash(a.get("lag")),
                    state,
                ]
            )
        lines += ["    " + row for row in _aligned(rows, numeric={1, 2})]
    return lines


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _aligned(rows: list[list[str]], numeric: set[int]) -> list[str]:
    """Columns padded to their widest cell; numbers right-aligned; the last one not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        cells[-1] = row[-1]
        out.append("  ".join(cells).rstrip())
    return out
