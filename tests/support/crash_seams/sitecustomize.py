"""Crash points for `icespool run` children, owned by the tests (the daemon has no hooks).

A test puts this directory first on the child's PYTHONPATH and names a point in
``TEST_CRASH_AT``; Python imports this module at start-up, and it wraps the daemon
function at that point so the process kills itself with SIGKILL (a real kill -9: no
cleanup, no flush) the first time it gets there:

    before-dead-letter-removal   dead-letter replay: the targets committed, the dead
                                 letters not yet removed
    before-replay-commit         dead-letter replay: rows spooled for a target, the
                                 target's commit not started
    after-expiry-commit          maintenance: an expiry commit landed, none of the files
                                 only its snapshots reached is deleted yet
    during-expiry-delete         maintenance: one file of an expiry deleted, the rest not
    during-compaction-rewrite    maintenance: a compaction wrote its first output file(s),
                                 nothing committed (the outputs are orphans)
    after-compaction-commit      maintenance: a compaction's replace snapshot landed, the
                                 rest of the run (expiry, orphan sweep) not done
    during-manifest-merge        a merge append (commit.manifest.min-count-to-merge) wrote a
                                 merged manifest, its commit not sent

One point pauses instead (SIGSTOP, until the test sends SIGCONT), as a replica stalled
past every timeout (a suspended VM, a stop-the-world pause) would:

    pause-before-commit          a flush wrote its data files, its commit not sent
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

_POINT = os.environ.get("TEST_CRASH_AT", "")


def _die(point: str) -> None:
    print(f"crash seam: SIGKILL at {point}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if _POINT == "before-dead-letter-removal":
    from icespool.kafka import _replay

    async def _remove(*args: Any, **kwargs: Any) -> bool:
        _die(_POINT)
        raise AssertionError("unreachable")

    _replay.remove_dead_letters = _remove  # type: ignore[assignment]

elif _POINT == "before-replay-commit":
    from icespool.write.writer import TableWriter

    _flush = TableWriter.flush

    async def _flush_or_die(self: TableWriter, reason: str = "manual") -> Any:
        if reason == "dead-letter-replay":
            _die(_POINT)
        return await _flush(self, reason)

    TableWriter.flush = _flush_or_die  # type: ignore[method-assign]

elif _POINT == "after-expiry-commit":
    from icespool.maintenance import _tasks

    _commit_expiry = _tasks.commit_expiry

    def _commit_then_die(*args: Any, **kwargs: Any) -> Any:
        expired = _commit_expiry(*args, **kwargs)
        if expired is not None:
            _die(_POINT)
        return expired

    _tasks.commit_expiry = _commit_then_die  # type: ignore[assignment]

elif _POINT == "during-expiry-delete":
    from icespool.maintenance import _tasks

    _delete_files = _tasks.delete_files

    def _delete_one_then_die(io: Any, files: Any, **kwargs: Any) -> Any:
        if len(files) < 2:
            return _delete_files(io, files, **kwargs)
        _delete_files(io, files[:1], **kwargs)
        _die(_POINT)
        raise AssertionError("unreachable")

    _tasks.delete_files = _delete_one_then_die  # type: ignore[assignment]

elif _POINT == "during-compaction-rewrite":
    from icespool.maintenance import _compact

    _encode = _compact.encode_data_files_with_rows

    def _encode_then_die(*args: Any, **kwargs: Any) -> Any:
        written = _encode(*args, **kwargs)
        if written:
            _die(_POINT)
        return written

    _compact.encode_data_files_with_rows = _encode_then_die  # type: ignore[assignment]

elif _POINT == "after-compaction-commit":
    from icespool.maintenance import _compact

    _commit_rewrite = _compact.commit_rewrite

    def _commit_rewrite_then_die(*args: Any, **kwargs: Any) -> Any:
        result = _commit_rewrite(*args, **kwargs)
        if result.outcome == "committed":
            _die(_POINT)
        return result

    _compact.commit_rewrite = _commit_rewrite_then_die  # type: ignore[assignment]

elif _POINT == "during-manifest-merge":
    import functools

    from pyiceberg.table.update import snapshot

    _create_manifest = snapshot._ManifestMergeManager._create_manifest

    # wraps: the daemon's fence reads the wrapped function's code (inspect.unwrap) when it
    # checks what it relies on in pyiceberg.
    @functools.wraps(_create_manifest)
    def _merge_then_die(self: Any, *args: Any, **kwargs: Any) -> Any:
        merged = _create_manifest(self, *args, **kwargs)
        _die(_POINT)
        return merged

    snapshot._ManifestMergeManager._create_manifest = _merge_then_die  # type: ignore[method-assign]

elif _POINT == "pause-before-commit":
    import threading

    from icespool.write import rows

    _commit_files = rows.commit_files
    _paused = threading.Event()

    def _pause_then_commit(*args: Any, **kwargs: Any) -> Any:
        if not _paused.is_set():
            _paused.set()
            print(f"crash seam: SIGSTOP at {_POINT}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return _commit_files(*args, **kwargs)

    rows.commit_files = _pause_then_commit  # type: ignore[assignment]

elif _POINT:
    raise SystemExit(f"unknown TEST_CRASH_AT {_POINT!r}")
