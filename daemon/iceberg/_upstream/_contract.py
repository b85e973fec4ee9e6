"""What the fence relies on in pyiceberg, checked when the fence is imported.

Each module of the fence extends or replaces a piece of pyiceberg that is not its public
API. ``PINS`` lists, per module, what it relies on: a private name exists, takes the
parameters it took, is the kind of object it was (a property, a cached property), uses
the attributes it used (read from its code object, no call), and, where the fence copies
a step sequence (``update_table_metadata``), the set of steps and update types it
mirrors, so an upstream addition turns red here instead of silently diverging. The
version must lie in the range the suite ran against.

``check_contract`` raises ``UpstreamContractError`` with one line: the library, the
version, what changed, and the fence module to update. It reads the installed modules
as they are at call time and calls nothing of theirs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from daemon.errors import IcespoolError

__all__ = [
    "HIVE_PINS",
    "LIBRARY",
    "PINS",
    "TESTED_RANGE",
    "Pin",
    "UpstreamContractError",
    "check_contract",
]

LIBRARY: Final = "pyiceberg"
#: The versions the suite ran against: >=0.12, <0.13 (pyproject.toml pins the same).
TESTED_RANGE: Final = ((0, 12), (0, 13))
_FENCE: Final = "daemon/iceberg/_upstream/"

Check = Callable[[Any], "str | None"]


class UpstreamContractError(IcespoolError):
    """The installed pyiceberg no longer has what the fence relies on."""


@dataclass(frozen=True)
class Pin:
    """``target`` (a dotted path into pyiceberg) as ``fence`` (a module of the fence)
    relies on it; each check returns what changed, or None."""

    fence: str
    target: str
    checks: tuple[Check, ...] = ()


def _params(*names: str) -> Check:
    def check(obj: Any) -> str | None:
        try:
            found = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return "has no signature to read"
        if found[: len(names)] != names:
            return f"no longer takes ({', '.join(names)}) but ({', '.join(found)})"
        return None

    return check


def _accepts(*names: str) -> Check:
    """The callable takes each of ``names`` (by keyword: the order does not matter)."""

    def check(obj: Any) -> str | None:
        try:
            found = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return "has no signature to read"
        missing = [name for name in names if name not in found]
        return f"no longer takes {', '.join(missing)}" if missing else None

    return check


def _uses(*names: str) -> Check:
    """The function's code reads or sets each of ``names`` (attribute or global)."""

    def check(obj: Any) -> str | None:
        code = getattr(inspect.unwrap(obj), "__code__", None)
        if code is None:
            return "is no Python function"
        missing = [name for name in names if name not in code.co_names]
        return f"no longer uses {', '.join(missing)}" if missing else None

    return check


def _uses_exactly(*names: str) -> Check:
    """The function's code uses exactly ``names``: a step added or dropped upstream
    changes the set."""

    def check(obj: Any) -> str | None:
        code = getattr(inspect.unwrap(obj), "__code__", None)
        if code is None:
            return "is no Python function"
        found, wanted = set(code.co_names), set(names)
        if found == wanted:
            return None
        changes = [f"+{name}" for name in sorted(found - wanted)]
        changes += [f"-{name}" for name in sorted(wanted - found)]
        return f"changed its steps ({', '.join(changes)})"

    return check


def _kind(kind: type) -> Check:
    def check(obj: Any) -> str | None:
        if isinstance(obj, kind):
            return None
        return f"is no longer a {kind.__module__}.{kind.__qualname__}"

    return check


def _handles(*type_names: str) -> Check:
    """A singledispatch function's registered types are exactly ``type_names``."""

    def check(obj: Any) -> str | None:
        registry = getattr(obj, "registry", None)
        if registry is None:
            return "is no longer a singledispatch function"
        found, wanted = {t.__name__ for t in registry}, set(type_names)
        if found == wanted:
            return None
        changes = [f"+{name}" for name in sorted(found - wanted)]
        changes += [f"-{name}" for name in sorted(wanted - found)]
        return f"handles other update types ({', '.join(changes)})"

    return check


def _has(*names: str) -> Check:
    def check(obj: Any) -> str | None:
        missing = [name for name in names if not hasattr(obj, name)]
        return f"has no {', '.join(missing)}" if missing else None

    return check


def _private_attributes(*names: str) -> Check:
    def check(obj: Any) -> str | None:
        found = getattr(obj, "__private_attributes__", {})
        missing = [name for name in names if name not in found]
        return f"has no pydantic private attribute {', '.join(missing)}" if missing else None

    return check


def _fields(*names: str) -> Check:
    def check(obj: Any) -> str | None:
        found = getattr(obj, "model_fields", {})
        missing = [name for name in names if name not in found]
        return f"has no field {', '.join(missing)}" if missing else None

    return check


def _columns(*names: str) -> Check:
    def check(obj: Any) -> str | None:
        table = getattr(obj, "__table__", None)
        found = {column.name for column in table.columns} if table is not None else set()
        missing = [name for name in names if name not in found]
        return f"has no column {', '.join(missing)}" if missing else None

    return check


_UPDATE = "pyiceberg.table.update"
_SNAPSHOT = "pyiceberg.table.update.snapshot"

#: Every update type ``_apply_table_update`` handles in 0.12 (``object``: its fallback).
UPDATE_TYPES: Final = (
    "object",
    "AddPartitionSpecUpdate",
    "AddSchemaUpdate",
    "AddSnapshotUpdate",
    "AddSortOrderUpdate",
    "AssignUUIDUpdate",
    "RemovePartitionSpecsUpdate",
    "RemovePartitionStatisticsUpdate",
    "RemovePropertiesUpdate",
    "RemoveSchemasUpdate",
    "RemoveSnapshotRefUpdate",
    "RemoveSnapshotsUpdate",
    "RemoveStatisticsUpdate",
    "SetCurrentSchemaUpdate",
    "SetDefaultSortOrderUpdate",
    "SetDefaultSpecUpdate",
    "SetLocationUpdate",
    "SetPartitionStatisticsUpdate",
    "SetPropertiesUpdate",
    "SetSnapshotRefUpdate",
    "SetStatisticsUpdate",
    "UpgradeFormatVersionUpdate",
)

PINS: Final[tuple[Pin, ...]] = (
    # _metadata.py: update_table_metadata, step by step
    Pin(
        "_metadata.py",
        f"{_UPDATE}.update_table_metadata",
        (
            _params("base_metadata", "updates", "enforce_validation", "metadata_location"),
            # The steps apply_updates repeats: a new call upstream is a step it lacks.
            _uses_exactly(
                "TableMetadataUtil",
                "_TableMetadataUpdateContext",
                "_apply_table_update",
                "_update_table_metadata_log",
                "astimezone",
                "check_compatible",
                "datetime",
                "datetime_to_millis",
                "has_changes",
                "last_updated_ms",
                "model_copy",
                "model_dump",
                "now",
                "parse_obj",
                "schema",
                "sort_order",
                "spec",
            ),
        ),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._apply_table_update",
        (_params("update", "base_metadata", "context"), _handles(*UPDATE_TYPES)),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._TableMetadataUpdateContext",
        (_has("add_update", "has_changes"),),
    ),
    Pin(
        "_metadata.py",
        f"{_UPDATE}._update_table_metadata_log",
        (_params("base_metadata", "metadata_location", "last_updated_ms"),),
    ),
    Pin("_metadata.py", f"{_UPDATE}.RemoveSnapshotsUpdate", (_fields("snapshot_ids"),)),
    Pin("_metadata.py", f"{_UPDATE}.RemoveSnapshotRefUpdate", (_fields("ref_name"),)),
    Pin("_metadata.py", f"{_UPDATE}.RemoveStatisticsUpdate", (_fields("snapshot_id"),)),
    # _transaction.py: Staging, send, stage, abandon, tidy
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction.__init__",
        (
            _params("self", "table"),
            _uses("_table", "_updates", "_requirements", "_snapshot_producers"),
        ),
    ),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction._stage",
        (_params("self", "updates", "requirements"), _uses("_updates", "_requirements")),
    ),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Transaction._apply",
        (_params("self", "updates", "requirements"), _uses("_stage")),
    ),
    Pin("_transaction.py", "pyiceberg.table.Transaction.table_metadata", (_kind(property),)),
    Pin(
        "_transaction.py",
        "pyiceberg.table.Table._do_commit",
        (_params("self", "updates", "requirements"),),
    ),
    Pin(
        "_transaction.py",
        f"{_SNAPSHOT}._SnapshotProducer.__init__",
        (
            _uses(
                "_transaction",
                "_io",
                "_snapshot_id",
                "_added_data_files",
                "_deleted_data_files",
                "_written_manifests",
                "_compression",
                "_target_branch",
            ),
        ),
    ),
    Pin(
        "_transaction.py",
        f"{_SNAPSHOT}._SnapshotProducer._clean_all_uncommitted",
        (_params("self"),),
    ),
    # _merge_append.py: MergeAppend, MergeRowDelta, DeleteMerging
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._FastAppendFiles.__init__",
        (_accepts("operation", "transaction", "io", "snapshot_properties", "branch"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._MergeAppendFiles.__init__",
        (_uses("_merge_enabled", "_min_count_to_merge", "_target_size_bytes"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._MergeAppendFiles._process_manifests",
        (_uses("_ManifestMergeManager", "merge_manifests"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._ManifestMergeManager.__init__",
        (
            _params(
                "self",
                "target_size_bytes",
                "min_count_to_merge",
                "merge_enabled",
                "snapshot_producer",
            ),
        ),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._ManifestMergeManager._create_manifest",
        (_uses("_snapshot_producer", "new_manifest_writer"),),
    ),
    Pin(
        "_merge_append.py",
        f"{_SNAPSHOT}._SnapshotProducer._manifests",
        (_params("self"),),
    ),
    # _delete_manifest.py: DeleteManifestWriter
    Pin(
        "_delete_manifest.py",
        "pyiceberg.manifest.ManifestWriterV2.__init__",
        (_params("self", "spec", "schema", "output_file", "snapshot_id", "avro_compression"),),
    ),
    Pin("_delete_manifest.py", "pyiceberg.manifest.ManifestWriterV2._meta", (_kind(property),)),
    Pin(
        "_delete_manifest.py",
        "pyiceberg.manifest.ManifestWriter._with_partition",
        (_params("self", "format_version"),),
    ),
    # _replace.py: ReplaceFiles
    Pin(
        "_replace.py",
        f"{_SNAPSHOT}._SnapshotProducer._summary",
        (_params("self", "snapshot_properties"),),
    ),
    Pin("_replace.py", f"{_SNAPSHOT}._OverwriteFiles", (_has("_manifests", "delete_data_file"),)),
    # _summary.py
    Pin(
        "_summary.py",
        "pyiceberg.table.snapshots.Summary",
        (_private_attributes("_additional_properties"),),
    ),
    # _partition_key.py
    Pin(
        "_partition_key.py",
        "pyiceberg.partitioning.PartitionKey.partition",
        (_kind(functools.cached_property),),
    ),
    # _sql.py and _refresh.py
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._parse_metadata_version",
        (_params("metadata_location"),),
    ),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._load_file_io",
        (_params("self", "properties", "location"),),
    ),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.SqlCatalog._write_metadata",
        (_params("metadata", "io", "metadata_path"),),
    ),
    Pin("_sql.py", "pyiceberg.catalog.sql.SqlCatalog._iceberg_type_filter", (_params("self"),)),
    Pin(
        "_sql.py",
        "pyiceberg.catalog.sql.IcebergTables",
        (
            _columns(
                "catalog_name",
                "table_namespace",
                "table_name",
                "metadata_location",
                "previous_metadata_location",
            ),
        ),
    ),
    # _rest.py
    Pin(
        "_rest.py",
        "pyiceberg.catalog.rest.RestCatalog._config_headers",
        (_params("self", "session"),),
    ),
    Pin(
        "_rest.py",
        "pyiceberg.catalog.rest.RestCatalog._create_session",
        (_uses("_config_headers"),),
    ),
    # _gcs_io.py
    Pin(
        "_gcs_io.py",
        "pyiceberg.io.pyarrow.PyArrowFileIO._initialize_gcs_fs",
        (_params("self"),),
    ),
    Pin(
        "_gcs_io.py",
        "pyiceberg.io.pyarrow.PyArrowFileIO._initialize_fs",
        (_uses("_initialize_gcs_fs"),),
    ),
)


_HIVE = "pyiceberg.catalog.hive"

#: What _hive.py relies on: checked when it is imported (a Hive catalog; it needs thrift).
HIVE_PINS: Final = (
    Pin(
        "_hive.py",
        f"{_HIVE}._HiveClient.__init__",
        (
            _params("self", "uri", "ugi", "kerberos_auth", "kerberos_service_name"),
            _uses("_uri", "_ugi", "_kerberos_auth", "_kerberos_service_name"),
        ),
    ),
    Pin("_hive.py", f"{_HIVE}._HiveClient._init_thrift_transport", (_params("self"),)),
    Pin("_hive.py", f"{_HIVE}._HiveClient.__enter__", (_params("self"),)),
    Pin("_hive.py", f"{_HIVE}.HiveCatalog.__init__", (_uses("_create_hive_client", "_client"),)),
    Pin("_hive.py", f"{_HIVE}.HiveCatalog._create_hive_client", (_kind(staticmethod),)),
)


def _resolve(target: str) -> Any:
    """The object at ``target``, from the package down: attributes first, a submodule
    imported only where no attribute has the name (a failed import costs a path search).
    Class attributes are read raw from ``__dict__`` along the MRO, so a property stays a
    property."""
    first, *rest = target.split(".")
    obj: Any = importlib.import_module(first)
    for name in rest:
        try:
            obj = _attribute(obj, name)
        except LookupError:
            if not inspect.ismodule(obj):
                raise
            try:
                obj = importlib.import_module(f"{obj.__name__}.{name}")
            except ImportError:
                raise LookupError(name) from None
    return obj


def _attribute(obj: Any, name: str) -> Any:
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        raise LookupError(name)
    try:
        return getattr(obj, name)
    except AttributeError:
        raise LookupError(name) from None


def _version() -> str:
    module = importlib.import_module(LIBRARY)
    return str(getattr(module, "__version__", "unknown"))


def _in_range(version: str) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return False
    found = (int(match.group(1)), int(match.group(2)))
    low, high = TESTED_RANGE
    return low <= found < high


def problems(pins: Iterable[Pin] = PINS) -> list[str]:
    """What changed, one line per broken check of ``pins`` (the fence module named)."""
    found: list[str] = []
    for pin in pins:
        try:
            obj = _resolve(pin.target)
        except LookupError:
            found.append(f"{pin.target} is gone; icespool's fence {_FENCE}{pin.fence}")
            continue
        for check in pin.checks:
            problem = check(obj)
            if problem is not None:
                found.append(f"{pin.target} {problem}; icespool's fence {_FENCE}{pin.fence}")
    return found


def check_contract(pins: Iterable[Pin] = PINS) -> None:
    """Raise UpstreamContractError (one line) unless the installed pyiceberg has what
    ``pins`` rely on, in a version the suite ran against."""
    version = _version()
    if not _in_range(version):
        (low_major, low_minor), (high_major, high_minor) = TESTED_RANGE
        raise UpstreamContractError(
            f"{LIBRARY} {version}: outside the versions icespool's fence {_FENCE} was "
            f"tested with (>={low_major}.{low_minor},<{high_major}.{high_minor}); "
            "install a version in that range"
        )
    found = problems(pins)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UpstreamContractError(f"{LIBRARY} {version}: {found[0]} needs an update{more}")
