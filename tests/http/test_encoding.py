"""Request bodies with Content-Encoding (RFC 9110 8.4), over real HTTP to a real service:
every coding and layered codings on /records (NDJSON, JSON array, Arrow) and /changes,
each record committed once; unknown codings 415 before the body is read; corrupt and
truncated streams 400 naming the coding; decompression bombs stopped at the body limit
while decoding (413), the allocation bounded by that limit, not by the bomb."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import brotli
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import zstandard
from pyiceberg.catalog import load_catalog
from support.cdc_tables import merged_rows
from support.fixture_types import MakeConfig, RunDaemon
from support.service_helpers import table_rows

from icespool.config import embedded_default
from icespool.http._encoding import DecodedTooLarge, Decoding, codings
from icespool.lifecycle.service import Icespool

DEMO = "demo.events"
KEYED = "shop.items"
NDJSON = "application/x-ndjson"
LIMIT = 1 << 20
ONE = b'{"event_id": 1}\n'


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
    "identity": bytes,
}


def _encoded(data: bytes, header: str, raw_deflate: bool = False) -> bytes:
    """``data`` with the codings of ``header`` applied in the order listed."""
    for name in (part.strip() for part in header.split(",")):
        data = _raw_deflate(data) if name == "deflate" and raw_deflate else ENCODERS[name](data)
    return data


@pytest.fixture
async def served(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> AsyncIterator[tuple[Icespool, str]]:
    demo = embedded_default()["tables"][0]
    keyed = {
        "name": KEYED,
        "create": True,
        "key": ["id"],
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
        ],
    }
    async with run_daemon(make_config(tables=[demo, keyed]), max_body_bytes=LIMIT) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    encoding: str | list[str] | None,
    content_type: str = NDJSON,
) -> tuple[int, Any]:
    headers: list[tuple[str, str]] = [("Content-Type", content_type)]
    if isinstance(encoding, str):
        headers.append(("Content-Encoding", encoding))
    elif encoding is not None:
        headers += [("Content-Encoding", value) for value in encoding]
    async with session.post(url, data=body, headers=headers) as reply:
        return reply.status, await reply.json()


def _arrow(ids: range) -> bytes:
    table = pa.table({"event_id": pa.array(list(ids), pa.int64())})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


HEADERS = [
    "gzip",
    "x-gzip",
    "deflate",
    "br",
    "zstd",
    "identity",
    "gzip, deflate",
    "zstd, br, gzip",
    "identity, gzip",
    "GZip",
]


async def test_every_coding_and_layers_of_them_are_undone_for_every_format(
    served: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = served
    url = f"{base}/v1/tables/{DEMO}/records"
    expected: list[int] = []
    next_id = 0
    for header in HEADERS:
        for kind in ("ndjson", "json", "arrow", "raw-deflate"):
            if kind == "raw-deflate" and "deflate" not in header:
                continue
            ids = range(next_id, next_id + 50)
            next_id += 50
            records = [{"event_id": i, "kind": header} for i in ids]
            if kind == "json":
                data, content_type = json.dumps(records).encode(), "application/json"
            elif kind == "arrow":
                data, content_type = _arrow(ids), "application/vnd.apache.arrow.stream"
            else:
                data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
                content_type = NDJSON
            body = _encoded(data, header.lower(), raw_deflate=kind == "raw-deflate")
            status, answer = await _post(session, url, body, header, content_type)
            assert (status, answer) == (200, {"accepted": 50}), (header, kind)
            expected += ids
    # Codings in several headers are applied in the order the headers come.
    ids = range(next_id, next_id + 3)
    data = b"".join(b'{"event_id": %d}\n' % i for i in ids)
    body = _encoded(data, "br, gzip, deflate")
    assert await _post(session, url, body, ["br", "gzip, deflate"]) == (200, {"accepted": 3})
    expected += ids
    async with session.post(f"{base}/v1/tables/{DEMO}/flush") as reply:
        assert reply.status == 200
    assert sorted(row["event_id"] for row in table_rows(service, DEMO)) == expected


async def test_changes_take_encoded_bodies_too(
    served: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = served
    url = f"{base}/v1/tables/{KEYED}/changes"
    lines = [
        {"id": 1, "name": "a", "_op": "upsert"},
        {"id": 2, "name": "b", "_op": "upsert"},
        {"id": 1, "_op": "delete"},
        {"id": 3, "name": "c", "_op": "upsert"},
    ]
    body = gzip.compress(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    assert await _post(session, url, body, "gzip") == (200, {"accepted": 4})
    body = zstandard.ZstdCompressor().compress(b'{"id": 2, "name": "B", "_op": "upsert"}\n')
    assert await _post(session, url, body, "zstd") == (200, {"accepted": 1})
    async with session.post(f"{base}/v1/tables/{KEYED}/flush") as reply:
        assert reply.status == 200
    config = service.config
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    assert merged_rows(catalog.load_table(KEYED), ["id"]) == {
        (2,): {"id": 2, "name": "B"},
        (3,): {"id": 3, "name": "c"},
    }


UNSUPPORTED = (
    "send the body as it is (identity) or encoded with gzip, x-gzip, deflate, br or zstd "
    "(several, comma-separated, in the order they were applied)"
)


@pytest.mark.parametrize(
    ("header", "named"),
    [("compress", "compress"), ("gzip, lz4", "lz4"), ("x-snappy-framed", "x-snappy-framed")],
)
async def test_an_unknown_coding_is_415_naming_it_and_never_parsed(
    served: tuple[Icespool, str], session: aiohttp.ClientSession, header: str, named: str
) -> None:
    service, base = served
    # Valid NDJSON as plain text: taken as sent it would be accepted.
    status, answer = await _post(session, f"{base}/v1/tables/{DEMO}/records", ONE, header)
    assert status == 415
    assert answer == {"error": f"unsupported Content-Encoding {named!r}; {UNSUPPORTED}"}
    assert service.table_writer(DEMO).pending_records == 0


ONE_ZSTD = zstandard.ZstdCompressor().compress(ONE)


def _zstd_wide(data: bytes) -> bytes:
    """A zstd stream whose frame asks for a 64 MiB window (size unknown up front)."""
    wide = zstandard.ZstdCompressionParameters(window_log=26)
    packer = zstandard.ZstdCompressor(compression_params=wide).compressobj()
    return packer.compress(data) + packer.flush()


HEADER_CHECK = "Error -3 while decompressing data: incorrect header check"
ENDS_EARLY = "the stream ends before it is complete"
CORRUPT = [
    # (coding, body, the reason after "the request body is not valid <coding> ...: ")
    ("gzip", ONE, HEADER_CHECK),
    # mtime=0: a gzip header holds the time, and test ids made at different seconds
    # differ between xdist workers (which then refuse to run).
    ("gzip", gzip.compress(ONE, mtime=0)[:-4], ENDS_EARLY),
    ("gzip", gzip.compress(ONE, mtime=0) + b"junk", HEADER_CHECK),
    ("gzip", b"", ENDS_EARLY),
    ("deflate", zlib.compress(ONE)[:-2], ENDS_EARLY),
    ("deflate", zlib.compress(ONE) + b"x", "there are bytes after the end of the stream"),
    ("br", ONE, "brotli: decoder failed"),
    ("br", brotli.compress(ONE * 100)[:-3], ENDS_EARLY),
    ("zstd", ONE, "zstd decompressor error: Unknown frame descriptor"),
    ("zstd", ONE_ZSTD[:-2], ENDS_EARLY),
    # Past what the body limit needs: the decoder would allocate 64 MiB for it.
    (
        "zstd",
        _zstd_wide(ONE),
        "zstd decompressor error: Frame requires too much memory for decoding",
    ),
]


@pytest.mark.parametrize(
    ("coding", "body", "reason"),
    CORRUPT,
    ids=[f"{coding}-{n}" for n, (coding, _, _) in enumerate(CORRUPT)],
)
async def test_a_corrupt_or_truncated_stream_is_400_naming_the_coding(
    served: tuple[Icespool, str],
    session: aiohttp.ClientSession,
    coding: str,
    body: bytes,
    reason: str,
) -> None:
    service, base = served
    url = f"{base}/v1/tables/{DEMO}/records"
    assert await _post(session, url, body, coding) == (
        400,
        {"error": f"the request body is not valid {coding} (Content-Encoding): {reason}"},
    )
    assert service.table_writer(DEMO).pending_records == 0
    # The connection and the daemon serve the next request.
    assert await _post(session, url, gzip.compress(b'{"event_id": 7}\n'), "gzip") == (
        200,
        {"accepted": 1},
    )


def _bomb(coding: str, size: int) -> bytes:
    """``size`` zero bytes compressed, without holding them."""
    chunk, rounds = bytes(1 << 20), size >> 20
    if coding == "gzip":
        packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return b"".join(packer.compress(chunk) for _ in range(rounds)) + packer.flush()
    if coding == "deflate":
        packer = zlib.compressobj(9)
        return b"".join(packer.compress(chunk) for _ in range(rounds)) + packer.flush()
    if coding == "br":
        squeezer = brotli.Compressor(quality=5)
        parts = [squeezer.process(chunk) for _ in range(rounds)]
        return b"".join(parts) + squeezer.finish()
    cctx = zstandard.ZstdCompressor().compressobj()
    return b"".join(cctx.compress(chunk) for _ in range(rounds)) + cctx.flush()


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
async def test_a_decompression_bomb_is_413_and_decoding_stops_at_the_limit(
    served: tuple[Icespool, str], session: aiohttp.ClientSession, coding: str
) -> None:
    service, base = served
    bomb = _bomb(coding, 256 << 20)  # 256 MiB of zeros
    assert len(bomb) < LIMIT
    # Decoding it alone: the allocation stays near the limit, not near 256 MiB.
    tracemalloc.start()
    try:
        with pytest.raises(DecodedTooLarge) as refused:
            Decoding(bomb, codings([coding]), LIMIT).whole()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(refused.value) == f"more than {LIMIT} bytes after undoing Content-Encoding {coding}"
    assert peak < len(bomb) + 2 * LIMIT + (1 << 20), peak
    # Over HTTP, also under a second coding (the bomb's layer is the inner one).
    url = f"{base}/v1/tables/{DEMO}/records"
    too_large = (
        f"request body too large: more than {LIMIT} bytes after undoing Content-Encoding "
        f"{coding}, the limit is {LIMIT} bytes (http.max_body_bytes); split the records over "
        "several requests"
    )
    assert await _post(session, url, bomb, coding) == (413, {"error": too_large})
    assert await _post(session, url, gzip.compress(bomb), f"{coding}, gzip") == (
        413,
        {"error": too_large},
    )
    assert service.table_writer(DEMO).pending_records == 0
    # A body that decodes to just under the limit is taken whole.
    line = b'{"event_id": 1, "kind": "%s"}\n' % (b"k" * 60)
    body = line * ((LIMIT - 100) // len(line))
    assert await _post(session, url, gzip.compress(body), "gzip") == (
        200,
        {"accepted": body.count(b"\n")},
    )


async def test_a_replay_request_is_decoded_the_same_way(
    served: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = served
    url = f"{base}/v1/tables/{DEMO}_dead_letter/replay"
    # Decoded and parsed: the filter is valid, the table simply has no dead letters.
    status, answer = await _post(session, url, gzip.compress(b"{}"), "gzip", "application/json")
    assert status == 404, answer
    assert await _post(session, url, gzip.compress(b"{nope"), "gzip", "application/json") == (
        400,
        {
            "error": "the replay request is not JSON: Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1)"
        },
    )
    assert await _post(session, url, b"{}", "gzip", "application/json") == (
        400,
        {
            "error": "the request body is not valid gzip (Content-Encoding): Error -3 while "
            "decompressing data: incorrect header check"
        },
    )
    assert await _post(session, url, b"{}", "compress", "application/json") == (
        415,
        {"error": f"unsupported Content-Encoding 'compress'; {UNSUPPORTED}"},
    )
