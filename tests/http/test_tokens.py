"""Named Bearer tokens with scopes, over real sockets: which token may ingest where, who
may flush and read status, the legacy ``auth_token_file`` as one admin token, token
rotation by reload, config errors naming the key, and values never shown."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.fixture_types import MakeConfig

from icespool.cli import main
from icespool.config import Config, validate_config
from icespool.errors import ConfigError
from icespool.http import HttpServer, load_tokens, start_http
from icespool.lifecycle.reload import plan_reload
from icespool.lifecycle.service import Icespool

NDJSON = "application/x-ndjson"
SECRETS = {"admin": "tok-admin-1", "producer": "tok-producer-2", "ops": "tok-ops-3"}


def _table(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "create": True,
        "schema": [{"name": "id", "type": "long", "required": True}],
    }


@pytest.fixture
def config(tmp_path: Path, make_config: MakeConfig) -> Config:
    for name, secret in SECRETS.items():
        (tmp_path / f"{name}.token").write_text(secret + "\n")
    return make_config(
        tables=[
            _table("shop.orders"),
            _table("shop.carts"),
            _table("demo.events"),
            _table("hr.pay"),
        ],
        http={
            "auth_token_file": str(tmp_path / "admin.token"),
            "tokens": [
                {
                    "name": "producer-a",
                    "token_file": str(tmp_path / "producer.token"),
                    "tables": ["shop.*", "demo.events"],
                },
                {"name": "ops", "token_file": str(tmp_path / "ops.token"), "admin": True},
            ],
        },
    )


@pytest.fixture
async def served(config: Config) -> AsyncIterator[tuple[Icespool, HttpServer, str]]:
    service = Icespool(config)
    await service.start()
    try:
        http = await start_http(
            service,
            "127.0.0.1",
            0,
            max_body_bytes=config.http.max_body_bytes,
            tokens=load_tokens(config.http),
        )
        try:
            yield service, http, f"http://127.0.0.1:{http.port}"
        finally:
            await http.stop()
    finally:
        await service.stop()


async def _call(
    method: str, url: str, token: str | None, body: bytes | None = None
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Content-Type": NDJSON}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, data=body, headers=headers) as reply,
    ):
        return reply.status, await reply.json(), dict(reply.headers)


async def _ingest(base: str, table: str, token: str | None) -> tuple[int, Any]:
    status, body, _ = await _call("POST", f"{base}/v1/tables/{table}/records", token, b'{"id":1}')
    return status, body


PRODUCER = SECRETS["producer"]
NOT_THERE = (
    "token 'producer-a' may not write to table '{}'; it may write to shop.*, demo.events "
    "(http.tokens tables)"
)


@pytest.mark.parametrize(
    ("table", "token", "status", "reply"),
    [
        ("shop.orders", PRODUCER, 200, {"accepted": 1}),  # glob
        ("shop.carts", PRODUCER, 200, {"accepted": 1}),  # same glob, another table
        ("demo.events", PRODUCER, 200, {"accepted": 1}),  # exact name
        ("hr.pay", PRODUCER, 403, {"error": NOT_THERE.format("hr.pay")}),
        # Outside its scope an unknown table is 403 too: a token learns nothing of others.
        ("hr.nope", PRODUCER, 403, {"error": NOT_THERE.format("hr.nope")}),
        # Inside its scope, the usual 404.
        ("shop.nope", PRODUCER, 404, None),
        ("hr.pay", SECRETS["ops"], 200, {"accepted": 1}),  # a named admin: every table
        ("hr.pay", SECRETS["admin"], 200, {"accepted": 1}),  # auth_token_file: admin
        ("shop.orders", None, 401, {"error": "missing 'Authorization: Bearer <token>' header"}),
        ("shop.orders", "tok-producer", 401, {"error": "wrong bearer token"}),  # a prefix
        ("shop.orders", PRODUCER + "x", 401, {"error": "wrong bearer token"}),
    ],
)
async def test_ingest_scope(
    served: tuple[Icespool, HttpServer, str],
    table: str,
    token: str | None,
    status: int,
    reply: Any,
) -> None:
    service, _, base = served
    got_status, got = await _ingest(base, table, token)
    assert got_status == status, got
    if reply is not None:
        assert got == reply
    else:
        assert "is not configured on this daemon" in got["error"]
    pending = {name: service.writer(name).pending_records for name in service.table_names}
    expected = dict.fromkeys(service.table_names, 0)
    if status == 200:
        expected[table] = 1
    assert pending == expected


@pytest.mark.parametrize(
    ("token", "status"),
    [(PRODUCER, 403), (SECRETS["ops"], 200), (SECRETS["admin"], 200), (None, 401)],
)
async def test_flush_and_status_need_an_admin_token(
    served: tuple[Icespool, HttpServer, str], token: str | None, status: int
) -> None:
    _, _, base = served
    flush = await _call("POST", f"{base}/v1/tables/shop.orders/flush", token)
    state = await _call("GET", f"{base}/v1/status", token)
    assert (flush[0], state[0]) == (status, status)
    if status == 403:
        assert flush[1] == {
            "error": "token 'producer-a' is not an admin token; flush needs one (admin = true "
            "in [[http.tokens]], or http.auth_token_file)"
        }
        assert state[1] == {
            "error": "token 'producer-a' is not an admin token; GET /v1/status needs one "
            "(admin = true in [[http.tokens]], or http.auth_token_file)"
        }
    if status == 401:
        assert flush[2]["WWW-Authenticate"] == 'Bearer realm="icespool"'


async def test_probes_metrics_and_the_openapi_document_need_no_token(
    served: tuple[Icespool, HttpServer, str],
) -> None:
    _, _, base = served
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json"):
            async with session.get(f"{base}{path}") as reply:
                assert reply.status == 200, path


async def test_a_reload_rotates_tokens_and_never_logs_them(
    served: tuple[Icespool, HttpServer, str],
    config: Config,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, http, base = served
    caplog.set_level(logging.DEBUG)
    (tmp_path / "producer.token").write_text("tok-producer-NEW\n")
    assert await http.reload(config.http) == ["tokens auth_token_file, producer-a, ops"]
    assert (await _ingest(base, "shop.orders", PRODUCER))[0] == 401
    assert (await _ingest(base, "shop.orders", "tok-producer-NEW"))[0] == 200
    # A reload that cannot read a file changes nothing.
    (tmp_path / "ops.token").write_text("   \n")
    with pytest.raises(ConfigError) as caught:
        await http.reload(config.http)
    assert caught.value.key == "http.tokens[1].token_file"
    assert (await _ingest(base, "shop.orders", "tok-producer-NEW"))[0] == 200
    assert (await _call("GET", f"{base}/v1/status", SECRETS["ops"]))[0] == 200
    for secret in [*SECRETS.values(), "tok-producer-NEW"]:
        assert secret not in caplog.text
        assert secret not in repr(load_tokens(config.http.model_copy(update={"tokens": []})))


def _raw(tmp_path: Path, tokens: list[dict[str, Any]]) -> dict[str, Any]:
    return {"http": {"tokens": tokens}}


@pytest.mark.parametrize(
    ("tokens", "key", "fragment"),
    [
        ([{"name": "a", "token_file": "/x"}], "http.tokens[0].tables", "may do nothing"),
        ([{"name": "a", "token_file": "/x", "tables": ["orders"]}], "http.tokens[0].tables[0]",
         "must match 'namespace.table' names"),
        ([{"name": "a b", "token_file": "/x", "admin": True}], "http.tokens[0].name",
         "letters, digits"),
        ([{"name": "a", "token_file": "/x", "admin": True},
          {"name": "a", "token_file": "/y", "admin": True}], "http.tokens[1].name",
         "already used by http.tokens[0]"),
        ([{"name": "a", "admin": True}], "http.tokens[0].token_file", "missing"),
        ([{"name": "a", "token_file": "/x", "admin": True, "token": "inline"}],
         "http.tokens[0].token", "unknown key"),
    ],
)  # fmt: skip
def test_token_config_errors_name_the_key(
    tmp_path: Path, tokens: list[dict[str, Any]], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(_raw(tmp_path, tokens))
    assert caught.value.key == key
    assert fragment in caught.value.problem


def test_token_files_are_read_with_errors_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("dup-secret")
    (tmp_path / "b").write_text("dup-secret\n")
    (tmp_path / "empty").write_text("\n")

    def load(*files: str) -> list[str]:
        raw = [
            {"name": f"t{i}", "token_file": str(tmp_path / f), "admin": True}
            for i, f in enumerate(files)
        ]
        return [t.name for t in load_tokens(validate_config(_raw(tmp_path, raw)).http)]

    assert load("a") == ["t0"]
    cases = [
        (("a", "b"), "http.tokens[1].token_file", "holds the same token as http.tokens[0]"),
        (("empty",), "http.tokens[0].token_file", "is empty"),
        (("missing",), "http.tokens[0].token_file", "cannot read the token file"),
    ]
    for files, key, fragment in cases:
        with pytest.raises(ConfigError) as caught:
            load(*files)
        assert (caught.value.key, fragment in caught.value.problem) == (key, True)
        assert "dup-secret" not in caught.value.problem


def test_check_config_reads_the_token_files_and_shows_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p").write_text("very-secret-value")
    path = tmp_path / "c.toml"
    text = '[[http.tokens]]\nname = "producer-a"\ntoken_file = "{}"\ntables = ["shop.*"]\n'
    path.write_text(text.format(tmp_path / "p"))
    assert main(["check-config", "--config", str(path), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "very-secret-value" not in out + err
    assert json.loads(out)["http"]["tokens"] == [
        {
            "name": "producer-a",
            "token_file": str(tmp_path / "p"),
            "tables": ["shop.*"],
            "admin": False,
        }
    ]
    path.write_text(text.format(tmp_path / "gone"))
    assert main(["check-config", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "config key 'http.tokens[0].token_file': cannot read the token file" in err


def test_a_reload_plan_applies_http_secrets_and_leaves_the_rest_for_a_restart(
    config: Config, tmp_path: Path
) -> None:
    raw = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["http"]["tokens"][0]["tables"] = ["shop.*"]
    raw["http"]["listen"] = "127.0.0.1:9999"
    raw["http"]["tls_cert_file"] = str(tmp_path / "c.pem")
    raw["http"]["tls_key_file"] = str(tmp_path / "k.pem")
    plan = plan_reload(config, validate_config(raw), config.table_names)
    assert plan.applied == ("http.tokens[0].tables (re-read)",)
    # Turning TLS on needs a new listener; the listen address too.
    assert set(plan.not_applied) == {"http.listen", "http.tls_cert_file", "http.tls_key_file"}
    assert plan.config.http.tokens[0].tables == ["shop.*"]
    assert (plan.config.http.listen, plan.config.http.tls) == (config.http.listen, False)
