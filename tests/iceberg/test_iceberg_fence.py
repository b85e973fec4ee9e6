"""The fence around pyiceberg's internals (daemon/iceberg/_upstream/).

- The contract check passes on the installed pyiceberg, and names what changed in one
  line when a private name is gone, takes other parameters, or a step or update type
  is added upstream, or the version is outside the tested range (the module objects
  are monkeypatched here; production has no hook for it).
- Each replaced behaviour is pinned against the installed library: our
  ``update_table_metadata`` without the deep copy gives upstream's metadata, our
  ``RemoveSnapshotsUpdate`` step upstream's result and errors, ``Staging`` upstream's
  pending metadata, ``summary_value`` what ``Summary.get`` gives.
- No module outside the fence touches pyiceberg's private names (an AST scan of daemon/).
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pyiceberg
import pyiceberg.table.update as update_module
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.statistics import BlobMetadata, StatisticsFile
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    RemovePropertiesUpdate,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    SetStatisticsUpdate,
    TableUpdate,
    update_table_metadata,
)
from pyiceberg.transforms import DayTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType, TimestampType
from support.private_names import defined_by, outside, private_attributes, touches

from icespool.iceberg._upstream import _contract
from icespool.iceberg._upstream._contract import (
    HIVE_PINS,
    PINS,
    UpstreamContractError,
    check_contract,
)
from icespool.iceberg._upstream._metadata import apply_updates
from icespool.iceberg._upstream._partition_key import physical_partition_key
from icespool.iceberg._upstream._summary import summary_value
from icespool.iceberg._upstream._transaction import Staging, staged_updates

REPO = Path(__file__).resolve().parents[2]
FENCE = REPO / "daemon" / "iceberg" / "_upstream"
VERSION = pyiceberg.__version__

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "at", TimestampType(), required=False),
    NestedField(3, "name", StringType(), required=False),
)


# ---------------------------------------------------------------- the contract


def test_installed_pyiceberg_meets_the_contract() -> None:
    assert _contract.problems() == []
    check_contract()  # no exception: the installed version is the tested one
    assert _contract._in_range(VERSION)


@pytest.mark.parametrize("pin", [*PINS, *HIVE_PINS], ids=lambda pin: pin.target)
def test_each_private_name_is_as_pinned(pin: _contract.Pin) -> None:
    assert _contract.problems([pin]) == []
    assert (FENCE / pin.fence).is_file(), f"{pin.fence} names no module of the fence"


def _raised(monkeypatch: pytest.MonkeyPatch) -> str:
    with pytest.raises(UpstreamContractError) as caught:
        check_contract()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_name_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(update_module, "_apply_table_update")
    assert _raised(monkeypatch) == (
        f"pyiceberg {VERSION}: pyiceberg.table.update._apply_table_update is gone; "
        "icespool's fence daemon/iceberg/_upstream/_metadata.py needs an update"
    )


def test_changed_parameters_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def _update_table_metadata_log(metadata: Any, location: str) -> Any:
        return metadata

    monkeypatch.setattr(update_module, "_update_table_metadata_log", _update_table_metadata_log)
    assert _raised(monkeypatch) == (
        f"pyiceberg {VERSION}: pyiceberg.table.update._update_table_metadata_log no longer "
        "takes (base_metadata, metadata_location, last_updated_ms) but (metadata, location); "
        "icespool's fence daemon/iceberg/_upstream/_metadata.py needs an update"
    )


def test_an_update_type_added_upstream_turns_red(monkeypatch: pytest.MonkeyPatch) -> None:
    original = update_module._apply_table_update

    @functools.singledispatch
    def patched(update: Any, base_metadata: Any, context: Any) -> Any:
        raise NotImplementedError

    for kind, handler in original.registry.items():
        if kind is not object:
            patched.register(kind, handler)

    class AddViewVersionUpdate:
        pass

    patched.register(AddViewVersionUpdate, lambda update, base_metadata, context: base_metadata)
    monkeypatch.setattr(update_module, "_apply_table_update", patched)
    assert _raised(monkeypatch) == (
        f"pyiceberg {VERSION}: pyiceberg.table.update._apply_table_update handles other "
        "update types (+AddViewVersionUpdate); icespool's fence "
        "daemon/iceberg/_upstream/_metadata.py needs an update"
    )


def test_a_step_added_to_update_table_metadata_turns_red(monkeypatch: pytest.MonkeyPatch) -> None:
    original = update_module.update_table_metadata

    def update_table_metadata(
        base_metadata: TableMetadata,
        updates: tuple[TableUpdate, ...],
        enforce_validation: bool = False,
        metadata_location: str | None = None,
    ) -> TableMetadata:
        metadata = original(base_metadata, updates, enforce_validation, metadata_location)
        metadata.validate_refs()  # a step apply_updates does not take
        return metadata

    monkeypatch.setattr(update_module, "update_table_metadata", update_table_metadata)
    message = _raised(monkeypatch)
    assert message.startswith(
        f"pyiceberg {VERSION}: pyiceberg.table.update.update_table_metadata changed its "
        "steps (+validate_refs, -TableMetadataUtil, "
    )
    assert message.endswith(
        "; icespool's fence daemon/iceberg/_upstream/_metadata.py needs an update"
    )


def test_several_changes_say_how_many_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Transaction, "_stage")
    monkeypatch.delattr(Table, "_do_commit")
    assert _raised(monkeypatch) == (
        f"pyiceberg {VERSION}: pyiceberg.table.Transaction._stage is gone; icespool's fence "
        "daemon/iceberg/_upstream/_transaction.py needs an update (and 1 more)"
    )


def test_a_version_outside_the_tested_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyiceberg, "__version__", "0.13.0")
    assert _raised(monkeypatch) == (
        "pyiceberg 0.13.0: outside the versions icespool's fence daemon/iceberg/_upstream/ "
        "was tested with (>=0.12,<0.13); install a version in that range"
    )


def test_the_command_line_fails_with_the_one_line(tmp_path: Path) -> None:
    """A real process fails at start with the one line (the module object changed before
    the daemon is imported, as an upgraded pyiceberg would be)."""
    script = textwrap.dedent(
        """
        import sys
        import pyiceberg.table.update as update
        del update._TableMetadataUpdateContext  # an upstream that renamed it
        from icespool.cli import main
        sys.exit(main(["check-config", "--connect", "--config", sys.argv[1]]))
        """
    )
    config = tmp_path / "icespool.toml"
    config.write_text(
        f'[catalog]\nname = "c"\ntype = "sql"\nuri = "sqlite:///{tmp_path}/c.db"\n'
        f'warehouse = "file://{tmp_path}/warehouse"\n[spool]\ndir = "{tmp_path}/spool"\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr  # check-config: what would fail at start
    message = (
        f"pyiceberg {VERSION}: pyiceberg.table.update._TableMetadataUpdateContext is gone; "
        "icespool's fence daemon/iceberg/_upstream/_metadata.py needs an update"
    )
    # The CLI imports the daemon lazily, inside its error handler: one "error:" line.
    assert done.stderr.splitlines()[-1] == f"error: {message}"
    assert done.stderr.count(message) == 1


# ---------------------------------------------------------------- replaced behaviours


def _snapshot(snapshot_id: int, parent: int | None, sequence: int, at: int) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=sequence,
        timestamp_ms=at,
        manifest_list=f"file:///tmp/snap-{snapshot_id}.avro",
        summary=Summary(Operation.APPEND, **{"icespool.segments": f"seg-{snapshot_id}"}),
        schema_id=0,
    )


def _base() -> TableMetadata:
    spec = PartitionSpec(PartitionField(2, 1000, DayTransform(), "at_day"))
    metadata = new_table_metadata(
        SCHEMA, spec, UNSORTED_SORT_ORDER, "file:///tmp/t", {"keep": "1"}, uuid.uuid4()
    )
    updates: list[TableUpdate] = []
    for index in range(1, 6):
        updates.append(
            AddSnapshotUpdate(snapshot=_snapshot(index, index - 1 or None, index, 1_000 + index))
        )
        updates.append(
            SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=index)
        )
    updates.append(SetSnapshotRefUpdate(ref_name="tag-2", type=SnapshotRefType.TAG, snapshot_id=2))
    updates.append(
        SetStatisticsUpdate(
            statistics=StatisticsFile(
                snapshot_id=2,
                statistics_path="file:///tmp/stats-2.puffin",
                file_size_in_bytes=10,
                file_footer_size_in_bytes=4,
                blob_metadata=[
                    BlobMetadata(
                        type="apache-datasketches-theta-v1",
                        snapshot_id=2,
                        sequence_number=2,
                        fields=[1],
                        properties={},
                    )
                ],
            )
        )
    )
    return update_table_metadata(metadata, tuple(updates))


def _comparable(metadata: TableMetadata) -> dict[str, Any]:
    dumped = metadata.model_dump()
    dumped.pop("last-updated-ms")  # stamped with the clock when no update sets it
    return dumped


UPDATE_SETS: dict[str, tuple[TableUpdate, ...]] = {
    "properties": (
        SetPropertiesUpdate(updates={"a": "1", "b": "2"}),
        RemovePropertiesUpdate(removals=["keep"]),
    ),
    "append": (
        AddSnapshotUpdate(snapshot=_snapshot(6, 5, 6, 2_000)),
        SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=6),
    ),
    "schema": (
        AddSchemaUpdate(
            schema_=Schema(*SCHEMA.fields, NestedField(4, "extra", LongType()), schema_id=1),
        ),
        SetCurrentSchemaUpdate(schema_id=-1),
    ),
    # Removes the tag and the statistics of snapshot 2 with it, and re-parents 3.
    "expiry": (RemoveSnapshotsUpdate(snapshot_ids=[1, 2]),),
    "expiry after properties": (
        SetPropertiesUpdate(updates={"x": "y"}),
        RemoveSnapshotsUpdate(snapshot_ids=[3]),
    ),
    "nothing": (),
}


@pytest.mark.parametrize("name", list(UPDATE_SETS))
def test_apply_updates_gives_upstreams_metadata(name: str) -> None:
    base = _base()
    updates = UPDATE_SETS[name]
    location = "file:///tmp/t/metadata/00005-x.metadata.json"
    ours = apply_updates(base, updates, location)
    theirs = update_table_metadata(base, updates, metadata_location=location)
    assert _comparable(ours) == _comparable(theirs)
    if not updates:
        assert ours is base  # nothing changed: the same object, no copy


def test_apply_updates_last_updated_matches_upstream_when_an_update_sets_it() -> None:
    base = _base()
    updates = UPDATE_SETS["append"]
    assert apply_updates(base, updates).last_updated_ms == 2_000
    assert update_table_metadata(base, updates).last_updated_ms == 2_000


def test_remove_snapshots_fails_as_upstream_does() -> None:
    base = _base()
    update = (RemoveSnapshotsUpdate(snapshot_ids=[2, 99]),)
    with pytest.raises(ValueError, match="snapshot id 99") as ours:
        apply_updates(base, update)
    with pytest.raises(ValueError, match="snapshot id 99") as theirs:
        update_table_metadata(base, update)
    # Upstream's message goes on with every snapshot of the table; ours stops there.
    assert str(ours.value) == "Snapshot with snapshot id 99 does not exist"
    assert str(theirs.value).startswith(f"{ours.value}: [Snapshot(snapshot_id=1, ")


def test_summary_value_reads_what_summary_get_reads() -> None:
    snapshot = _snapshot(7, None, 1, 1_000)
    assert snapshot.summary is not None
    # The keys beside the operation (all icespool reads this way), as Summary.get has them.
    for key in ("icespool.segments", "absent"):
        assert summary_value(snapshot, key) == snapshot.summary.get(key)
    assert summary_value(snapshot, "icespool.segments") == "seg-7"
    assert summary_value(snapshot.model_copy(update={"summary": None}), "x") is None


def test_partition_key_keeps_the_physical_record() -> None:
    spec = PartitionSpec(PartitionField(2, 1000, DayTransform(), "at_day"), spec_id=0)
    record = Record(19_000)
    key = physical_partition_key(spec, SCHEMA, [19_000], record)
    assert key.partition is record
    assert key.to_path() == "at_day=2022-01-08"


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = SqlCatalog(
        "fence", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh"
    )
    catalog.create_namespace("ns")
    return catalog.create_table("ns.t", SCHEMA, properties={"keep": "1"})


def test_staging_gives_upstreams_pending_metadata(table: Table) -> None:
    ours = Staging(table).set_properties({"a": "1"}).remove_properties("keep")
    theirs = Transaction(table).set_properties({"a": "1"}).remove_properties("keep")
    assert _comparable(ours.table_metadata) == _comparable(theirs.table_metadata)
    assert staged_updates(ours) == theirs._updates
    assert ours.table_metadata is ours.table_metadata  # derived once per change
    assert ours.table_metadata.properties == {
        **{k: v for k, v in table.metadata.properties.items() if k != "keep"},
        "a": "1",
    }


# ---------------------------------------------------------------- nothing outside the fence


def _touches(path: Path, tree: ast.AST, vocabulary: set[str]) -> list[str]:
    return touches(path.relative_to(REPO), tree, "pyiceberg", vocabulary)


def test_nothing_outside_the_fence_touches_pyiceberg_private_names() -> None:
    modules = outside(REPO / "daemon", FENCE)
    ours: set[str] = set()
    for tree in modules.values():
        ours |= defined_by(tree)
    # A private name pyiceberg uses that a module of ours also defines for itself (a
    # `_log`, a `_lock`) says nothing about whom an access reaches; the import and
    # subclass rules still catch those.
    vocabulary = private_attributes(Path(pyiceberg.__file__).parent) - ours
    assert {"_do_commit", "_updates", "_snapshot_producers", "_iceberg_type_filter"} <= vocabulary
    found = [line for path, tree in modules.items() for line in _touches(path, tree, vocabulary)]
    assert found == []


def test_the_scan_sees_a_touch(tmp_path: Path) -> None:
    """The scan is not blind: each rule flags the forms it is for."""
    tree = ast.parse(
        textwrap.dedent(
            """
            import pyiceberg.table.update as update
            from pyiceberg.table.update import _apply_table_update
            from pyiceberg.table import Transaction

            class Mine(Transaction):
                def _stage(self, updates):
                    return updates

            def send(transaction):
                update._TableMetadataUpdateContext()
                transaction._table._do_commit()
            """
        )
    )
    found = _touches(REPO / "daemon" / "x.py", tree, {"_do_commit", "_table"})
    assert found == [
        "daemon/x.py:3: imports pyiceberg.table.update._apply_table_update",
        "daemon/x.py:11: update..._TableMetadataUpdateContext",
        "daemon/x.py:12: ._do_commit (a pyiceberg private name)",
        "daemon/x.py:12: ._table (a pyiceberg private name)",
        "daemon/x.py:7: Mine overrides pyiceberg's _stage",
    ]
