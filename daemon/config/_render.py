"""A small TOML writer for check-config: enough for the config's shape, output is valid input.

The standard library reads TOML but does not write it, and the config's shape (sections,
arrays of tables, inline-table arrays, scalars) is small enough that a dependency is not worth it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["render_toml"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a valid TOML basic string (same escapes, \uXXXX for controls).
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        inner = ", ".join(
            f"{_key(str(k))} = {_value(v)}" for k, v in value.items() if v is not None
        )
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, Mapping) for v in value):
            rows = "".join(f"  {_value(v)},\n" for v in value)
            return f"[\n{rows}]"
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _body(table: Mapping[str, Any]) -> list[str]:
    return [f"{_key(str(k))} = {_value(v)}" for k, v in table.items() if v is not None]


def render_toml(data: Mapping[str, Any], header: str = "") -> str:
    """TOML text for a two-level mapping: sections, arrays of tables, and their values.

    ``header`` lines are written as comments first. None values are left out (TOML has no
    null), which for the config means "not set".
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    # Plain values must come before the first [section], or TOML would put them inside it.
    for key, value in data.items():
        if value is not None and not isinstance(value, Mapping) and not _is_table_array(value):
            lines.append(f"{_key(str(key))} = {_value(value)}")
    for key, value in data.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{_key(str(key))}]", *_body(value)]
        elif _is_table_array(value):
            for entry in value:
                lines += ["", f"[[{_key(str(key))}]]", *_body(entry)]
    return "\n".join(lines).lstrip("\n") + "\n"
