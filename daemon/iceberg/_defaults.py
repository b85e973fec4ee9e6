"""Table properties the daemon sets on the tables it creates, so they stay fast.

A table the daemon commits to every few seconds for months needs what Iceberg leaves
off or to a separate job: manifests merged as they pile up, old metadata files
removed, and a retention policy for snapshot expiry. These are the standard Iceberg
properties, so Spark and other engines read the same policy:

- ``commit.manifest-merge.enabled`` / ``commit.manifest.min-count-to-merge`` /
  ``commit.manifest.target-size-bytes``: each commit adds one manifest; once
  MIN_MERGE_COUNT small ones are due, the commit merges them (``_upstream/_merge_append.py``)
  into manifests of up to MANIFEST_TARGET_SIZE, so the manifest list a commit reads
  and writes, and the manifests a reader plans over, stay bounded; a merged manifest
  that reached the target size is never rewritten again.
- ``write.metadata.delete-after-commit.enabled`` / ``write.metadata.previous-versions-max``:
  a commit deletes metadata.json files older than the last PREVIOUS_VERSIONS_MAX
  (one file per commit otherwise stays forever).
- ``history.expire.max-snapshot-age-ms`` / ``history.expire.min-snapshots-to-keep``:
  the retention policy the daemon's maintenance (and Spark's expire_snapshots)
  applies; values come from ``[maintenance]``.

Besides these defaults (which ``apply_defaults`` may add to any table), a table the
daemon creates carries CREATED_BY: that it had no snapshot before its first commit,
which is what lets a lost first metadata file be written back from the declaration
(``_upstream/_hive.py``); a table another writer created never carries it.

Declared ``properties`` of a table always win. Existing tables keep their own
properties unless the operator opts in (``apply_defaults``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from pyiceberg.table import Table
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.iceberg._commit import commit_properties

__all__ = [
    "CREATED_BY",
    "DEFAULT_MAX_SNAPSHOT_AGE_MS",
    "DEFAULT_MIN_SNAPSHOTS_TO_KEEP",
    "MANIFEST_MERGE_ENABLED",
    "MANIFEST_MIN_MERGE_COUNT",
    "MANIFEST_TARGET_SIZE",
    "MANIFEST_TARGET_SIZE_BYTES",
    "MAX_SNAPSHOT_AGE_MS",
    "METADATA_DELETE_AFTER_COMMIT",
    "METADATA_PREVIOUS_VERSIONS_MAX",
    "MIN_MERGE_COUNT",
    "MIN_SNAPSHOTS_TO_KEEP",
    "PREVIOUS_VERSIONS_MAX",
    "TABLE_DEFAULTS",
    "apply_defaults",
    "table_defaults",
    "with_defaults",
]

#: Set (to "icespool") on every table the daemon creates, never by apply_defaults.
CREATED_BY: Final = "icespool.created-by"
MANIFEST_MERGE_ENABLED: Final = "commit.manifest-merge.enabled"
MANIFEST_MIN_MERGE_COUNT: Final = "commit.manifest.min-count-to-merge"
MANIFEST_TARGET_SIZE_BYTES: Final = "commit.manifest.target-size-bytes"
METADATA_DELETE_AFTER_COMMIT: Final = "write.metadata.delete-after-commit.enabled"
METADATA_PREVIOUS_VERSIONS_MAX: Final = "write.metadata.previous-versions-max"
MAX_SNAPSHOT_AGE_MS: Final = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP: Final = "history.expire.min-snapshots-to-keep"

#: Manifests a commit lets pile up before it merges them, and the size merged manifests
#: grow to. A merge rewrites the small manifests and the newest merged one (pyiceberg:
#: ~0.3 ms per entry, ~140 B per entry of a narrow table), so the target bounds the
#: longest commit and target / count its average extra cost; the count bounds the
#: manifests every commit lists and every Spark query plans over (~2.5 ms each).
#: Measured (tests/bench/bench_longevity.py, 3,000 commits, per commit, CPU mean / wall
#: p99 / wall max): Iceberg's defaults 100 / 8 MiB keep up to 99 manifests and grow the
#: longest commit with the table (a 10,000-file merge takes ~3 s); 20 / 8 MiB: 26 ms /
#: 542 ms / 1.9 s and still growing; 20 / 256 KiB: 23 ms / 330 ms / 0.6 s, bounded;
#: 50 / 512 KiB: 21 ms / 279 ms / 0.6 s (1.1 s once the merged manifest is full).
MIN_MERGE_COUNT: Final = 20
MANIFEST_TARGET_SIZE: Final = 256 * 1024
#: metadata.json versions kept besides the current one (Iceberg's default: 100).
PREVIOUS_VERSIONS_MAX: Final = 20
DEFAULT_MAX_SNAPSHOT_AGE_MS: Final = 6 * 60 * 60 * 1000
DEFAULT_MIN_SNAPSHOTS_TO_KEEP: Final = 10


def table_defaults(
    *,
    max_snapshot_age_ms: int = DEFAULT_MAX_SNAPSHOT_AGE_MS,
    min_snapshots_to_keep: int = DEFAULT_MIN_SNAPSHOTS_TO_KEEP,
) -> dict[str, str]:
    """The properties a table the daemon creates gets, with this retention policy
    (``[maintenance] max_snapshot_age`` / ``min_snapshots``)."""
    if max_snapshot_age_ms <= 0:
        raise ValueError(f"max_snapshot_age_ms must be positive, not {max_snapshot_age_ms}")
    if min_snapshots_to_keep < 1:
        raise ValueError(f"min_snapshots_to_keep must be at least 1, not {min_snapshots_to_keep}")
    return {
        MANIFEST_MERGE_ENABLED: "true",
        MANIFEST_MIN_MERGE_COUNT: str(MIN_MERGE_COUNT),
        MANIFEST_TARGET_SIZE_BYTES: str(MANIFEST_TARGET_SIZE),
        METADATA_DELETE_AFTER_COMMIT: "true",
        METADATA_PREVIOUS_VERSIONS_MAX: str(PREVIOUS_VERSIONS_MAX),
        MAX_SNAPSHOT_AGE_MS: str(max_snapshot_age_ms),
        MIN_SNAPSHOTS_TO_KEEP: str(min_snapshots_to_keep),
    }


#: ``table_defaults()`` with the default retention policy.
TABLE_DEFAULTS: Final[Mapping[str, str]] = MappingProxyType(table_defaults())


def with_defaults(declared: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """The properties to create a table with: ``defaults`` under the declared ones."""
    return {**defaults, **declared}


def apply_defaults(
    table: Table,
    defaults: Mapping[str, str],
    requirements: Sequence[ValidatableTableRequirement] = (),
) -> dict[str, str]:
    """Set the ``defaults`` an existing table lacks, in one metadata commit; returns
    what was set (empty: nothing was missing, nothing committed).

    A key the table has, whatever its value, is left alone: the operator or another
    engine chose it. Decided on the refreshed table in every attempt (a conflict is
    retried by ``commit_properties``). ``requirements`` go with the commit (the
    maintenance lease). Blocking; run it in the table's lane.
    """
    added: dict[str, str] = {}

    def missing(current: Mapping[str, str]) -> Mapping[str, str]:
        nonlocal added
        added = {k: v for k, v in defaults.items() if k not in current}
        return added

    if not commit_properties(table, missing, requirements=requirements):
        return {}
    return added
