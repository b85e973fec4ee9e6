"""``[catalog]`` keys are checked per catalog type (daemon/config/_catalog_keys.py), and
secret keys may come from files or ICESPOOL__ variables without ever being shown."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from icespool.config import (
    apply_env_overrides,
    embedded_default,
    hide_secrets,
    load_config,
    redacted,
    render_toml,
    validate_config,
)
from icespool.errors import CatalogError, ConfigError
from icespool.iceberg import load_catalog

REST = {
    "name": "lake",
    "type": "rest",
    "uri": "https://catalog.example/api",
    "warehouse": "s3://lake",
}


def _config(catalog: dict[str, Any], tmp_path: Path) -> Any:
    raw = embedded_default(tmp_path)
    raw["catalog"] = catalog
    return validate_config(raw)


def _problems(catalog: dict[str, Any], tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        _config(catalog, tmp_path)
    return [p.line() for p in failed.value.problems]


def test_a_misspelt_key_is_named_with_the_key_it_resembles(tmp_path: Path) -> None:
    problems = _problems(
        {**REST, "wharehouse": "s3://x", "s3": {"endpiont": "http://s3"}, "token": "t"},
        tmp_path,
    )
    assert [p.split(";")[0] for p in problems] == [
        "config key 'catalog.wharehouse': unknown key for a rest catalog",
        "config key 'catalog.s3.endpiont': unknown key for a rest catalog",
    ]
    assert "did you mean 'warehouse'?" in problems[0]
    assert "did you mean 's3.endpoint'?" in problems[1]


def test_keys_are_checked_per_catalog_type(tmp_path: Path) -> None:
    sql = {"name": "lake", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db"}
    [problem] = _problems({**sql, "credential": "id:secret"}, tmp_path)
    assert problem.startswith("config key 'catalog.credential': unknown key for a sql catalog")
    [unsupported] = _problems({**REST, "type": "nessie"}, tmp_path)
    assert unsupported == (
        "config key 'catalog.type': 'nessie' is not a catalog type icespool supports; "
        "use one of glue, hive, rest, sql"
    )
    # The FileIO keys and REST headers are the rest catalog's; '_' and '-' are alike.
    config = _config(
        {
            **REST,
            "s3": {"endpoint": "http://s3", "force_virtual_addressing": False},
            "header": {"X-Iceberg-Access-Delegation": "vended-credentials"},
            "oauth2_server_uri": "https://idp/token",
        },
        tmp_path,
    )
    assert config.catalog.extra_properties == {
        "s3.endpoint": "http://s3",
        "s3.force-virtual-addressing": "false",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "oauth2-server-uri": "https://idp/token",
    }


def test_secrets_from_files_and_variables_reach_pyiceberg_and_nothing_else(
    tmp_path: Path,
) -> None:
    (tmp_path / "credential").write_text("client-id:client-secret-value\n")
    path = tmp_path / "icespool.toml"
    path.write_text(
        '[catalog]\nname = "lake"\ntype = "rest"\nuri = "https://c"\n'
        f'credential-file = "{tmp_path / "credential"}"\n'
    )
    env = {"ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY": "s3-secret-value"}
    config = load_config(path, env=env)
    assert config.catalog.properties() == {
        "type": "rest",
        "uri": "https://c",
        "credential": "client-id:client-secret-value",
        "s3.secret-access-key": "s3-secret-value",
    }
    shown = render_toml(redacted(config))
    assert "secret-value" not in shown
    assert f'credential-file = "{tmp_path / "credential"}"' in shown
    # What check-config prints reads back as the same config (the file, not its content).
    merged, _ = apply_env_overrides({"catalog": {**REST}}, env)
    assert merged["catalog"]["s3"] == {"secret_access_key": "s3-secret-value"}


@pytest.mark.parametrize(
    ("write", "problem"),
    [
        (None, "cannot read"),
        ("", "is empty; it must hold the secret"),
        ("\n", "is empty; it must hold the secret"),
    ],
)
def test_a_secret_file_that_cannot_be_used_is_named(
    write: str | None, problem: str, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    if write is not None:
        secret.write_text(write)
    [line] = _problems({**REST, "token-file": str(secret)}, tmp_path)
    assert line.startswith("config key 'catalog.token-file': ")
    assert problem in line


def _problems_in_time(catalog: dict[str, Any], tmp_path: Path) -> list[str]:
    """``_problems``, failing instead of hanging when the config load blocks."""
    found: list[list[str]] = []
    loader = threading.Thread(target=lambda: found.append(_problems(catalog, tmp_path)))
    loader.daemon = True  # a load stuck on a FIFO must not keep the test run alive
    loader.start()
    loader.join(5)
    assert found, "loading the config did not finish within 5 s"
    return found[0]


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: os.mkfifo(path), "is not a regular file"),
        (lambda path: os.symlink("/dev/null", path), "is not a regular file"),
        (lambda path: path.write_text("x" * 70_000), "is larger than 64 KiB"),
        (lambda path: path.write_text("id:Zq-first\nZq-second\n"), "control characters"),
        (lambda path: path.write_text("\tZq-value\n"), "control characters"),
    ],
    ids=["fifo", "device", "huge", "two lines", "tab"],
)
def test_a_secret_file_that_is_no_secret_is_refused_at_once(
    make: Any, problem: str, tmp_path: Path
) -> None:
    """A FIFO or a device would block the load forever (or fill the memory); a huge file
    is not a secret; a line break inside a secret reaches an HTTP header, where requests
    refuses it with an error that quotes the whole value."""
    secret = tmp_path / "credential"
    make(secret)
    try:
        [line] = _problems_in_time({**REST, "credential-file": str(secret)}, tmp_path)
    finally:
        if secret.is_fifo():  # a reader still blocked on it gets its end of file
            with contextlib.suppress(OSError):
                os.close(os.open(secret, os.O_WRONLY | os.O_NONBLOCK))
    assert line.startswith("config key 'catalog.credential-file': ")
    assert problem in line
    assert "Zq" not in line  # the content is never echoed


def test_empty_and_control_character_values_are_refused_like_an_empty_secret_file(
    tmp_path: Path,
) -> None:
    """``ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY=`` (a Secret with an empty key) used to
    reach pyiceberg as an empty secret, and the catalog failed far from the cause."""
    problems = _problems(
        {**REST, "token": "", "s3": {"secret-access-key": "abc\ndef", "region": " "}},
        tmp_path,
    )
    assert sorted(problems) == [
        "config key 'catalog.s3.region': must not be empty",
        "config key 'catalog.s3.secret-access-key': must not contain control characters",
        "config key 'catalog.token': must not be empty",
    ]
    assert not [p for p in problems if "abc" in p or "def" in p]
    # A trailing newline (a variable from a Secret made with --from-file) is dropped, as
    # from a secret file.
    path = tmp_path / "icespool.toml"
    path.write_text('[catalog]\nname = "lake"\ntype = "rest"\nuri = "https://c"\n')
    config = load_config(path, env={"ICESPOOL__CATALOG__CREDENTIAL": "id:secret\n"})
    assert config.catalog.properties()["credential"] == "id:secret"
    # A byte order mark (an editor's UTF-8 with BOM) is no part of a secret file's value.
    (tmp_path / "token").write_text("\ufefftoken-value\r\n", encoding="utf-8")
    env = {"ICESPOOL__CATALOG__TOKEN_FILE": str(tmp_path / "token")}
    assert load_config(path, env=env).catalog.properties()["token"] == "token-value"


@pytest.mark.parametrize(
    "written",
    [
        '"s3.secret-access-key" = "file-value"\n"oauth2-server-uri" = "https://file"\n',
        'oauth2-server-uri = "https://file"\n[catalog.s3]\nsecret-access-key = "file-value"\n',
    ],
    ids=["dotted keys", "nested table"],
)
# Kubernetes takes '-' in a variable name (the Helm chart's secrets do so).
@pytest.mark.parametrize("variable", ["S3__SECRET_ACCESS_KEY", "S3__SECRET-ACCESS-KEY"])
def test_a_variable_overrides_a_catalog_key_the_file_spells_with_dashes(
    written: str, variable: str, tmp_path: Path
) -> None:
    """A variable cannot spell '-': ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY is the file's
    s3.secret-access-key, and overrides it like any other key (it used to be refused as
    the same key "set twice", with a hint to use a secret file even for a URI)."""
    path = tmp_path / "icespool.toml"
    path.write_text(f'[catalog]\nname = "lake"\ntype = "rest"\nuri = "https://c"\n{written}')
    env = {
        f"ICESPOOL__CATALOG__{variable}": "env-value",
        "ICESPOOL__CATALOG__OAUTH2_SERVER_URI": "https://env",
    }
    config = load_config(path, env=env)
    assert config.catalog.properties() == {
        "type": "rest",
        "uri": "https://c",
        "s3.secret-access-key": "env-value",
        "oauth2-server-uri": "https://env",
    }


def test_a_secret_given_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "credential").write_text("a:b")
    [line] = _problems(
        {**REST, "credential": "a:b", "credential_file": str(tmp_path / "credential")}, tmp_path
    )
    assert "'credential' is already set by" in line
    # A plain key written twice (two spellings in one file) has no file form to suggest.
    [twice] = _problems({**REST, "oauth2-server-uri": "a", "oauth2_server_uri": "b"}, tmp_path)
    assert twice == (
        "config key 'catalog.oauth2_server_uri': 'oauth2-server-uri' is already set by "
        "'oauth2-server-uri' ('_' and '-' are alike); set it once"
    )
    # Only secret keys have a file form.
    [plain] = _problems({**REST, "s3.endpoint-file": str(tmp_path / "credential")}, tmp_path)
    assert plain.startswith("config key 'catalog.s3.endpoint-file': unknown key")


def test_errors_that_echo_a_secret_are_scrubbed() -> None:
    props = {
        "uri": "postgresql+psycopg2://icespool:p%40ss-word@db/lake",
        "credential": "client:client-secret",
        "s3.secret-access-key": "s3-secret",
        "s3.endpoint": "http://s3:9000",
    }
    echoed = (
        "POST https://c/v1/oauth/tokens client:client-secret refused; "
        "connect icespool:p@ss-word@db; key s3-secret; http://s3:9000"
    )
    assert hide_secrets(echoed, props) == (
        "POST https://c/v1/oauth/tokens *** refused; connect icespool:***@db; key ***; "
        "http://s3:9000"
    )


@pytest.mark.parametrize("warehouse", ["lake-warehouse", "s3://lake"])
def test_a_rest_warehouse_is_never_made_a_local_directory(
    warehouse: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A REST catalog's warehouse is the catalog's to interpret (a warehouse name for
    Polaris or Lakekeeper): the daemon made a directory of that name in its working
    directory, and failed to start where that is read-only (a container's '/')."""
    monkeypatch.chdir(tmp_path)
    with socket.socket() as closed:  # a port nothing listens on: the load fails fast
        closed.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(CatalogError) as failed:
        load_catalog("lake", {"type": "rest", "uri": uri, "warehouse": warehouse})
    assert "ConnectionError" in str(failed.value), failed.value
    assert list(tmp_path.iterdir()) == []


def test_a_glue_catalog_that_cannot_load_names_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Glue properties carry the botocore session the timeouts are set on; scrubbing
    secrets out of the load error tripped over it (TypeError: argument of type 'Session'
    is not iterable), which hid the cause and escaped the start's catalog retry."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    props = {"type": "glue", "glue.access-key-id": "AKID", "glue.secret-access-key": "Zq-secret"}
    with pytest.raises(CatalogError) as failed:
        load_catalog("lake", props)
    assert "NoRegionError" in str(failed.value), failed.value
    assert "Zq-secret" not in str(failed.value)
