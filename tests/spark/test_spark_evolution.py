"""Spark changes a table's schema while the daemon writes it: the daemon picks the
change up at its next commit, without a restart (issue #7)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

TABLE = "n.evolving"
NDJSON = {"Content-Type": "application/x-ndjson"}


async def _post(session: aiohttp.ClientSession, url: str, records: list[dict[str, Any]]) -> None:
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    async with session.post(f"{url}/v1/tables/{TABLE}/records", data=body, headers=NDJSON) as r:
        assert r.status == 200, await r.text()


async def test_spark_rename_add_and_drop_apply_while_the_daemon_runs(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {
                "name": TABLE,
                "create": True,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "city", "type": "string"},
                    {"name": "legacy", "type": "string"},
                ],
            }
        ],
    )
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as session:
        await _post(session, url, [{"id": 1, "city": "Oslo", "legacy": "x"}])
        await service.flush(TABLE)
        name = register(config)
        # Spooled under the old schema, committed after Spark's change.
        await _post(session, url, [{"id": 2, "city": "Bergen", "legacy": "y"}])
        spark.sql(f"ALTER TABLE {name}.{TABLE} RENAME COLUMN city TO town")
        spark.sql(f"ALTER TABLE {name}.{TABLE} ADD COLUMN zip int")
        spark.sql(f"ALTER TABLE {name}.{TABLE} DROP COLUMN legacy")
        assert (await service.flush(TABLE)).records == 1
        writer = service.writer(TABLE)
        assert writer.arrow_schema.names == ["id", "town", "zip"]
        # New records use the new names at once; the old name is now refused.
        await _post(session, url, [{"id": 3, "town": "Tromsø", "zip": 9008}])
        body = json.dumps({"id": 4, "city": "Old"}).encode() + b"\n"
        async with session.post(f"{url}/v1/tables/{TABLE}/records", data=body, headers=NDJSON) as r:
            assert r.status == 400 and "'city'" in (await r.json())["error"]
        assert (await service.flush(TABLE)).records == 1
    rows = spark.table(f"{name}.{TABLE}").orderBy("id").collect()
    assert [r.asDict() for r in rows] == [
        {"id": 1, "town": "Oslo", "zip": None},
        {"id": 2, "town": "Bergen", "zip": None},
        {"id": 3, "town": "Tromsø", "zip": 9008},
    ]
