"""What a run repairs of the runs before it, and the lines its summary says about it.

A job directory outlives its runs: a run may find a journal torn by a kill, requests
that were in flight when the last process died, a budget changed since, and money held
for requests whose outcome nobody saw. Each step repairs one of them and returns the
lines for ``summary.recovered`` (none when there was nothing to repair):
:func:`journal_repairs`, :func:`apply_budget` (a budget never changes silently),
:func:`reconcile_crashed` (crashed reservations settled at their real cost or their
worst case), and :func:`account_check` / :func:`correct_account`
(:mod:`provider_router.jobs.store.account`).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path

from provider_router._constants import STREAM_DEADLINE_BASE, STREAM_DEADLINE_TOKENS_PER_SECOND
from provider_router._format import format_usd
from provider_router._money import from_units
from provider_router.client.router import Router
from provider_router.jobs.store.account import AccountCheck
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import CostResolver, Ledger, RecoveryReport, Reservation
from provider_router.planning.plan import Plan

__all__ = [
    "account_check",
    "apply_budget",
    "correct_account",
    "journal_repairs",
    "reconcile_crashed",
]


def journal_repairs(journal: FileJournal) -> list[str]:
    """What opening ``journal`` repaired, and the requests the last run lost."""
    notes = list(journal.repairs)
    if journal.lost:
        notes.append(
            f"{len(journal.lost)} request(s) were in flight when the last run died; "
            "their prompts run again and their cost is reconciled by the ledger"
        )
    return notes


async def apply_budget(ledger: Ledger, budget: Decimal, journal: FileJournal | None) -> list[str]:
    """Make ``budget`` the ledger's limit; a change is noted in the journal and said."""
    state = await ledger.snapshot()
    if state.limit == budget:
        return []
    await ledger.set_limit(budget)
    if journal is not None:
        journal.note("budget", old=str(state.limit), new=str(budget))
    return [f"budget changed from {format_usd(state.limit)} to {format_usd(budget)}"]


async def reconcile_crashed(
    ledger: Ledger, router: Router, journal: FileJournal | None = None
) -> tuple[RecoveryReport, list[str]]:
    """Settle the reservations of crashed requests through ``router``'s lookups.

    A paid answer whose settle failed (a full disk under the ledger) is settled at
    the cost ``journal`` recorded with it (:meth:`FileJournal.note_unsettled`).
    """
    resolve: CostResolver = router.resolve
    if journal is not None and journal.unsettled:
        resolve = await _with_journaled_costs(ledger, router.resolve, journal.unsettled)
    report = await ledger.recover(resolve)
    if journal is not None:
        journal.used_unsettled()
    if not (report.reconciled or report.worst_case):
        return report, []
    return report, [
        f"ledger: {len(report.reconciled)} crashed request(s) reconciled "
        f"({format_usd(report.reconciled_cost)}), {len(report.worst_case)} "
        f"counted at worst case ({format_usd(report.worst_case_cost)})"
    ]


async def _with_journaled_costs(
    ledger: Ledger, resolve: CostResolver, paid: dict[str, int]
) -> CostResolver:
    """``resolve``, and the journal's cost for a paid answer's reservation without an id.

    Only where that reservation is its key's one open reservation: another one (an
    earlier attempt of the same request, its outcome unknown) leaves both to their
    generation ids or their worst case (unknown is not free).
    """
    open_keys = Counter(res.key for res in await ledger.open_reservations())

    async def journaled(res: Reservation) -> Decimal | None:
        units = paid.get(res.key)
        if res.generation_id or units is None or open_keys[res.key] != 1:
            return await resolve(res)
        return from_units(units)

    return journaled


def account_check(
    plan: Plan,
    out: Path,
    router: Router,
    ledger: Ledger,
    *,
    horizon: float | None,
) -> AccountCheck | None:
    """The account check of a run whose key is its own (``horizon`` < 0: the stream deadline)."""
    if horizon is None:
        return None
    if horizon < 0:
        tokens = max(
            int(plan.params_for(spec).request_params()["max_tokens"]) for spec in plan.datasets
        )
        horizon = STREAM_DEADLINE_BASE + tokens / STREAM_DEADLINE_TOKENS_PER_SECOND
    return AccountCheck(out, router, ledger, horizon=horizon)


async def correct_account(account: AccountCheck) -> list[str]:
    """Take back the worst-case charges the key's usage shows were never made."""
    corrected = await account.finish()
    if not corrected:
        return []
    return [
        f"account: {format_usd(corrected)} of worst-case charges taken "
        "back (the key's usage shows it was never charged)"
    ]
