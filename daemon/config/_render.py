"""check-config's TOML output: the effective config in the spelling a config file uses.

Written by tomli-w, so the output is valid TOML (and valid input again) whatever the values
hold; only what TOML cannot say is handled here: None (TOML has no null) and the header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomli_w

__all__ = ["render_toml"]


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def render_toml(data: Mapping[str, Any], header: str = "") -> str:
    """TOML text for the config's plain data: sections, arrays of tables, and their values.

    ``header`` lines are written as comments first. None values are left out, which for
    the config means "not set". A value TOML cannot hold is a TypeError naming its type.
    """
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = tomli_w.dumps(_without_none(data))
    return "\n".join(part for part in (comments, body) if part) or "\n"
