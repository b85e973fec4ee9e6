"""``icespool dead-letters list``: what a dead-letter table holds, by target and reason.

Read from the catalog directly (no daemon needed, nothing written): the rows the same
filters as ``dead-letters replay`` select, counted per target table and reason, with
the first and last time one was dead-lettered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from icespool.config import Config
from icespool.errors import CatalogError

__all__ = ["list_dead_letters"]

_HEADER = ("TARGET", "REASON", "COUNT", "FIRST", "LAST")


def list_dead_letters(
    config: Config, table: str, filters: Mapping[str, Any], *, as_json: bool
) -> str:
    """The listing's text (or JSON). `BadInputError` names a bad filter; `CatalogError`
    says why the table could not be read."""
    # Imported here: the other commands do not need Kafka's or pyiceberg's modules.
    from pyiceberg.exceptions import NoSuchTableError

    from icespool.iceberg import load_catalog
    from icespool.kafka import ReplayFilter, summarize_dead_letters

    selection = ReplayFilter.from_json(dict(filters))
    name = config.catalog.name
    catalog = load_catalog(name, config.catalog.properties(), config.timeouts, create=False)
    try:
        loaded = catalog.load_table(table)
    except NoSuchTableError:
        raise CatalogError(
            f"the dead-letter table {table} does not exist in catalog {name!r} (the daemon "
            "creates it when it starts with the [[kafka]] section that names it)"
        ) from None
    groups = summarize_dead_letters(loaded, selection.row_filter())
    total = sum(g.count for g in groups)
    if as_json:
        listing = {"table": table, "total": total, "groups": [g.as_json() for g in groups]}
        return json.dumps(listing, indent=2) + "\n"
    if not groups:
        return f"{table}: no dead letters\n"
    rows = [_HEADER] + [
        (
            g.target_table or "(none)",
            g.reason,
            str(g.count),
            g.first.isoformat(timespec="seconds"),
            g.last.isoformat(timespec="seconds"),
        )
        for g in groups
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = [f"{table}: {total} dead letters"]
    for row in rows:
        cells = [
            cell.rjust(width) if i == 2 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
