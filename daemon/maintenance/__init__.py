"""Table maintenance: compaction of the daemon's small files, removal of its orphans.

    _compact    bin-pack small daemon-written files into ONE replace snapshot per run
    _orphans    remove data files the daemon wrote but never committed

Everything here blocks; the scheduler runs it in threads (commits in the table's lane).
"""

from daemon.maintenance._compact import (
    COMPACTION_SUMMARY_KEY,
    CompactionBin,
    CompactionConflictError,
    CompactionError,
    CompactionPlan,
    CompactionResult,
    IoBudget,
    commit_rewrite,
    plan_compaction,
    rewrite,
)
from daemon.maintenance._orphans import (
    DEFAULT_ORPHAN_AGE_S,
    OrphanResult,
    daemon_file_id,
    daemon_file_time,
    is_daemon_file,
    remove_orphans,
)

__all__ = [
    "COMPACTION_SUMMARY_KEY",
    "DEFAULT_ORPHAN_AGE_S",
    "CompactionBin",
    "CompactionConflictError",
    "CompactionError",
    "CompactionPlan",
    "CompactionResult",
    "IoBudget",
    "OrphanResult",
    "commit_rewrite",
    "daemon_file_id",
    "daemon_file_time",
    "is_daemon_file",
    "plan_compaction",
    "remove_orphans",
    "rewrite",
]
