"""The job's budget: what a run's ``--budget`` does to the limit it spends within.

On the job's own ledger the budget is its limit, and the journal records the budget
each run gave it, so a limit set outside the job's runs (``provider-router ledger
topup``) is told apart and stands (:func:`choose_limit`): a budget below what the job
spent is refused, and a raise above an operator's limit needs ``raise_limit``. On a
ledger other runs share, its limit is changed only by ``ledger topup``, and a run's
budget is its job's own cap inside it (:func:`choose_share`). Every refusal comes
before anything is written or sent. The rules, as a table: docs/ledger.md, "A job's
budget" and "Runs sharing one ledger".
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlsplit

from provider_router._exceptions import JobRefused
from provider_router._format import decimal_str, format_usd
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.summary import SharedLedger
from provider_router.ledger import Ledger, LedgerState

__all__ = ["BudgetChoice", "apply_choice", "choose_limit", "choose_share", "public_url"]

_NOTHING = "nothing was changed or sent"


@dataclass(frozen=True, slots=True)
class BudgetChoice:
    """What a run's budget does (see the module docstring).

    Attributes:
        budget: what the run spends within: the ledger's limit, or on a shared ledger
            the job's own cap.
        set_limit: the ledger's limit is set to ``budget`` (its own ledger only).
        record: the journal records ``budget`` as the one the job's runs gave.
        note: the one line the run says about it (None: nothing changed).
    """

    budget: Decimal
    set_limit: bool = False
    record: bool = True
    note: str | None = None


def choose_limit(
    given: Decimal,
    state: LedgerState,
    last: Decimal | None,
    *,
    raise_limit: bool = False,
    where: str = "the job's ledger",
) -> BudgetChoice:
    """What ``given`` (``--budget``) does to the job's own ledger (module docstring).

    Args:
        given: the run's budget.
        state: the ledger now.
        last: the budget the job's runs last gave it (None: never recorded, so the
            limit is taken as the job's own).
        raise_limit: a raise above a limit set outside the job's runs is meant.
        where: the ledger, for messages.

    Raises:
        JobRefused: ``given`` is below what was spent, or raises a limit set outside
            the job's runs without ``raise_limit``.
    """
    limit, spent = state.limit, state.spent
    if given < spent:
        raise JobRefused(
            f"--budget {format_usd(given)} is below the ${decimal_str(spent)} this job "
            f"already spent from {where}: nothing more could be spent. Give a budget of at "
            f"least that; {_NOTHING}"
        )
    if given == limit:
        return BudgetChoice(given, record=last != limit)
    if last is None or last == limit:
        return BudgetChoice(
            given,
            set_limit=True,
            note=f"budget changed from {format_usd(limit)} to {format_usd(given)}",
        )
    outside = (
        f"{where} has a limit of {format_usd(limit)}, set outside this job's runs (by "
        f"`provider-router ledger topup`) since its last run gave it {format_usd(last)}"
    )
    if given > limit and not raise_limit:
        keep = (
            "leave the job stopped there"
            if limit <= spent + state.reserved
            else f"run within it with --budget {decimal_str(limit)}"
        )
        raise JobRefused(
            f"{outside}, and it stands: --budget {format_usd(given)} would raise it. To "
            f"raise it, run again with --budget {decimal_str(given)} --raise-budget; or "
            f"{keep}; {_NOTHING}"
        )
    if given == last and limit > given:
        # The job's previous command again, after a top-up: the top-up counts.
        return BudgetChoice(
            limit,
            record=False,
            note=f"{outside}: it stands (--budget {format_usd(given)} does not lower it)",
        )
    how = "raised" if given > limit else "lowered"
    return BudgetChoice(
        given,
        set_limit=True,
        note=f"{outside}: {how} to {format_usd(given)} (--budget)",
    )


def choose_share(
    given: Decimal,
    state: LedgerState,
    spent: Decimal,
    last: Decimal | None,
    *,
    shared: SharedLedger,
) -> BudgetChoice:
    """What ``given`` does on a ledger other runs share (module docstring).

    Args:
        given: the run's budget: the job's own cap.
        state: the shared ledger now.
        spent: what the job's journal records it paid (answers, preflights, checks).
        last: the job's own cap its runs last gave (None: never recorded).
        shared: the shared ledger.

    Raises:
        JobRefused: ``given`` is below what the job spent, or above the shared limit.
    """
    if given < spent:
        raise JobRefused(
            f"--budget {format_usd(given)} is below the ${decimal_str(spent)} this job "
            f"already spent from the shared ledger {shared.name!r}: nothing more could be "
            f"spent. Give a budget of at least that; {_NOTHING}"
        )
    if given > state.limit:
        raise JobRefused(
            f"--budget {format_usd(given)} is above the {format_usd(state.limit)} limit of the "
            f"shared ledger {shared.name!r} (what every run on it may spend together), which "
            "no run's --budget changes: raise it first with "
            f"`{shared.topup(given)}`, or give --budget {decimal_str(state.limit)} or less; "
            f"{_NOTHING}"
        )
    if last is None or last == given:
        return BudgetChoice(given, record=last is None)
    return BudgetChoice(
        given,
        note=f"this job's budget changed from {format_usd(last)} to {format_usd(given)} "
        f"(its own cap inside the shared ledger {shared.name!r}, whose limit stays "
        f"{format_usd(state.limit)})",
    )


async def apply_choice(ledger: Ledger, choice: BudgetChoice, journal: FileJournal) -> list[str]:
    """Carry ``choice`` out on the job's ``ledger`` and ``journal``; the lines it says."""
    old = None
    if choice.set_limit:
        old = (await ledger.snapshot()).limit
        await ledger.set_limit(choice.budget)
    if choice.record:
        journal.note_budget(choice.budget, None if old == choice.budget else old)
    return [] if choice.note is None else [choice.note]


def public_url(url: str) -> str:
    """``url`` without the credentials it may carry (for messages and commands)."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return parts._replace(netloc=host).geturl()
