"""Deletion vectors (icespool.iceberg: serialize_vector, encode_deletion_vectors,
read_deletion_vector): the Puffin spec's ``deletion-vector-v1`` blob framing byte for
byte, a round trip through pyiceberg's own Puffin and deletion-vector reader, damaged
blobs refused, and one Puffin file per call whose manifest entries point at each blob.
(That Spark's vectors decode, and Spark reads these: tests/spark/test_spark_upserts_v3.py.)
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile
from pyiceberg.types import LongType, NestedField
from support.maintenance_helpers import ENCODE, local_path, sql_catalog

from icespool.cdc import LiveData, Located, read_positions
from icespool.iceberg import (
    deserialize_vector,
    encode_data_files,
    encode_deletion_vectors,
    read_deletion_vector,
    serialize_vector,
    v3_value,
)
from icespool.iceberg._catalog import ensure_table


def _positions(values: list[int]) -> np.ndarray:
    return np.asarray(sorted(set(values)), dtype=np.int64)


def test_the_blob_is_the_specs_framing_byte_for_byte() -> None:
    """{0, 1, 2, 5}: one 32-bit Roaring bitmap (key 0) holding an array container (four
    16-bit values are smaller than its two runs), framed as the Puffin spec says."""
    blob = serialize_vector(_positions([0, 1, 2, 5]))
    roaring = bytes.fromhex(
        "3a300000"  # cookie 12346: no run containers
        "01000000"  # one container
        "0000"
        "0300"  # its key 0 and cardinality - 1
        "10000000"  # its offset (16: after the header)
        "0000"
        "0100"
        "0200"
        "0500"  # the values
    )
    vector = bytes.fromhex("0100000000000000") + bytes(4) + roaring  # 1 bitmap, key 0
    body = bytes.fromhex("d1d33964") + vector
    assert blob[:4] == len(body).to_bytes(4, "big") == bytes.fromhex("00000028")
    assert blob[4:-4] == body
    assert blob[-4:] == zlib.crc32(body).to_bytes(4, "big") == bytes.fromhex("a64a648d")


def test_runs_are_written_as_run_containers() -> None:
    """A long run of deleted rows (Java run-optimizes before writing): a few bytes."""
    blob = serialize_vector(np.arange(100_000, dtype=np.int64))
    assert len(blob) < 64
    assert np.array_equal(deserialize_vector(blob), np.arange(100_000))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 70_000),
            st.integers(2**32 - 5, 2**32 + 5),
            st.integers(3 * 2**32, 3 * 2**32 + 100),
        ),
        max_size=300,
    )
)
def test_round_trip_through_pyicebergs_reader(values: list[int]) -> None:
    """Any set of positions (across 32-bit keys, with empty keys between) written as a
    Puffin file reads back the same with ours, and with pyiceberg's reader where it can
    read it (pyiceberg 0.12 fails on a vector with an empty 32-bit key: it builds an
    Arrow array from an empty list first; Java writes those keys too)."""
    from icespool.iceberg._deletion_vectors import VectorBlob, puffin_file

    positions = _positions(values)
    blob = serialize_vector(positions)
    assert np.array_equal(deserialize_vector(blob), positions)
    content, offsets = puffin_file([VectorBlob("s3://b/data/x.parquet", blob, len(positions))])
    assert offsets == [4] and content[:4] == content[-4:] == b"PFA1"
    (vector,) = deletion_vectors_from_puffin_file(PuffinFile(content))
    assert vector.referenced_data_file == "s3://b/data/x.parquet"
    if len(positions) and len({int(p) >> 32 for p in positions}) == (int(positions[-1]) >> 32) + 1:
        assert vector.to_vector().to_pylist() == positions.tolist()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-1], "says 40 bytes of vector, has 39"),
        (lambda b: b[:4] + b"\x00" + b[5:], "deletion vector magic 00d33964"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum does not match"),
        (lambda b: b[:8], "too short"),
    ],
)
def test_a_damaged_blob_is_refused(damage: object, message: str) -> None:
    blob = serialize_vector(_positions([0, 1, 2, 5]))
    with pytest.raises(ValueError, match=message):
        deserialize_vector(damage(blob))  # type: ignore[operator]


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = sql_catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    properties = {"format-version": "3"}
    return ensure_table(catalog, "dv.t", schema, UNPARTITIONED_PARTITION_SPEC, properties, True)


def test_one_puffin_file_holds_a_vector_per_data_file(table: Table) -> None:
    files = [
        encode_data_files(
            table, pa.table({"id": range(n, n + 50)}).to_batches(), file_prefix=f"d{n}", **ENCODE
        )[0]
        for n in (0, 100)
    ]
    wanted = {files[0].file_path: _positions([3, 7]), files[1].file_path: _positions([0, 49])}
    located = Located(wanted, {f.file_path: LiveData(f, 1, 0) for f in files})
    written = encode_deletion_vectors(table, located, file_prefix="seg-dv0")
    assert set(written) == set(wanted)
    (path,) = {v.file_path for v in written.values()}
    assert path.endswith("/data/seg-dv0-00000-00000.puffin")
    with open(local_path(path), "rb") as stream:
        content = stream.read()
    footer = PuffinFile(content).footer
    assert footer.properties == {"created-by": "icespool"}
    blobs = {b.properties["referenced-data-file"]: b for b in footer.blobs}
    for data_path, entry in written.items():
        blob = blobs[data_path]
        assert (blob.type, blob.fields, blob.snapshot_id, blob.sequence_number) == (
            "deletion-vector-v1",
            [2147483545],
            -1,
            -1,
        )
        assert blob.compression_codec is None
        assert blob.properties["cardinality"] == "2"
        assert entry.content == DataFileContent.POSITION_DELETES
        assert entry.file_format == FileFormat.PUFFIN
        assert entry.record_count == 2 and entry.file_size_in_bytes == len(content)
        assert v3_value(entry, "referenced_data_file") == data_path
        assert v3_value(entry, "content_offset") == blob.offset
        assert v3_value(entry, "content_size_in_bytes") == blob.length
        assert np.array_equal(read_deletion_vector(table.io, entry), wanted[data_path])
        assert read_positions(table.io, entry).keys() == {data_path}
    # The footer is the spec's: compact JSON, its length, no flags, the magic.
    size = int.from_bytes(content[-12:-8], "little")
    assert content[-8:-4] == bytes(4)
    assert json.loads(content[-12 - size : -12]) == json.loads(footer.model_dump_json())
