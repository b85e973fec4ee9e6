"""The operator metrics, scraped from a real daemon's GET /metrics after real work:
process_*, build info, the HTTP ack histogram, rejected records per table and reason,
the age of each table's last commit, and no Kafka gauge on a daemon without Kafka."""

from __future__ import annotations

import asyncio
import io
import platform
from importlib import metadata
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
import pyiceberg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fixture_types import MakeConfig, RunDaemon

EVENTS = "demo.events"
STRICT = "demo.strict"  # add-columns: a type promotion is a refused schema change
NDJSON = {"Content-Type": "application/x-ndjson"}
ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _of(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


async def _scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        return _parse(await r.text())


async def _post(
    http: aiohttp.ClientSession, url: str, table: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    async with http.post(f"{url}/v1/tables/{table}/records", data=body, headers=headers) as r:
        return r.status, await r.json()


def _arrow(columns: dict[str, pa.Array]) -> bytes:
    batch = pa.RecordBatch.from_pydict(columns)
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


@pytest.fixture
def config(make_config: MakeConfig) -> Any:
    events = {
        "name": EVENTS,
        "create": True,
        "schema": [
            {"name": "event_id", "type": "long", "required": True},
            {"name": "kind", "type": "string"},
        ],
    }
    strict = {
        "name": STRICT,
        "create": True,
        "evolve": "add-columns",
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "n", "type": "int"},
            {"name": "amount", "type": "decimal(10, 2)"},
        ],
    }
    return make_config(tables=[events, strict])


async def test_process_and_build_info_and_no_kafka_gauge_without_kafka(
    run_daemon: RunDaemon, config: Any
) -> None:
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as http:
        samples = await _scrape(http, url)
    assert _of(samples, "icespool_build_info") == {
        _labels(
            version=metadata.version("icespool"),
            python=platform.python_version(),
            pyarrow=pa.__version__,
            pyiceberg=pyiceberg.__version__,
        ): 1.0
    }
    rss = samples[("process_resident_memory_bytes", frozenset())]
    assert 10 * 2**20 < rss < 8 * 2**30  # a real figure of this process, not a placeholder
    assert samples[("process_open_fds", frozenset())] >= 3
    assert samples[("process_cpu_seconds_total", frozenset())] > 0
    assert samples[("process_max_fds", frozenset())] >= samples[("process_open_fds", frozenset())]
    assert len(_of(samples, "python_info")) == 1
    # No Kafka source: no series at all (a 0 would page as "Kafka down").
    assert not _of(samples, "icespool_kafka_connected")
    # Nothing committed by this process yet: the age is absent, not 0 or NaN.
    assert not _of(samples, "icespool_table_last_commit_age_seconds")
    assert not _of(samples, "icespool_records_rejected_total")
    assert not _of(samples, "icespool_http_ack_duration_seconds_count")


async def test_acks_rejections_and_commit_age_after_real_traffic(
    run_daemon: RunDaemon, config: Any
) -> None:
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as http:
        # ---- acks: 4 to demo.events (2 NDJSON, 2 Arrow), 1 to demo.strict
        acked = [
            (EVENTS, b'{"event_id": 1}\n{"event_id": 2, "kind": "a"}\n', NDJSON, 2),
            (EVENTS, b'{"event_id": 3}\n', NDJSON, 1),
            (EVENTS, _arrow({"event_id": pa.array([4, 5, 6], pa.int64())}), ARROW, 3),
            (EVENTS, _arrow({"event_id": pa.array([7], pa.int64())}), ARROW, 1),
            (STRICT, b'{"id": 1, "n": 5}\n', NDJSON, 1),
        ]
        for table, body, headers, count in acked:
            assert await _post(http, url, table, body, headers) == (200, {"accepted": count})
        # ---- rejections: every body whole, counted in records where they can be read
        deep = b'{"event_id": 1, "kind": ' + b"[" * 100 + b"]" * 100 + b"}\n"
        rejected = [
            # invalid JSON on line 3 of 3 non-blank lines (the blank one is no record)
            (EVENTS, b'{"event_id": 1}\n\n{"event_id": 2}\n{"event_id":\n', NDJSON),
            (EVENTS, b'{"event_id": 1, "kind": "\xff"}\n{"event_id": 2}\n', NDJSON),
            (EVENTS, deep, NDJSON),
            (EVENTS, b"", NDJSON),  # no record at all: counts as one
            (EVENTS, b"not an arrow stream", ARROW),  # unreadable: counts as one
            (EVENTS, _arrow({"event_id": pa.array(["a", "b", "c", "d"])}), ARROW),  # 4 rows
            (STRICT, b'{"id": 2, "n": 5000000000}\n{"id": 3}\n', NDJSON),  # int -> long
            (STRICT, b'{"id": 4, "amount": 1e99999}\n', NDJSON),
        ]
        errors = []
        for table, body, headers in rejected:
            status, answer = await _post(http, url, table, body, headers)
            assert status == 400, answer
            errors.append(answer["error"])
        assert "invalid JSON" in errors[0] and "line 4" in errors[0]
        assert "not valid UTF-8" in errors[1]
        assert "nests deeper" in errors[2]
        assert "add-and-widen" in errors[6] and "exponent" in errors[7]
        samples = await _scrape(http, url)
        assert _of(samples, "icespool_records_rejected_total") == {
            _labels(table=EVENTS, reason="invalid"): 3 + 1 + 1 + 4,
            _labels(table=EVENTS, reason="bad_utf8"): 2,
            _labels(table=EVENTS, reason="too_deep"): 1,
            _labels(table=STRICT, reason="schema_change"): 2,
            _labels(table=STRICT, reason="out_of_range"): 1,
        }
        # ---- the ack histogram counts exactly the 200s, per table
        assert _of(samples, "icespool_http_ack_duration_seconds_count") == {
            _labels(table=EVENTS): 4,
            _labels(table=STRICT): 1,
        }
        requests = _of(samples, "icespool_http_requests_total")
        route = "/v1/tables/{table}/records"
        assert requests[_labels(route=route, code="200")] == 5
        assert requests[_labels(route=route, code="400")] == len(rejected)
        buckets = {
            dict(labels)["le"]: value
            for labels, value in _of(samples, "icespool_http_ack_duration_seconds_bucket").items()
            if dict(labels)["table"] == EVENTS
        }
        assert buckets["+Inf"] == buckets["10.0"] == 4  # every ack within 10 s here
        bounds = "0.001 0.0025 0.005 0.01 0.015 0.02 0.03 0.05 0.1 0.25 0.5 1.0 2.5 5.0 10.0"
        assert list(buckets) == [*bounds.split(" "), "+Inf"]
        assert samples[("icespool_http_ack_duration_seconds_sum", _labels(table=EVENTS))] > 0
        assert not _of(samples, "icespool_table_last_commit_age_seconds")

        # ---- last-commit age: appears at the first commit, grows, resets at the next
        async with http.post(f"{url}/v1/tables/{EVENTS}/flush") as r:
            assert (await r.json())["records"] == 7
        first = _of(await _scrape(http, url), "icespool_table_last_commit_age_seconds")
        assert list(first) == [_labels(table=EVENTS)]  # demo.strict has not committed
        await asyncio.sleep(1.2)
        later = await _scrape(http, url)
        grown = _of(later, "icespool_table_last_commit_age_seconds")[_labels(table=EVENTS)]
        assert grown >= first[_labels(table=EVENTS)] + 1.2
        stamp = later[("icespool_last_commit_timestamp_seconds", _labels(table=EVENTS))]
        assert stamp > 1.7e9  # the wall-clock gauge stays beside the age
        assert await _post(http, url, EVENTS, b'{"event_id": 8}\n', NDJSON) == (
            200,
            {"accepted": 1},
        )
        async with http.post(f"{url}/v1/tables/{EVENTS}/flush") as r:
            assert (await r.json())["records"] == 1
        reset = _of(await _scrape(http, url), "icespool_table_last_commit_age_seconds")
        assert reset[_labels(table=EVENTS)] < 1.0 < grown
        final = await _scrape(http, url)
    assert _of(final, "icespool_http_ack_duration_seconds_count")[_labels(table=EVENTS)] == 5
    assert _of(final, "icespool_records_committed_total") == {
        _labels(table=EVENTS): 8,
        _labels(table=STRICT): 0,
    }


async def test_unknown_tables_and_refusals_other_than_400_count_no_rejected_records(
    run_daemon: RunDaemon, config: Any
) -> None:
    """Rejected records are 400s of configured tables only: a made-up table name must
    not create a series (unbounded labels), and 404/415/413 are requests, not records."""
    async with (
        run_daemon(config, max_body_bytes=64) as (_, url),
        aiohttp.ClientSession() as http,
    ):
        assert (await _post(http, url, "no.such", b'{"a": 1}\n', NDJSON))[0] == 404
        assert (await _post(http, url, EVENTS, b"x", {"Content-Type": "text/csv"}))[0] == 415
        big = b'{"event_id": 1}\n' * 10
        assert (await _post(http, url, EVENTS, big, NDJSON))[0] == 413
        samples = await _scrape(http, url)
    assert not _of(samples, "icespool_records_rejected_total")
    assert not _of(samples, "icespool_http_ack_duration_seconds_count")
    requests = _of(samples, "icespool_http_requests_total")
    assert {dict(k)["code"]: v for k, v in requests.items() if "records" in dict(k)["route"]} == {
        "404": 1,
        "415": 1,
        "413": 1,
    }
