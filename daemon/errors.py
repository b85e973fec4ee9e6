"""The daemon's exception hierarchy: one root, errors that say what to do next."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

__all__ = [
    "BackpressureError",
    "BadInputError",
    "CatalogError",
    "CommitError",
    "ConfigError",
    "IcespoolError",
    "ReadOnlyTableError",
    "ReplayInProgressError",
    "SchemaError",
    "ShuttingDownError",
    "SparkConfError",
    "TableLayoutError",
    "TablePropertyError",
    "UnknownTableError",
]


class IcespoolError(Exception):
    """Root of every error the daemon raises on purpose."""


class ConfigError(IcespoolError):
    """The configuration is invalid; the message names the key and the fix.

    ``key``/``problem`` are the first problem; ``problems`` all of them (a config is
    checked whole, so one run of check-config lists every mistake). ``table`` names
    the ``[[tables]]`` entry a ``tables[i]...`` key belongs to.
    """

    def __init__(
        self,
        key: str,
        problem: str,
        *,
        table: str | None = None,
        more: Sequence[ConfigError] = (),
    ) -> None:
        self.key = key
        self.problem = problem
        self.table = table
        self.problems: tuple[ConfigError, ...] = (self, *(p for e in more for p in e.problems))
        super().__init__("\n".join(p.line() for p in self.problems))

    def line(self) -> str:
        """This one problem (not the others) as one line."""
        where = f" (table {self.table!r})" if self.table else ""
        return f"config key {self.key!r}{where}: {self.problem}"

    @classmethod
    def of(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error carrying ``problems`` (at least one), in order."""
        first, *rest = problems
        return cls(first.key, first.problem, table=first.table, more=rest)


class BadInputError(IcespoolError):
    """Input records cannot be accepted as sent (bad body, wrong types, missing fields).

    ``reason`` is the short label a dead letter and its metric carry: ``invalid``, or
    ``too_deep``, ``bad_utf8``, ``out_of_range`` for the poison kinds that have one.
    """

    reason: str = "invalid"

    def because(self, reason: str) -> Self:
        """This error with ``reason`` set (returns self, to be raised)."""
        self.reason = reason
        return self


class SchemaError(BadInputError):
    """A batch does not fit the table's schema; the message names the column."""

    def __init__(self, column: str, problem: str) -> None:
        self.column = column
        self.problem = problem
        super().__init__(f"column {column!r}: {problem}")


class UnknownTableError(IcespoolError):
    """A record was sent to a table that is not configured."""


class ReadOnlyTableError(IcespoolError):
    """Records were sent to a table only the daemon writes (a Kafka dead-letter table:
    a forged dead letter could make a replay drop the real record at its offset)."""


class BackpressureError(IcespoolError):
    """Queues or the spool are full; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class ShuttingDownError(BackpressureError):
    """The daemon is draining and accepts no new records; retry against a live replica."""


class CatalogError(IcespoolError):
    """The Iceberg catalog or table storage could not be reached or used."""


class TablePropertyError(CatalogError):
    """A table property holds a value no writer can use (``write.target-file-size-bytes =
    "512MB"``, set by another engine): the table's fault, not its rows'. Its flushes fail
    and are retried with backoff, nothing is quarantined; fixing the property lets them
    through."""


class TableLayoutError(CatalogError):
    """An upsert table's layout, changed by another writer, lets the daemon's equality
    deletes miss rows (a partition on a non-key column, live rows of an older
    partition spec): the table's fault, not its rows'. Its flushes fail and are
    retried with backoff, nothing is quarantined; fixing the table lets them through."""


class CommitError(IcespoolError):
    """An Iceberg commit failed for good; the spool still holds its records.

    ``conflicts``: attempts of the failed commit that the catalog refused because
    another writer committed first (``icespool_commit_conflicts_total`` counts them
    whatever the outcome).
    """

    conflicts: int = 0


class ReplayInProgressError(IcespoolError):
    """A dead-letter replay of the same table is already running; wait for its answer."""


class SparkConfError(IcespoolError):
    """The daemon's catalog or the local Spark runtime cannot give Spark a working setup."""
