"""The ``[catalog]`` keys of a Glue catalog and of Azure storage (ADLS / Blob), as pyiceberg
0.12 reads them.

A self-contained table for the per-type validation of ``[catalog]`` keys: ``CATALOG_TYPE_KEYS``
holds what one catalog type takes besides ``name``, ``type``, ``uri`` and ``warehouse``;
``STORAGE_KEYS`` holds FileIO keys that every catalog type takes (any catalog can keep its
tables on Azure). The names are pyiceberg's own constants (``pyiceberg.catalog.glue``,
``pyiceberg.io``); a test checks them against the installed pyiceberg, so a key pyiceberg
renames shows up as a failing test rather than as a setting silently ignored.

``pyiceberg_value`` turns a string from the config file into the type pyiceberg needs where
it does not convert itself (``glue.max-retries`` goes to botocore as is, and botocore
compares it with an int).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADLS_KEYS",
    "AWS_CLIENT_KEYS",
    "CATALOG_TYPE_KEYS",
    "GLUE_KEYS",
    "GLUE_RETRY_MODES",
    "STORAGE_KEYS",
    "KeySet",
    "catalog_key_allowed",
    "pyiceberg_value",
]


@dataclass(frozen=True)
class KeySet:
    """Exact key names, and prefixes under which any key is taken (per-account forms)."""

    keys: frozenset[str]
    prefixes: tuple[str, ...] = ()

    def allows(self, key: str) -> bool:
        return key in self.keys or key.startswith(self.prefixes)


# The AWS client keys every AWS client of pyiceberg falls back to (pyiceberg.io AWS_*).
AWS_CLIENT_KEYS = KeySet(
    frozenset(
        {
            "client.profile-name",
            "client.region",
            "client.access-key-id",
            "client.secret-access-key",
            "client.session-token",
            "client.role-arn",
            "client.role-session-name",
        }
    )
)

# pyiceberg.catalog.glue: GLUE_* (the glue.* keys win over the client.* ones).
GLUE_KEYS = KeySet(
    frozenset(
        {
            "glue.id",
            "glue.skip-archive",
            "glue.endpoint",
            "glue.profile-name",
            "glue.region",
            "glue.access-key-id",
            "glue.secret-access-key",
            "glue.session-token",
            "glue.max-retries",
            "glue.retry-mode",
        }
    )
    | AWS_CLIENT_KEYS.keys
)
GLUE_RETRY_MODES = ("legacy", "standard", "adaptive")

# pyiceberg.io: ADLS_* (FsspecFileIO through adlfs, and PyArrowFileIO's AzureFileSystem).
# ``adls.sas-token.<account>.<host>`` is the per-account SAS token a REST catalog vends.
ADLS_KEYS = KeySet(
    frozenset(
        {
            "adls.connection-string",
            "adls.credential",
            "adls.account-name",
            "adls.account-key",
            "adls.sas-token",
            "adls.tenant-id",
            "adls.client-id",
            "adls.client-secret",
            "adls.account-host",
            "adls.blob-storage-authority",
            "adls.dfs-storage-authority",
            "adls.blob-storage-scheme",
            "adls.dfs-storage-scheme",
            "adls.token",
            "adls.anon",
        }
    ),
    prefixes=("adls.sas-token.",),
)

#: Keys one catalog type takes besides name, type, uri and warehouse.
CATALOG_TYPE_KEYS: dict[str, KeySet] = {"glue": GLUE_KEYS}
#: FileIO keys every catalog type takes, by store.
STORAGE_KEYS: dict[str, KeySet] = {"adls": ADLS_KEYS}

_INTEGER_KEYS = frozenset({"glue.max-retries"})
_CHOICES = {"glue.retry-mode": GLUE_RETRY_MODES}


def catalog_key_allowed(catalog_type: str, key: str) -> bool:
    """Whether this table knows ``key`` for ``catalog_type`` (its own keys or storage keys)."""
    own = CATALOG_TYPE_KEYS.get(catalog_type.lower())
    if own is not None and own.allows(key):
        return True
    return any(keys.allows(key) for keys in STORAGE_KEYS.values())


def pyiceberg_value(key: str, value: str) -> str | int:
    """``value`` as pyiceberg needs it; ValueError saying what is expected if it is not one."""
    if key in _INTEGER_KEYS:
        text = value.strip()
        if not text.isdigit():
            raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
        return int(text)
    choices = _CHOICES.get(key)
    if choices is not None and value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value
