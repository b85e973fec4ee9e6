"""Loading: TOML file (or the embedded default), ``ICESPOOL__SECTION__KEY`` overrides, validation.

Every problem comes out as ConfigError whose key is the dotted path of the offending value
(``tables[0].schema[1].type``), so check-config can point at it.
"""

from __future__ import annotations

import copy
import datetime as dt
import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from icespool.config._model import Config, annotation_at, embedded_catalog, keys_at
from icespool.errors import ConfigError

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigFileError",
    "apply_env_overrides",
    "embedded_default",
    "env_overrides",
    "format_key",
    "load_config",
    "read_config_file",
    "resolve_config_path",
    "validate_config",
]

CONFIG_ENV = "ICESPOOL_CONFIG"
ENV_PREFIX = "ICESPOOL__"

Loc = tuple[str | int, ...]


class ConfigFileError(ConfigError):
    """The config file cannot be read or is not TOML (no single key is at fault)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__("", problem)
        self.path = path
        self.args = (f"config file '{path}': {problem}",)


def embedded_default(data_dir: Path | None = None) -> dict[str, Any]:
    """The config used when no file is given: everything local under ./icespool-data.

    One demo table is declared so a fresh ``icespool run`` has somewhere to POST to.
    """
    base = Path(os.path.abspath(data_dir if data_dir is not None else "icespool-data"))
    return {
        "catalog": embedded_catalog(base),
        "spool": {"dir": str(base / "spool")},
        "http": {"listen": "127.0.0.1:8080"},
        "tables": [
            {
                "name": "demo.events",
                "create": True,
                "schema": [
                    {"name": "event_id", "type": "long", "required": True},
                    {"name": "ts", "type": "timestamptz"},
                    {"name": "kind", "type": "string"},
                ],
                "partition_by": ["day(ts)"],
            }
        ],
    }


def resolve_config_path(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> Path | None:
    """``path``, else ``$ICESPOOL_CONFIG``, else None (the embedded default)."""
    if path is not None and str(path) != "":
        return Path(path)
    env = os.environ if env is None else env
    from_env = env.get(CONFIG_ENV, "")
    return Path(from_env) if from_env else None


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigFileError(
            path,
            "does not exist; pass an existing file with --config (or ICESPOOL_CONFIG), "
            "or neither to use the embedded default",
        ) from None
    except IsADirectoryError:
        raise ConfigFileError(path, "is a directory; pass the path of a TOML file") from None
    except OSError as exc:
        raise ConfigFileError(
            path, f"cannot be read ({exc.strerror}); check its permissions"
        ) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigFileError(path, "is not UTF-8 text; save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(path, f"is not valid TOML: {exc}") from None


def env_overrides(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``ICESPOOL__...`` variables of ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIX)}


_TABLE_KEY = re.compile(r"tables\[(\d+)\]")


def format_key(loc: Sequence[str | int]) -> str:
    """("tables", 0, "schema", 1, "type") -> "tables[0].schema[1].type"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _parse_env_value(text: str, loc: Loc) -> Any:
    """TOML scalar/array when the text is one (``1024``, ``true``, ``["a"]``), else the string.

    String-typed keys always take the text as is, so ``ICESPOOL__KAFKA__0__GROUP_ID=42``
    means the group "42", not an integer.
    """
    target = annotation_at(loc)
    if target is str or target is Path or target is None or "\n" in text or "\r" in text:
        return text
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return text
    return value


def apply_env_overrides(
    raw: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """A copy of ``raw`` with ``ICESPOOL__SECTION__KEY=value`` applied.

    Parts are lowercased; a number selects an entry of an array of tables
    (``ICESPOOL__TABLES__0__BATCH_TIMEOUT=5s``). Returns the new dict and a map from the
    dotted keys that were set to the variable that set them.
    """
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    sources: dict[str, str] = {}
    for var, text in env_overrides(env).items():
        parts = var[len(ENV_PREFIX) :].split("__")
        if any(not p for p in parts):
            raise ConfigError(
                var, "empty part in the variable name; write ICESPOOL__SECTION__KEY=value"
            )
        node: Any = out
        loc: list[str | int] = []
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(
                        format_key(loc),
                        f"{var}: '{part}' is not an index of this array of {len(node)} entries; "
                        f"use 0..{len(node) - 1}, or add the entry in the config file",
                    )
                index = int(part)
                loc.append(index)
                if last:
                    node[index] = _parse_env_value(text, tuple(loc))
                    break
                child = node[index]
            else:
                # The file's own spelling of the key wins: a variable cannot write '-' or
                # '.', so S3__SECRET_ACCESS_KEY is the file's "s3.secret-access-key"
                # (a dotted key) or its [catalog.s3] secret-access-key.
                dotted = _spelt_in(node, "_".join(p.lower() for p in parts[i:]))
                if dotted is not None:
                    loc.append(dotted)
                    node[dotted] = _parse_env_value(text, tuple(loc))
                    break
                key = _spelt_in(node, part.lower()) or part.lower()
                loc.append(key)
                if last:
                    node[key] = _parse_env_value(text, tuple(loc))
                    break
                child = node.setdefault(key, {})
            if not isinstance(child, dict | list):
                raise ConfigError(
                    format_key(loc),
                    f"{var} sets a key inside {format_key(loc)!r}, which is a value, not a table",
                )
            node = child
        sources[format_key(loc)] = var
    return out, sources


def _spelt_in(node: Mapping[str, Any], name: str) -> str | None:
    """The one key of ``node`` that ``name`` (a variable's lowercased parts joined by '_')
    spells, with '-', '.' and '_' alike; None when there is none or more than one."""
    wanted = re.sub(r"[-.]", "_", name)  # Kubernetes allows '-' in variable names
    found = [k for k in node if re.sub(r"[-.]", "_", str(k).lower()) == wanted]
    return found[0] if len(found) == 1 else None


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(err: ErrorDetails) -> str:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    msg = err["msg"]
    if kind == "extra_forbidden":
        unknown = str(loc[-1])
        valid = keys_at(loc[:-1])
        hint = difflib.get_close_matches(unknown, valid, n=1)
        did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
        return f"unknown key; {did_you_mean}valid keys here: {', '.join(valid)}"
    if kind == "missing":
        return "is required but missing; add it"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return (
            "must be a table ([section], [[array]] or { key = value }), "
            f"got {type(err['input']).__name__} {_short_repr(err['input'])}"
        )
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    return f"{msg}; got {_short_repr(err['input'])}"


def _located(error: ConfigError, raw: Mapping[str, Any], sources: Mapping[str, str]) -> ConfigError:
    """``error`` naming its table (for a ``tables[i]...`` key) and the environment
    variable that set the value, where one did."""
    problem, table = error.problem, error.table
    for key, var in sources.items():
        if error.key == key or error.key.startswith((key + ".", key + "[")):
            problem = f"{problem} (set by {var})"
            break
    found = _TABLE_KEY.match(error.key)
    tables = raw.get("tables")
    if table is None and found and isinstance(tables, list):
        index = int(found.group(1))
        entry = tables[index] if index < len(tables) else None
        name = entry.get("name") if isinstance(entry, Mapping) else None
        table = name if isinstance(name, str) and name else None
    return ConfigError(error.key, problem, table=table)


def validate_config(raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Config:
    """Validate a raw config mapping; every problem is in the ConfigError raised
    (``problems``; ``key``/``problem`` are the first one).

    ``sources`` (dotted key -> environment variable) lets the message say where a bad value
    came from.
    """
    sources = sources or {}
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems = [ConfigError(format_key(e["loc"]), _describe(e)) for e in errors]
    except ConfigError as exc:
        problems = list(exc.problems)
    raise ConfigError.of([_located(p, raw, sources) for p in problems]) from None


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """The effective config: file (or ``$ICESPOOL_CONFIG``, or the embedded default) + env.

    A file without a ``[catalog]`` section gets the embedded SQLite catalog; the embedded
    demo table is only used when there is no file at all.
    """
    env = os.environ if env is None else env
    resolved = resolve_config_path(path, env)
    if resolved is None:
        raw = embedded_default()
    else:
        raw = read_config_file(resolved)
        if "catalog" not in raw:
            raw["catalog"] = embedded_catalog()
    merged, sources = apply_env_overrides(raw, env)
    return validate_config(merged, sources)
