"""``commit_evolution``: a table's schema changed for incoming data, as planned by
``icespool.schema`` (``plan_evolution``, per the table's policy) on the refreshed table.

Safe against replicas racing to add the same column: a conflict refreshes the table and
plans again, and a plan that has become empty means another replica already did it. The
width is checked on the refreshed table each time, so replicas adding different columns
cannot pass it together. Everything here blocks; the daemon calls it through
``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NoReturn

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from icespool.iceberg._commit._engine import (
    Attempts,
    CommitKind,
    Staged,
    Unchanged,
    run,
    table_name,
)
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._transaction import Staging
from icespool.runtime.retry import CONFLICTS
from icespool.schema import (
    EvolutionPlan,
    Policy,
    SchemaChangeError,
    check_width,
    count_columns,
    plan_evolution,
)

__all__ = ["commit_evolution"]

_log = logging.getLogger("icespool.evolution")


@dataclass
class _SchemaChange(CommitKind[EvolutionPlan, EvolutionPlan]):
    """The plan for ``incoming`` on the refreshed schema, committed as one schema update;
    the decision is the plan. Recognised by nothing being left to plan, when an attempt's
    outcome was unknown."""

    incoming: pa.Schema
    policy: Policy
    max_columns: int
    only: Collection[str] | None
    exact: bool
    sent: EvolutionPlan = field(default_factory=EvolutionPlan)
    noun = "schema change"
    retries_outages = False

    def _plan(self, table: Table) -> EvolutionPlan:
        return plan_evolution(
            table.schema(), self.incoming, self.policy, only=self.only, exact=self.exact
        )

    def landed(self, table: Table, attempts: Attempts) -> EvolutionPlan | None:
        if attempts.unknown and self.sent and not self._plan(table):
            return self.sent
        return None

    def decide(self, table: Table) -> EvolutionPlan | Unchanged[EvolutionPlan]:
        plan = self._plan(table)
        if not plan:
            return Unchanged(plan)
        if plan.adds:
            width = count_columns(table.schema().fields) + plan.added_columns
            check_width(table_name(table), width, self.max_columns, ".".join(plan.adds[0][0]))
        return plan

    def stage(self, table: Table, decision: EvolutionPlan) -> Staged:
        self.sent = decision
        transaction = Staging(table)
        with transaction.update_schema() as update:
            for path, field_type in decision.adds:
                update.add_column(path, field_type, required=False)
            for path, field_type in decision.widens:
                update.update_column(path, field_type=field_type)
        return Staged(transaction)

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> EvolutionPlan:
        refresh_table(table)
        name = table_name(table)
        change = self.sent.describe()
        _log.info("%s: schema evolved: %s", name, change, extra={"table": name, "change": change})
        return self.sent

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        if isinstance(last, CommitFailedException):
            raise SchemaChangeError(
                "?", "schema update kept conflicting with other writers; retry"
            ) from None
        raise last


def commit_evolution(
    table: Table,
    incoming: pa.Schema,
    policy: Policy,
    *,
    max_columns: int,
    only: Collection[str] | None = None,
    exact: bool = True,
) -> EvolutionPlan:
    """Evolve ``table`` for ``incoming`` (blocking); returns what was changed here.

    Plans again on the refreshed table after a conflict, so two replicas adding the same
    column converge (the second finds nothing left to do). A plan that would take the
    table past ``max_columns`` is refused whole (`SchemaChangeError`, nothing is added).
    ``only`` and ``exact``: as for ``plan_evolution``.
    """
    return run(table, _SchemaChange(incoming, policy, max_columns, only, exact), CONFLICTS)
