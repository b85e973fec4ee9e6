"""Table maintenance: the daemon keeps the tables it writes fast for its whole life.

    _settings   one table's settings: [maintenance], its [[tables]] override, its properties
    _lease      one maintainer per table across replicas: a lease in a table property (CAS)
    _expire     snapshot expiry by retention; the files only expired snapshots reached
    _compact    bin-packing the daemon's small files into one replace snapshot per run:
                the rewrite; _compact_plan the plan, _compact_commit the commit
    _convert    equality deletes turned into position deletes (no data rewritten)
    _budget     the I/O budget (bytes per second) every maintenance step passes
    _orphans    data files the daemon wrote but never committed
    _tasks      the tasks of a run, in order (DEFAULT_TASKS), and the table defaults
    _scheduler  one background task: a heap by due time, bounded concurrency, timeouts,
                per-table backoff; commit steps in the table's lane, I/O in its threads

Maintenance never stops ingest: a failing run is logged, counted, shown in /v1/status
and retried with backoff while the table goes on acking and committing.
"""

from icespool.maintenance._compact import (
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
from icespool.maintenance._convert import (
    Conversion,
    commit_conversion,
    plan_conversion,
    write_conversion,
)
from icespool.maintenance._expire import choose_expired, delete_files, find_garbage
from icespool.maintenance._lease import LEASE_PROPERTY, Lease, LeaseHeld, acquire, release
from icespool.maintenance._orphans import (
    FileOwner,
    OrphanResult,
    daemon_file_id,
    daemon_file_incarnation,
    is_daemon_file,
    remove_orphans,
)
from icespool.maintenance._scheduler import (
    MaintenanceScheduler,
    RunContext,
    TableState,
    Task,
    TaskResult,
    table_shape,
)
from icespool.maintenance._settings import (
    MAX_SNAPSHOT_AGE_PROPERTY,
    MIN_SNAPSHOTS_PROPERTY,
    MaintenanceSettings,
    created_table_properties,
    effective,
    resolve,
)
from icespool.maintenance._tasks import (
    COMPACT,
    DEFAULT_TASKS,
    DEFAULTS,
    EXPIRE,
    ORPHANS,
)

__all__ = [
    "COMPACT",
    "COMPACTION_SUMMARY_KEY",
    "DEFAULTS",
    "DEFAULT_TASKS",
    "EXPIRE",
    "LEASE_PROPERTY",
    "MAX_SNAPSHOT_AGE_PROPERTY",
    "MIN_SNAPSHOTS_PROPERTY",
    "ORPHANS",
    "CompactionBin",
    "CompactionConflictError",
    "CompactionError",
    "CompactionPlan",
    "CompactionResult",
    "Conversion",
    "FileOwner",
    "IoBudget",
    "Lease",
    "LeaseHeld",
    "MaintenanceScheduler",
    "MaintenanceSettings",
    "OrphanResult",
    "RunContext",
    "TableState",
    "Task",
    "TaskResult",
    "acquire",
    "choose_expired",
    "commit_conversion",
    "commit_rewrite",
    "created_table_properties",
    "daemon_file_id",
    "daemon_file_incarnation",
    "delete_files",
    "effective",
    "find_garbage",
    "is_daemon_file",
    "plan_compaction",
    "plan_conversion",
    "release",
    "remove_orphans",
    "resolve",
    "rewrite",
    "table_shape",
    "write_conversion",
]
