"""Which table each record of a fetch goes to.

A source has one router: `StaticRouter` (``table = ...``: every record to one
table) or `DynamicRouter` (``route_field`` / ``route_header`` with
``table_template``). A route value must be a plain name part (1-128 letters,
digits, ``_`` or ``-``): a value like ``../x`` never becomes part of a table name.
Records without a usable route, or routed to a table that is not configured,
become dead records (``invalid``, ``too_deep``, ``unknown_route``); with
``auto_create`` the source creates the unknown route's table and adds it here,
up to ``max_tables`` tables: routes beyond are dead records (``table_limit``).

Routing a record is O(1) in the number of tables (a set lookup), and so is adding one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from icespool.config import KafkaConfig
from icespool.decode import DeadRecord, route_field_values
from icespool.kafka._fetch import Fetch

__all__ = ["DynamicRouter", "Routed", "Router", "StaticRouter", "router_for"]

_ROUTE_VALUE = re.compile(r"[A-Za-z0-9_-]{1,128}")

#: Fetch positions per table, and the records no table takes (with the table an
#: ``unknown_route`` record was meant for).
Routed = tuple[dict[str, npt.NDArray[np.int64]], list[tuple[DeadRecord, str | None]]]


class Router(Protocol):
    @property
    def targets(self) -> list[str]:
        """The tables records may go to (the dead-letter table not included)."""

    def route(self, fetch: Fetch) -> Routed:
        """Split ``fetch`` by table (blocking: may parse every value)."""

    def add(self, table: str) -> None:
        """Route to ``table`` from now on (``auto_create`` created it)."""

    @property
    def room(self) -> int:
        """How many more tables ``auto_create`` may add (``max_tables``)."""


class StaticRouter:
    def __init__(self, table: str) -> None:
        self._targets = [table]

    @property
    def targets(self) -> list[str]:
        return self._targets

    def route(self, fetch: Fetch) -> Routed:
        return {self._targets[0]: np.arange(len(fetch.offsets), dtype=np.int64)}, []

    def add(self, table: str) -> None:
        raise ValueError(f"a source with a static table routes to nothing else ({table!r})")

    @property
    def room(self) -> int:
        return 0


class DynamicRouter:
    def __init__(self, config: KafkaConfig, tables: Sequence[str], max_depth: int) -> None:
        self._config = config
        self._targets = list(config.targets(tables))
        self._known = set(self._targets)
        self._max_depth = max_depth

    @property
    def targets(self) -> list[str]:
        return self._targets

    def add(self, table: str) -> None:
        if table not in self._known:
            self._targets.append(table)
            self._known.add(table)

    @property
    def room(self) -> int:
        if not self._config.auto_create:
            return 0
        return max(0, self._config.max_tables - self._routed())

    def _routed(self) -> int:
        # The dead-letter table "<ns>.kafka_dead_letter" matches "<ns>.{value}"
        # templates; it is not one of the tables max_tables counts.
        return len(self._targets) - (self._config.dead_letter_table in self._known)

    def route(self, fetch: Fetch) -> Routed:
        c = self._config
        deep: dict[int, str] = {}
        if c.route_field is not None:
            routes, deep = route_field_values(fetch.values, c.route_field, self._max_depth)
        else:
            assert c.route_header is not None, "a dynamic route reads a field or a header"
            routes = _header_values(fetch, c.route_header)
        dead: list[tuple[DeadRecord, str | None]] = []
        by_table: dict[str, list[int]] = {}
        for i, route in enumerate(routes):
            table = c.route(route) if route and _ROUTE_VALUE.fullmatch(route) else None
            if table is not None and table in self._known:
                by_table.setdefault(table, []).append(i)
            elif i in deep:
                dead.append((DeadRecord(i, "too_deep", deep[i]), None))
            elif table is None:
                what = c.route_field or c.route_header
                problem = (
                    f"no usable route value in {what!r} (got {route!r}; "
                    "1-128 letters, digits, '_' or '-')"
                )
                dead.append((DeadRecord(i, "invalid", problem), None))
            elif c.auto_create and self.room == 0:
                problem = (
                    f"route {route!r} -> {table!r} would be table {self._routed() + 1} "
                    f"of this source, past its max_tables = {c.max_tables}; raise "
                    "[[kafka]] max_tables, or fix the route values"
                )
                dead.append((DeadRecord(i, "table_limit", problem), table))
            else:
                problem = f"route {route!r} -> {table!r} is not a configured table"
                dead.append((DeadRecord(i, "unknown_route", problem), table))
        return {t: np.asarray(ix, dtype=np.int64) for t, ix in by_table.items()}, dead


def _header_values(fetch: Fetch, header: str) -> list[str | None]:
    """The route value of every record: its ``header``'s value as UTF-8 text (None:
    no such header, an empty one, or one that is not UTF-8)."""
    by_header: list[str | None] = []
    for pairs in fetch.headers:
        found = next((v for k, v in pairs if k == header), None)
        try:
            by_header.append(found.decode() if found else None)
        except UnicodeDecodeError:
            by_header.append(None)
    return by_header


def router_for(config: KafkaConfig, tables: Sequence[str], max_depth: int) -> Router:
    """The router of a ``[[kafka]]`` source over the daemon's ``tables``."""
    if config.dynamic:
        return DynamicRouter(config, tables, max_depth)
    return StaticRouter(config.targets(tables)[0])
