"""The Glue and Azure key table (daemon/config/_catalog_keys.py) is pyiceberg's own: every
``glue.*`` and ``adls.*`` property pyiceberg 0.12 defines is in it, and nothing else."""

from __future__ import annotations

import pyiceberg.catalog.glue as glue_module
import pyiceberg.io as io_module
import pytest

from icespool.config import CATALOG_TYPES, STORAGE_KEYS, canonical_catalog_keys, pyiceberg_value


def _constants(module: object, prefix: str) -> set[str]:
    return {
        value
        for name, value in vars(module).items()
        if name.isupper()
        and isinstance(value, str)
        and value.startswith(prefix)
        # Defaults and endpoint paths are not property names.
        and not name.endswith("_DEFAULT")
    }


def test_glue_keys_are_exactly_pyicebergs() -> None:
    glue = CATALOG_TYPES["glue"]
    assert {k for k in glue.exact if k.startswith("glue.")} == _constants(glue_module, "glue.")
    assert {k for k in glue.exact if k.startswith("client.")} == _constants(io_module, "client.")


def test_adls_keys_are_exactly_pyicebergs() -> None:
    assert set(STORAGE_KEYS["adls"]) == _constants(io_module, "adls.")


@pytest.mark.parametrize(
    ("catalog_type", "key", "allowed"),
    [
        ("glue", "glue.region", True),
        ("GLUE", "glue.max-retries", True),
        ("glue", "glue.regoin", False),
        ("rest", "glue.region", False),
        ("sql", "adls.account-key", True),
        ("rest", "adls.sas-token.account.dfs.core.windows.net", True),
        ("glue", "adls.acount-key", False),
    ],
)
def test_a_key_is_allowed_per_catalog_type(catalog_type: str, key: str, allowed: bool) -> None:
    _, problems = canonical_catalog_keys(catalog_type, [key])
    assert (not problems) is allowed


def test_pyiceberg_value_converts_only_what_pyiceberg_leaves_as_text() -> None:
    assert pyiceberg_value("glue.max-retries", " 3 ") == 3
    assert pyiceberg_value("glue.retry-mode", "adaptive") == "adaptive"
    assert pyiceberg_value("adls.account-name", "0042") == "0042"
    with pytest.raises(ValueError, match="whole number"):
        pyiceberg_value("glue.max-retries", "-1")
