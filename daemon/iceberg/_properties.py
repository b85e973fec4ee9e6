"""Integer table properties, read by one rule wherever the daemon reads them.

Any engine may set any string on a table (Iceberg parses properties only when it uses
them), so a value may be no number at all. Two policies, by what the property decides:

* ``int_property``: properties that only tune the daemon's work (manifest merging,
  snapshot retention). A bad value is logged at warning, naming the table, the key and
  the value (once per table, key and value), and the default applies: a tuning knob
  never stops commits or maintenance.
* ``write_int_property``: the table's write properties (``write.target-file-size-bytes``,
  ``write.parquet.row-group-limit``, ...), which every writer of the table must follow
  (Spark's writes fail on a bad one too). A bad value is the table's fault: a
  TablePropertyError holds the table back until it is fixed, and nothing is quarantined.

Both parse with ``parse_int_property``: Python's ``int`` of the text, then the least
value the key allows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, overload

from icespool.errors import TablePropertyError

__all__ = ["int_property", "parse_int_property", "warn_bad_property", "write_int_property"]

_log = logging.getLogger("icespool.table")

# (table, key, value) already warned about; bounded, then forgotten.
_warned: set[tuple[str, str, str]] = set()
_WARNED_MAX: Final = 1_000


def parse_int_property(key: str, value: str, *, minimum: int | None) -> int:
    """``value`` of ``key`` as an integer; ValueError naming both when it is none, or is
    below ``minimum`` (None: any integer)."""
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"table property {key}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise ValueError(f"table property {key}={value!r} must be {what}")
    return number


@overload
def int_property(
    properties: Mapping[str, str], key: str, default: int, *, table: str, minimum: int | None = 1
) -> int: ...
@overload
def int_property(
    properties: Mapping[str, str], key: str, default: None, *, table: str, minimum: int | None = 1
) -> int | None: ...
def int_property(
    properties: Mapping[str, str],
    key: str,
    default: int | None,
    *,
    table: str,
    minimum: int | None = 1,
) -> int | None:
    """``key``'s value, or ``default`` when it is unset or empty; a value that is no
    integer (or is below ``minimum``) is logged at warning naming ``table``, the key and
    the value, and ``default`` applies."""
    value = properties.get(key)
    if not value:
        return default
    try:
        return parse_int_property(key, value, minimum=minimum)
    except ValueError as exc:
        warn_bad_property(table, key, value, str(exc), default)
        return default


@overload
def write_int_property(
    properties: Mapping[str, str], key: str, default: int, *, minimum: int | None = 1
) -> int: ...
@overload
def write_int_property(
    properties: Mapping[str, str], key: str, default: None, *, minimum: int | None = 1
) -> int | None: ...
def write_int_property(
    properties: Mapping[str, str], key: str, default: int | None, *, minimum: int | None = 1
) -> int | None:
    """``key``'s value, or ``default`` when it is unset; a value that is no integer (or
    is below ``minimum``) is a TablePropertyError naming the key and the value."""
    value = properties.get(key)
    if value is None:
        return default
    try:
        return parse_int_property(key, value, minimum=minimum)
    except ValueError as exc:
        raise TablePropertyError(f"{exc}; fix the table") from None


def warn_bad_property(table: str, key: str, value: str, problem: str, default: object) -> None:
    """Log that ``table``'s ``key`` = ``value`` cannot be used (``problem``) and that
    ``default`` (None: the daemon's own setting) applies instead; once per table, key
    and value, as properties are read at every commit or maintenance run."""
    seen = (table, key, value)
    if seen in _warned:
        return
    if len(_warned) >= _WARNED_MAX:
        _warned.clear()
    _warned.add(seen)
    instead = "the daemon's setting" if default is None else repr(default)
    _log.warning("%s; table %s uses %s until it is fixed", problem, table, instead)
