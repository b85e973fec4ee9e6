"""Offset ranges and the commit-time claims that make Kafka ingestion exactly-once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icespool.kafka._offsets import (
    OffsetBook,
    OffsetClaims,
    OffsetsMovedError,
    Ranges,
    batch_meta,
    offsets_key,
    parse_offsets_key,
)
from icespool.metrics import Metrics


def test_ranges_text_round_trip_and_merge() -> None:
    r = Ranges.parse("5-9,0-3,4-4,20-25")
    assert str(r) == "0-9,20-25"
    assert Ranges.parse(str(r)) == r
    assert Ranges.parse("") == Ranges() and not Ranges()
    assert r.next_position() == 10
    assert Ranges().next_position() is None


@pytest.mark.parametrize("bad", ["1", "a-b", "5-1", "1-2,", "-1-3"])
def test_bad_range_text_names_the_part(bad: str) -> None:
    with pytest.raises(ValueError, match="bad offset range"):
        Ranges.parse(bad)


def test_runs_of_sorted_offsets() -> None:
    assert str(Ranges.runs([3, 4, 5, 9, 11, 12])) == "3-5,9-9,11-12"
    assert not Ranges.runs([])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30)), max_size=8),
    st.lists(st.integers(0, 240), max_size=50),
)
def test_mask_and_contains_agree_with_a_set(spans: list[tuple[int, int]], probe: list[int]) -> None:
    ranges = Ranges.of((a, a + n) for a, n in spans)
    members = {x for a, n in spans for x in range(a, a + n + 1)}
    offsets = np.asarray(probe, dtype=np.int64)
    assert ranges.mask(offsets).tolist() == [x in members for x in probe]
    assert [ranges.contains(x) for x in probe] == [x in members for x in probe]
    assert set(ranges.offsets().tolist()) == members
    other = Ranges.runs(sorted(set(probe)))
    assert ranges.overlaps(other) == bool(members & set(probe))
    assert set(ranges.union(other).offsets().tolist()) == members | set(probe)
    assert set(ranges.minus(other).offsets().tolist()) == members - set(probe)
    assert ranges.minus(other) == Ranges.runs(sorted(members - set(probe)))


def test_key_round_trip_escapes_the_group() -> None:
    key = offsets_key("team/a", "events", 7)
    assert parse_offsets_key(key) == ("team/a", "events", 7)
    assert parse_offsets_key("write.format.default") is None


def _batch(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})


class _Book:
    """One table's offset book and a way to read how many rows its claims dropped."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.book = OffsetBook("t.x", self.metrics)

    def claims(self) -> OffsetClaims:
        return self.book.claims()

    @property
    def dropped(self) -> float:
        value = self.metrics.registry.get_sample_value(
            "icespool_kafka_duplicates_dropped_total", {"table": "t.x"}
        )
        return value or 0.0


def test_claims_drop_rows_the_table_holds_and_merge_ranges() -> None:
    key = offsets_key("g", "t", 0)
    meta = batch_meta("g", "t", 0, Ranges.of([(10, 19)]), Ranges.runs([10, 12, 15, 19]))
    book = _Book()
    claims = book.claims()
    kept = claims.filter([_batch([10, 12, 15, 19])], [meta], {key: "0-12"})
    assert book.dropped == 2
    assert kept[0].column("id").to_pylist() == [15, 19]
    assert claims.properties({key: "0-12"}) == {key: "0-19"}
    assert claims.summary() == {"icespool.kafka-offsets": "g/t/0=10-19"}


def test_claims_keep_an_offset_spooled_twice_once() -> None:
    # A source that re-read offsets still spooled (its table degraded at start-up)
    # spools them again; one commit holding both copies must add each row once.
    meta = batch_meta("g", "t", 0, Ranges.of([(0, 9)]), Ranges.runs(list(range(10))))
    again = batch_meta("g", "t", 0, Ranges.of([(5, 14)]), Ranges.runs(list(range(5, 15))))
    book = _Book()
    claims = book.claims()
    kept = claims.filter([_batch(list(range(10))), _batch(list(range(5, 15)))], [meta, again], {})
    assert book.dropped == 5
    assert [i for b in kept for i in b.column("id").to_pylist()] == list(range(15))
    assert claims.covered() == {offsets_key("g", "t", 0): Ranges.of([(0, 14)])}


def test_claims_refuse_when_another_replica_committed_our_rows() -> None:
    key = offsets_key("g", "t", 3)
    meta = batch_meta("g", "t", 3, Ranges.of([(100, 199)]), Ranges.runs(range(100, 200)))
    book = _Book()
    claims = book.claims()
    kept = claims.filter([_batch(list(range(100, 200)))], [meta], {})
    assert book.dropped == 0 and kept[0].num_rows == 100
    # Meanwhile the partition's new owner committed 150-300: ours overlap.
    with pytest.raises(OffsetsMovedError, match="overlap"):
        claims.properties({key: "0-99,150-300"})
    # Not overlapping rows (the other replica committed a range without our rows).
    assert claims.properties({key: "0-99,250-300"}) == {key: "0-199,250-300"}


def test_batches_without_kafka_meta_pass_unchanged() -> None:
    book = _Book()
    claims = book.claims()
    batch = _batch([1, 2])
    kept = claims.filter([batch], [None], {})
    assert kept == [batch] and book.dropped == 0 and not claims


def test_claims_reject_inconsistent_metadata() -> None:
    meta = batch_meta("g", "t", 0, Ranges.of([(0, 9)]), Ranges.runs([0, 1, 2]))
    with pytest.raises(Exception, match="3 offsets"):
        _Book().claims().filter([_batch([1, 2])], [meta], {})
