"""What finishing the plan takes: one definition for every place that shows it.

"To finish" is two numbers, the same in the live display, ``status``, the timeline and
report, Prometheus, ``summary.json`` and the stop message: the money still to spend,
at the rates observed so far, on the work the plan still asks for
(:func:`plan_to_finish`), and the budget that allows it: what is spent, plus that work
with a margin, plus room for the largest reservation the budget refused
(:func:`budget_to_finish`). A dataset's remaining work is the smaller of what its
target still needs and what its prompts still allow (every prompt of its files not yet
completed, sent in this run or not), priced at its own cost per output token, or the
whole job's before it has any completion. After a stop, :func:`resume_budget` is the
budget a run again takes, which the stop message and the ``To resume:`` line carry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from provider_router._exceptions import CreditsExhausted, PaymentRequiredError
from provider_router._format import CENT, format_usd, round_up_to_cent
from provider_router._spend_limits import SpendLimit, SpendLimitKind
from provider_router.jobs.summary import RunSummary, StopReason

__all__ = [
    "FINISH_MARGIN",
    "Finishable",
    "Resume",
    "budget_to_finish",
    "credits_words",
    "finish_hint",
    "finish_words",
    "money_to_finish",
    "plan_to_finish",
    "resume_budget",
]

FINISH_MARGIN = Decimal("1.25")
"""Observed rates are an average: the suggested budget allows a quarter more."""


class Finishable(Protocol):
    """A dataset's standing, over every run: a summary's report or a live snapshot."""

    @property
    def finished(self) -> bool: ...
    @property
    def completed(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cost(self) -> Decimal: ...
    @property
    def target_output_tokens(self) -> int | None: ...
    @property
    def request_cap(self) -> int | None:
        """The most prompts it will complete (its lines, capped by ``max_requests``)."""


def finish_words(to_finish: Decimal | None, needed: Decimal | None) -> str:
    """``about $0.67 more (a budget of $1.34)``: the two numbers, as every view says them."""
    if to_finish is None:
        return "unknown"
    if to_finish == 0:
        return "nothing more"
    words = f"about {format_usd(max(to_finish, CENT))} more"
    return words if needed is None else f"{words} (a budget of {format_usd(needed)})"


def money_to_finish(d: Finishable, fallback_cost_per_token: Decimal | None) -> Decimal | None:
    """USD, in cents, to finish one dataset at the observed rates (None when unknowable)."""
    if d.finished:
        return Decimal(0)
    if d.completed > 0 and d.output_tokens > 0:
        per_token = d.cost / d.output_tokens
        tokens_per_request: float | None = d.output_tokens / d.completed
    elif fallback_cost_per_token is not None:
        per_token = fallback_cost_per_token
        tokens_per_request = None
    else:
        return None
    limits: list[float] = []
    if d.target_output_tokens is not None:
        limits.append(d.target_output_tokens - d.output_tokens)
    cap = d.request_cap
    if tokens_per_request is not None and cap is not None:
        limits.append((cap - d.completed) * tokens_per_request)
    if not limits:
        return None
    tokens = max(min(limits), 0.0)
    return (per_token * math.ceil(tokens)).quantize(CENT)


def plan_to_finish(
    datasets: Iterable[Finishable],
) -> tuple[list[Decimal | None], Decimal | None]:
    """Each dataset's :func:`money_to_finish` and their sum (None if any is unknown)."""
    items = list(datasets)
    cost = sum((d.cost for d in items), Decimal(0))
    tokens = sum(d.output_tokens for d in items)
    fallback = cost / tokens if tokens else None
    each = [money_to_finish(d, fallback) for d in items]
    known = [m for m in each if m is not None]
    return each, (None if len(known) < len(each) else sum(known, Decimal(0)))


def budget_to_finish(
    spent: Decimal, to_finish: Decimal | None, largest_request: Decimal
) -> Decimal | None:
    """The budget that allows finishing the plan: None when the cost per token is unknown.

    What is spent, plus the remaining work at the observed rates with a margin,
    plus room for the largest reservation the budget refused, or after a stop the
    budget did not make, the largest one reserved (every request reserves its worst
    case before it is sent, so the last one needs that room even when the plan's real
    remaining cost is a few cents). Whole cents, rounded up.
    """
    if to_finish is None:
        return None
    return round_up_to_cent(spent + to_finish * FINISH_MARGIN + largest_request)


def finish_hint(
    reason: StopReason,
    budget: Decimal,
    spent: Decimal,
    to_finish: Decimal | None,
    needed: Decimal | None,
    largest_request: Decimal,
    resume: Resume | None = None,
    *,
    limit: SpendLimit | None = None,
) -> str:
    """The message tail after a money stop: what finishes the plan, and how to resume
    (``resume``: :func:`resume_budget`, when a run again needs more than ``needed``'s
    plain ``--budget``).

    ``limit``: the spend limit OpenRouter keeps that stopped the run, when one did (a
    key's limit, a workspace or guardrail budget, or the in-flight budget one request
    is too large for): what lifts it is said instead of a budget or a top-up. After
    OpenRouter's credits ran out (:func:`credits_words` says so), short sentences: what
    the job has spent, what finishing takes, what to do.
    """
    if limit is not None and limit.kind is not SpendLimitKind.CREDITS:
        more = ""
        if needed is not None and to_finish is not None:
            more = (
                f"; about {format_usd(max(to_finish, CENT))} more finishes the plan at the "
                f"observed rates (a budget of {format_usd(needed)})"
            )
        return f"{more}; {limit.remedy}, then run {_again(budget, resume)}to resume"
    if reason is StopReason.CREDITS:
        return _credits_hint(budget, spent, to_finish, needed, largest_request, resume)
    if needed is None or to_finish is None:
        hint = (
            "; how much more finishes the plan is unknown until an answer shows the cost per token"
        )
        if largest_request > budget - spent:
            hint += (
                f"; one request reserves up to {format_usd(largest_request)} (its prompt and "
                "max_tokens at the highest allowed price): raise the budget above "
                f"{format_usd(round_up_to_cent(spent + largest_request))} or lower max_tokens"
            )
        return hint
    tail = ""
    if largest_request > budget:
        tail = (
            f"; one request alone reserves up to {format_usd(largest_request)} (its prompt and "
            "max_tokens at the highest allowed price): shorten it or lower max_tokens"
        )
    more = format_usd(max(to_finish, CENT))
    how = resume_words(resume or Resume(needed))
    return (
        f"; about {more} more finishes the plan at the observed rates: run again {how}to resume"
        + tail
    )


def _again(budget: Decimal, resume: Resume | None) -> str:
    """How to run again once a limit outside the job is lifted: the same command, unless
    it takes more (a larger budget, ``--raise-budget``, a shared limit raised first)."""
    if resume is None or (
        resume.budget <= budget and not resume.raise_limit and resume.shared_limit is None
    ):
        return "the same command again "
    return f"again {resume_words(resume)}"


def _credits_hint(
    budget: Decimal,
    spent: Decimal,
    to_finish: Decimal | None,
    needed: Decimal | None,
    largest_request: Decimal,
    resume: Resume | None,
) -> str:
    cost = f"The job has spent {format_usd(spent)} of its {format_usd(budget)} budget"
    if needed is None or to_finish is None:
        cost += "; how much more finishes the plan is unknown until an answer shows its cost"
    else:
        more = format_usd(max(to_finish, CENT))
        cost += (
            f"; about {more} more finishes the plan at the observed rates (a budget of "
            f"{format_usd(needed)})"
        )
    if largest_request > budget:
        cost += (
            f". One request alone reserves up to {format_usd(largest_request)} (its prompt and "
            "max_tokens at the highest allowed price): shorten it or lower max_tokens"
        )
    again = _again(budget, resume)
    return (
        f". {cost}. Add OpenRouter credits (or raise the key's limit), then run {again}to resume."
    )


def credits_words(exc: CreditsExhausted) -> str:
    """What happened when OpenRouter's credits ran out, in one clause: the 402, which
    limit it named, and OpenRouter's own words (of the refusal that stopped the router)."""
    source = f", {exc.limit_source}" if exc.limit_source else ""
    cause = exc.__cause__
    if isinstance(cause, PaymentRequiredError):
        words = cause.message
    else:
        # The router's later refusals carry no cause, only its stop message.
        found = _REFUSED.match(str(exc))
        words = found["words"] if found else ""
    said = f': "{words.strip().rstrip(".")}"' if words.strip() else ""
    return f"OpenRouter's credits ran out (402{source}){said}"


_REFUSED = re.compile(
    r"OpenRouter refused with 402 \((?P<words>.*)\); the router takes no new work"
)
"""The router's stop message (client/_billing.py), whose parentheses hold OpenRouter's words."""


@dataclass(frozen=True, slots=True)
class Resume:
    """What running a stopped job again takes (its ``To resume:`` line).

    Attributes:
        budget: the ``--budget`` that resumes: after a budget or credits stop, the
            one that finishes the plan when the budget in force would not (or, after a
            budget stop with the cost per token unknown, one that admits the request
            the budget refused); else the budget in force.
        raise_limit: it raises a limit set outside the job's runs: ``--raise-budget``.
        shared_limit: the shared ledger's limit must first be raised to this
            (``ledger topup``; None: no need).
    """

    budget: Decimal
    raise_limit: bool = False
    shared_limit: Decimal | None = None


def resume_budget(summary: RunSummary) -> Resume:
    """What a run again takes, from the summary of the run that stopped."""
    budget = summary.budget
    if summary.reason in (StopReason.BUDGET, StopReason.CREDITS):
        # After a credits stop too: once the credits are topped up, the command as
        # printed should finish the plan, not stop again on the budget.
        needed = summary.budget_to_finish
        if needed is None and summary.refused and summary.reason is StopReason.BUDGET:
            needed = round_up_to_cent(summary.spent + summary.refused)
        if needed is not None and needed > budget:
            budget = needed
    shared = summary.shared
    if shared is None:
        return Resume(budget, raise_limit=budget > summary.budget and summary.limit_outside)
    # The shared limit must hold what every run spent and holds, and this job's rest.
    want = max(round_up_to_cent(shared.spent + shared.reserved + budget - summary.spent), budget)
    return Resume(budget, shared_limit=want if want > shared.limit else None)


def resume_words(resume: Resume) -> str:
    """``with a budget of $1.34 `` as the stop message says it (with what else it takes)."""
    words = f"with a budget of {format_usd(resume.budget)} "
    if resume.raise_limit:
        words += "and --raise-budget (the ledger's limit was set by `ledger topup`) "
    if resume.shared_limit is not None:
        words += (
            f"once the shared ledger's limit is raised to {format_usd(resume.shared_limit)} "
            "(`provider-router ledger topup`) "
        )
    return words
