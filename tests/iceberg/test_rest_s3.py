"""The daemon on an Iceberg REST catalog with its data on S3, as users run it.

Everything is real: SeaweedFS's S3 API and REST catalog (tests/support/object_store.py),
and Apache Iceberg's reference REST server on that S3 (tests/support/iceberg_rest.py):
every test runs on both (the ``rest_catalog`` fixture),
pyiceberg's RestCatalog and pyarrow's S3 client in the daemon, and an HTTP proxy
(tests/support/http_proxy.py) that loses a commit's answer after the catalog applied it,
takes the object store down, stalls it, or resets an upload halfway. Every test reads the
table back and checks every acked id is there exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from support.fixture_types import MakeConfig, RestCatalogServer, RunDaemon
from support.http_proxy import HttpProxy, Seen

from icespool.config import load_config
from icespool.errors import CatalogError
from icespool.iceberg import check_catalog
from icespool.iceberg._rest import is_commit_request

TABLE = "t.events"
TABLES = [
    {
        "name": TABLE,
        "create": True,
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "v", "type": "string"},
        ],
    }
]
NDJSON = {"Content-Type": "application/x-ndjson"}


def _commit(request: Seen) -> bool:
    return is_commit_request(request.method, f"http://x{request.path}")


def _body(ids: range) -> bytes:
    return "".join(json.dumps({"id": i, "v": f"v{i}"}) + "\n" for i in ids).encode()


def _read(props: dict[str, str]) -> tuple[list[dict[str, Any]], Any]:
    catalog = load_catalog("check", **props)
    try:
        table = catalog.load_table(TABLE)
        return table.scan().to_arrow().to_pylist(), table
    finally:
        catalog._session.close()


def _exactly_once(rows: list[dict[str, Any]], ids: set[int]) -> None:
    counts = Counter(r["id"] for r in rows)
    twice = sorted(i for i, c in counts.items() if c > 1)
    assert not twice, f"{len(twice)} ids committed twice, e.g. {twice[:10]}"
    missing = sorted(ids - counts.keys())
    assert not missing, f"{len(missing)} acked ids missing, e.g. {missing[:10]}"
    assert counts.keys() == ids
    assert all(r["v"] == f"v{r['id']}" for r in rows)


def _metric(text: str, name: str, **labels: str) -> float:
    if not labels:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def _post(http: aiohttp.ClientSession, base: str, ids: range) -> None:
    async with http.post(f"{base}/v1/tables/{TABLE}/records", data=_body(ids), headers=NDJSON) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["accepted"] == len(ids)


async def _flush(http: aiohttp.ClientSession, base: str) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{base}/v1/tables/{TABLE}/flush") as r:
        return r.status, json.loads(await r.text())


# ---------------------------------------------------------------------- round trip


async def test_ingest_commits_to_the_rest_catalog_on_s3_with_idempotency_keys(
    rest_catalog: RestCatalogServer, make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    warehouse = rest_catalog.warehouse()
    direct = rest_catalog.catalog_properties(warehouse)
    with (
        HttpProxy(("127.0.0.1", rest_catalog.rest_port)) as rest,
        HttpProxy(("127.0.0.1", rest_catalog.s3_port)) as s3,
    ):
        props = rest_catalog.catalog_properties(warehouse, rest_uri=rest.url, s3_endpoint=s3.url)
        config = make_config(catalog={"name": "lake", **props}, tables=TABLES)
        async with run_daemon(config) as (_, base), aiohttp.ClientSession() as http:
            for batch in (range(500), range(500, 1200)):
                await _post(http, base, batch)
                status, result = await _flush(http, base)
                assert (status, result["records"]) == (200, len(batch)), result
        commits = rest.seen(_commit)
        uploads = s3.seen(lambda s: s.upload_part and "/data/" in s.path)

    rows, table = _read(direct)
    _exactly_once(rows, set(range(1200)))
    assert table.location().startswith(f"{warehouse}/")
    # One commit per flush, each with its own UUIDv7 Idempotency-Key.
    keys = [c.headers.get("idempotency-key") for c in commits]
    assert len(commits) == 2 and all(c.status == 200 for c in commits), commits
    assert len({k for k in keys if k}) == 2
    assert all(uuid.UUID(k).version == 7 for k in keys if k)
    # The catalog never saw a key on anything but a commit.
    assert not [s for s in rest.seen() if not _commit(s) and "idempotency-key" in s.headers]
    # pyarrow writes every data file as a multipart upload (small files: one part).
    data_files = {f["file_path"].split("/", 3)[3] for f in table.inspect.data_files().to_pylist()}
    assert {u.path.split("/", 2)[2] for u in uploads} == data_files


# ---------------------------------------------------------------------- unknown outcomes


@pytest.mark.parametrize("fault", ["forward_then_502", "forward_then_drop"])
async def test_a_commit_whose_answer_is_lost_lands_exactly_once(
    fault: Any,
    rest_catalog: RestCatalogServer,
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The catalog applies the commit, the client gets a 502 or a closed connection: the
    committer reads the table back, finds its segments and does not commit again."""
    warehouse = rest_catalog.warehouse()
    direct = rest_catalog.catalog_properties(warehouse)
    caplog.set_level(logging.INFO, logger="icespool")
    with HttpProxy(("127.0.0.1", rest_catalog.rest_port)) as rest:
        props = rest_catalog.catalog_properties(warehouse, rest_uri=rest.url)
        config = make_config(catalog={"name": "lake", **props}, tables=TABLES)
        async with run_daemon(config) as (_, base), aiohttp.ClientSession() as http:
            await _post(http, base, range(1000))
            rest.fail(_commit, fault)
            status, result = await _flush(http, base)
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
        commits = rest.seen(_commit)

    assert status == 200 and result["records"] == 1000, result
    assert rest.pending_faults() == 0
    # Exactly one commit request: the lost one, which the catalog applied.
    assert [(c.fault, c.status) for c in commits] == [
        (fault, 502 if fault == "forward_then_502" else None)
    ]
    rows, table = _read(direct)
    _exactly_once(rows, set(range(1000)))
    appends = [s for s in table.metadata.snapshots if "icespool.segments" in (s.summary or {})]
    assert len(appends) == 1 and appends[0].snapshot_id == result["snapshot_id"]
    assert _metric(metrics, "icespool_commit_unknown_outcomes_total", table=TABLE) == 1
    text = caplog.text
    assert "commit outcome unknown" in text
    assert "did land" in text and "not committing again" in text


async def test_a_commit_answered_with_a_gateways_html_page_is_an_unknown_outcome(
    rest_catalog: RestCatalogServer, make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    """A gateway in front of the catalog (an SSO proxy redirecting to its login page)
    answers 200 with HTML: pyiceberg's parse of it fails with a pydantic ValidationError,
    a ValueError, which read as "the table rejected the data" and quarantined the
    segment after three flushes. The catalog may or may not have applied the commit: an
    unknown outcome, resolved by reading the table back like a 502."""
    warehouse = rest_catalog.warehouse()
    with HttpProxy(("127.0.0.1", rest_catalog.rest_port)) as rest:
        props = rest_catalog.catalog_properties(warehouse, rest_uri=rest.url)
        config = make_config(catalog={"name": "lake", **props}, tables=TABLES)
        async with run_daemon(config) as (_, base), aiohttp.ClientSession() as http:
            await _post(http, base, range(100))
            rest.fail(_commit, "200_html", times=3)
            status, answer = await _flush(http, base)
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
    assert (status, answer["records"], answer["quarantined"]) == (200, 100, []), answer
    assert rest.pending_faults() == 0
    assert [s.status for s in rest.seen(_commit)] == [200, 200, 200, 200]
    assert _metric(metrics, "icespool_commit_unknown_outcomes_total", table=TABLE) == 3
    assert _metric(metrics, "icespool_quarantined_segments_total") == 0
    rows, _ = _read(rest_catalog.catalog_properties(warehouse))
    _exactly_once(rows, set(range(100)))


# ---------------------------------------------------------------------- object-store faults


def _data_upload(request: Seen) -> bool:
    return request.method == "PUT" and "/data/" in request.path


async def test_object_store_outage_stall_and_reset_lose_and_duplicate_nothing(
    rest_catalog: RestCatalogServer,
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While S3 is down or stalled the daemon keeps acking into the spool; flushes fail
    naming the object store (never quarantining a segment) and succeed once it is back.
    An upload reset halfway is retried by the S3 client. Every acked id lands once."""
    warehouse = rest_catalog.warehouse()
    direct = rest_catalog.catalog_properties(warehouse)
    caplog.set_level(logging.INFO, logger="icespool")
    with HttpProxy(("127.0.0.1", rest_catalog.s3_port)) as s3:
        props = rest_catalog.catalog_properties(warehouse, s3_endpoint=s3.url)
        config = make_config(
            catalog={"name": "lake", **props},
            tables=TABLES,
            timeouts={"storage_connect": "1s", "storage_request": "1s", "storage_attempts": 2},
        )
        async with run_daemon(config) as (_, base), aiohttp.ClientSession() as http:
            await _post(http, base, range(100))  # the table exists, its first commit done
            assert (await _flush(http, base))[0] == 200
            next_id = 100
            outcomes: list[str] = []

            async def during(mode: Any) -> None:
                nonlocal next_id
                s3.mode = mode
                for _ in range(3):  # acks go on: they only need the spool
                    await _post(http, base, range(next_id, next_id + 200))
                    next_id += 200
                async with http.get(f"{base}/metrics") as r:
                    assert _metric(await r.text(), "icespool_spool_bytes") > 0
                status, answer = await _flush(http, base)
                outcomes.append(f"{mode}: {status} {answer.get('error', '')[:200]}")
                assert status == 503, answer
                assert "object store" in json.dumps(answer), answer
                s3.mode = "forward"
                status, answer = await _flush(http, base)
                assert (status, answer["records"]) == (200, 600), answer

            await during("down")
            await during("stall")
            # Half of a data file's upload arrives, then the connection is reset: the
            # S3 client's retry (timeouts.storage_attempts = 2) sends it again.
            s3.fail(_data_upload, "reset_mid_body")
            await _post(http, base, range(next_id, next_id + 500))
            next_id += 500
            status, answer = await _flush(http, base)
            assert (status, answer["records"]) == (200, 500), answer
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
            assert _metric(metrics, "icespool_spool_segments") == 0

    resets = [s for s in s3.seen() if s.fault == "reset_mid_body"]
    assert len(resets) == 1 and s3.pending_faults() == 0
    assert _metric(metrics, "icespool_flush_errors_total", table=TABLE, cause="object_store") == 2
    assert _metric(metrics, "icespool_quarantined_segments_total") == 0
    assert "quarantined" not in caplog.text
    rows, _ = _read(direct)
    _exactly_once(rows, set(range(next_id)))
    print("\n".join(outcomes))


# ---------------------------------------------------------------------- check-config --connect


def test_check_config_connect_proves_catalog_and_storage_access(
    rest_catalog: RestCatalogServer, tmp_path: Path
) -> None:
    """Secrets from a file and from an ICESPOOL__ variable, never printed; the probe object
    goes through the table's FileIO; a wrong key names the step that failed."""
    warehouse = rest_catalog.warehouse()
    props = rest_catalog.catalog_properties(warehouse)
    credential = props.pop("credential")
    secret = props.pop("s3.secret-access-key")
    (tmp_path / "credential").write_text(credential + "\n")
    catalog = "\n".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in props.items())
    path = tmp_path / "icespool.toml"
    path.write_text(
        f'[catalog]\nname = "lake"\n{catalog}\n'
        f"credential-file = {json.dumps(str(tmp_path / 'credential'))}\n"
        f"[spool]\ndir = {json.dumps(str(tmp_path / 'spool'))}\n"
        '[[tables]]\nname = "t.events"\ncreate = true\n'
        'schema = [{ name = "id", type = "long", required = true }]\n'
    )
    env = {"ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY": secret}

    assert check_catalog(load_config(path, env=env))[1:] == [
        "table t.events: missing, created at start (create = true)",
        "storage: not probed (no configured table exists yet, and the catalog decides where "
        "its data files go); run --connect again once a table exists",
    ]

    # Once the table exists, the probe goes where its data files go, through its FileIO.
    setup = load_catalog("setup", **rest_catalog.catalog_properties(warehouse))
    setup.create_namespace("t")
    created = setup.create_table("t.events", Schema(NestedField(1, "id", LongType(), True)))
    setup._session.close()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ICESPOOL", "AWS_"))}
    cli = subprocess.run(
        [sys.executable, "-m", "icespool", "check-config", "--connect", "--config", str(path)],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stderr.splitlines()[-1] == (
        f"storage (table events): wrote, listed and deleted a probe object under "
        f"{created.location()}/data"
    )
    shown = tomllib.loads(cli.stdout)["catalog"]
    assert shown["credential-file"] == str(tmp_path / "credential")
    assert shown["s3.secret-access-key"] == "***"

    wrong = load_config(path, env={"ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY": "not-the-key"})
    with pytest.raises(CatalogError) as failed:
        check_catalog(wrong)
    assert str(failed.value).startswith(
        f"cannot write the probe object {created.location()}/data/icespool-probe-"
    ), failed.value
    assert "AWS Error" in str(failed.value), str(failed.value)
    for text in (cli.stdout + cli.stderr, str(failed.value)):
        for value in (secret, credential, credential.split(":")[1], "not-the-key"):
            assert value not in text
