"""Which ``[catalog]`` keys each catalog type takes: ONE table, checked when the config loads.

pyiceberg takes any string property and ignores the ones it does not know, so a typo
(``wharehouse``, ``s3.endpiont``) used to pass silently and fail later, far from its cause.
Every key a catalog type reads is listed here; anything else is an error naming the key.

To support another catalog type or storage, add its keys below (``CATALOG_TYPES``: one
entry per type; ``STORAGE_KEYS``: FileIO keys every type passes to its tables' FileIO).

Spelling: keys are matched with ``_`` and ``-`` treated alike (an environment variable
``ICESPOOL__CATALOG__S3__SECRET_ACCESS_KEY`` cannot spell a ``-``) and stored in the
canonical spelling below. Every secret key ``K`` (``icespool.config.is_secret_key``) may be
given as ``K-file`` instead: the path of a file holding the value (a Kubernetes Secret
mounted as a file), read when the catalog is loaded.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from icespool.config._redact import is_secret_key

__all__ = [
    "CATALOG_TYPES",
    "SECRET_FILE_SUFFIX",
    "STORAGE_KEYS",
    "CatalogKeys",
    "KeyProblem",
    "canonical_catalog_keys",
    "is_secret_file_key",
    "pyiceberg_value",
]

#: ``credential-file = "/run/secrets/catalog"`` gives ``credential`` from a file.
SECRET_FILE_SUFFIX = "-file"


@dataclass(frozen=True)
class CatalogKeys:
    """The keys one catalog type takes: exact names, and prefixes of open families
    (``header.<Name>``: an HTTP header on every REST request)."""

    exact: frozenset[str]
    prefixes: tuple[str, ...] = ()


# Read by icespool itself or by every pyiceberg catalog.
_COMMON = frozenset({"name", "type", "uri", "warehouse", "py-io-impl"})

# pyiceberg.io: the S3 FileIO (pyarrow S3FileSystem). Path-style addressing is the
# default with an endpoint; s3.force-virtual-addressing = true switches to virtual hosts.
_S3 = frozenset(
    {
        "s3.endpoint",
        "s3.region",
        "s3.resolve-region",
        "s3.access-key-id",
        "s3.secret-access-key",
        "s3.session-token",
        "s3.profile-name",
        "s3.anonymous",
        "s3.proxy-uri",
        "s3.connect-timeout",
        "s3.request-timeout",
        "s3.role-arn",
        "s3.role-session-name",
        "s3.force-virtual-addressing",
        "s3.retry-strategy-impl",
        "s3.signer",
        "s3.signer.uri",
        "s3.signer.endpoint",
        "s3.server-side-encryption",
        "s3.sse-kms-key-id",
        # Iceberg Java's (Spark's) addressing switch: pyiceberg ignores it, `icespool
        # spark-conf` passes it on as written (else derives it from the one above).
        "s3.path-style-access",
    }
)
# pyiceberg.io: AWS client settings shared by S3 and Glue.
_AWS_CLIENT = frozenset(
    {
        "client.region",
        "client.access-key-id",
        "client.secret-access-key",
        "client.session-token",
        "client.profile-name",
        "client.role-arn",
        "client.role-session-name",
    }
)
# pyiceberg.io: Azure Data Lake Storage / Blob (pyarrow AzureFileSystem, adlfs);
# ``adls.sas-token.<account>.<host>`` is the per-account SAS token a REST catalog vends.
_ADLS = frozenset(
    {
        "adls.account-name",
        "adls.account-key",
        "adls.connection-string",
        "adls.credential",
        "adls.sas-token",
        "adls.token",
        "adls.tenant-id",
        "adls.client-id",
        "adls.client-secret",
        "adls.account-host",
        "adls.anon",
        "adls.blob-storage-authority",
        "adls.dfs-storage-authority",
        "adls.blob-storage-scheme",
        "adls.dfs-storage-scheme",
    }
)
# pyiceberg.io: Google Cloud Storage. pyiceberg 0.12's pyarrow FileIO (the only one it
# uses for gs://) reads gcs.oauth2.token(-expires-at), gcs.service.host and
# gcs.default-bucket-location; the others are gcsfs's (a py-io-impl of FsspecFileIO).
_GCS = frozenset(
    {
        "gcs.project-id",
        "gcs.oauth2.token",
        "gcs.oauth2.token-expires-at",
        "gcs.access",
        "gcs.consistency",
        "gcs.cache-timeout",
        "gcs.requester-pays",
        "gcs.service.host",
        "gcs.default-bucket-location",
        "gcs.version-aware",
    }
)

#: FileIO keys, by storage: any catalog type passes them to its tables' FileIO.
STORAGE_KEYS: Mapping[str, frozenset[str]] = {
    "s3": _S3,
    "client": _AWS_CLIENT,
    "adls": _ADLS,
    "gcs": _GCS,
}
_STORAGE = frozenset(k for keys in STORAGE_KEYS.values() for k in keys)
_STORAGE_PREFIXES = ("adls.sas-token.",)

# pyiceberg.catalog.sql.SqlCatalog.
_SQL = frozenset({"echo", "pool_pre_ping", "init_catalog_tables"})

# pyiceberg.catalog.rest.RestCatalog (0.12): OAuth2 client credentials (credential =
# "client_id:client_secret") or a bearer token, the token endpoint and its parameters,
# SigV4 signing, and server-side options.
_REST = frozenset(
    {
        "credential",
        "token",
        "scope",
        "audience",
        "resource",
        "oauth2-server-uri",
        "prefix",
        "rest.sigv4-enabled",
        "rest.signing-region",
        "rest.signing-name",
        "rest.sigv4.max-retries",
        "snapshot-loading-mode",
        "scan-planning-mode",
        "rest-page-size",
        "namespace-separator",
        "view-endpoints-supported",
    }
)

# pyiceberg.catalog.hive.HiveCatalog (tests/iceberg/test_hive.py runs Hive's standalone metastore).
_HIVE = frozenset(
    {
        "ugi",
        "hive.hive2-compatible",
        "hive.kerberos-authentication",
        "hive.kerberos-service-name",
        "lock-check-min-wait-time",
        "lock-check-max-wait-time",
        "lock-check-retries",
    }
)

# pyiceberg.catalog.glue: GLUE_* (the glue.* keys win over the client.* ones).
_GLUE = frozenset(
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

#: The catalog types icespool supports and the keys each takes.
CATALOG_TYPES: Mapping[str, CatalogKeys] = {
    "sql": CatalogKeys(_COMMON | _STORAGE | _SQL, _STORAGE_PREFIXES),
    # header.X-Iceberg-Access-Delegation = "vended-credentials" (pyiceberg's default) asks
    # the catalog for table-scoped storage credentials where it offers them.
    "rest": CatalogKeys(_COMMON | _STORAGE | _REST, ("header.", *_STORAGE_PREFIXES)),
    "hive": CatalogKeys(_COMMON | _STORAGE | _HIVE, _STORAGE_PREFIXES),
    "glue": CatalogKeys(_COMMON | _STORAGE | _GLUE, _STORAGE_PREFIXES),
}

# Values pyiceberg hands on as text where its client needs another type
# (``glue.max-retries`` goes to botocore as is, and botocore compares it with an int).
_INTEGER_KEYS = frozenset({"glue.max-retries"})
_CHOICES = {"glue.retry-mode": ("legacy", "standard", "adaptive")}


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


@dataclass(frozen=True)
class KeyProblem:
    key: str  # as written (the dotted key under [catalog])
    problem: str


def _fold(key: str) -> str:
    return key.replace("_", "-")


def is_secret_file_key(key: str) -> bool:
    """Whether ``key`` (canonical) names the file of a secret key (``credential-file``)."""
    return key.endswith(SECRET_FILE_SUFFIX) and is_secret_key(key.removesuffix(SECRET_FILE_SUFFIX))


def _lookup(keys: CatalogKeys, key: str) -> str | None:
    """The canonical spelling of ``key`` (without a secret-file suffix), or None."""
    if key in keys.exact:
        return key
    folded = _fold(key)
    for known in keys.exact:
        if _fold(known) == folded:
            return known
    for prefix in keys.prefixes:
        if folded.startswith(_fold(prefix)) and len(key) > len(prefix):
            # HTTP header names: '-' is the only separator a proxy keeps.
            return prefix + _fold(key[len(prefix) :])
    return None


def canonical_catalog_keys(
    catalog_type: str, keys: Iterable[str]
) -> tuple[dict[str, str], list[KeyProblem]]:
    """Map each of ``keys`` to its canonical spelling for ``catalog_type``.

    Returns (written key -> canonical key, problems). A problem names an unknown key (with
    the closest known one), a secret given both directly and as a file, or an unknown
    catalog type.
    """
    spec = CATALOG_TYPES.get(catalog_type.lower())
    if spec is None:
        known = ", ".join(sorted(CATALOG_TYPES))
        return {}, [
            KeyProblem(
                "type",
                f"{catalog_type!r} is not a catalog type icespool supports; use one of {known}",
            )
        ]
    mapping: dict[str, str] = {}
    problems: list[KeyProblem] = []
    for key in keys:
        canonical = _lookup(spec, key)
        if canonical is None and _fold(key).endswith(SECRET_FILE_SUFFIX):
            base = _lookup(spec, key[: -len(SECRET_FILE_SUFFIX)])
            if base is not None and is_secret_key(base):
                canonical = base + SECRET_FILE_SUFFIX
        if canonical is None:
            problems.append(KeyProblem(key, _unknown(catalog_type, key, spec)))
            continue
        mapping[key] = canonical
    seen: dict[str, str] = {}
    for key, canonical in mapping.items():
        plain = canonical.removesuffix(SECRET_FILE_SUFFIX)
        if plain in seen and seen[plain] != key:
            if is_secret_key(plain):
                fix = f"; set the value or '{plain}{SECRET_FILE_SUFFIX}' (a file holding it), once"
            else:
                fix = "('_' and '-' are alike); set it once"
            problems.append(KeyProblem(key, f"{plain!r} is already set by {seen[plain]!r} {fix}"))
        seen.setdefault(plain, key)
    return mapping, problems


def _unknown(catalog_type: str, key: str, spec: CatalogKeys) -> str:
    known = sorted(spec.exact)
    hint = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
    families = sorted({k.split(".", 1)[0] + ".*" for k in known if "." in k})
    plain = [k for k in known if "." not in k]
    prefixes = [f"{p}<name>" for p in spec.prefixes]
    return (
        f"unknown key for a {catalog_type.lower()} catalog; {did_you_mean}valid keys: "
        f"{', '.join(plain + prefixes + families)} (docs/catalogs-stores.md)"
    )
