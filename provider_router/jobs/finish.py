"""What finishing the plan takes: one definition for every place that shows it.

"To finish" is two numbers, the same in the live display, ``status``, the timeline and
report, Prometheus, ``summary.json`` and the stop message: the money still to spend,
at the rates observed so far, on the work the plan still asks for
(:func:`plan_to_finish`), and the budget that allows it: what is spent, plus that work
with a margin, plus room for the largest reservation the budget refused
(:func:`budget_to_finish`). A dataset's remaining work is the smaller of what its
target still needs and what its prompts still allow, priced at its own cost per output
token, or the whole job's before it has any completion.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Protocol

from provider_router._format import CENT, format_usd, round_up_to_cent
from provider_router._spend_limits import SpendLimit, SpendLimitKind
from provider_router.jobs.summary import StopReason

__all__ = [
    "FINISH_MARGIN",
    "Finishable",
    "budget_to_finish",
    "finish_hint",
    "finish_words",
    "money_to_finish",
    "plan_to_finish",
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
    plus room for the largest reservation the budget refused (every request
    reserves its worst case before it is sent, so the last one needs that room
    even when the plan's real remaining cost is a few cents). Whole cents, rounded up.
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
    *,
    limit: SpendLimit | None = None,
) -> str:
    """The message tail after a money stop: what finishes the plan, and how to resume.

    ``limit``: the spend limit OpenRouter keeps that stopped the run, when one did (a
    key's limit, a workspace or guardrail budget, or the in-flight budget one request
    is too large for): what lifts it is said instead of a budget or a top-up."""
    if limit is not None and limit.kind is not SpendLimitKind.CREDITS:
        more = ""
        if needed is not None and to_finish is not None:
            more = (
                f"; about {format_usd(max(to_finish, CENT))} more finishes the plan at the "
                f"observed rates (a budget of {format_usd(needed)})"
            )
        return f"{more}; {limit.remedy}, then run the same command again to resume"
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
    if reason is StopReason.CREDITS:
        return (
            f"; about {more} more finishes the plan at the observed rates (a budget of "
            f"{format_usd(needed)}): top up the OpenRouter credits, then run the same command "
            "again to resume" + tail
        )
    return (
        f"; about {more} more finishes the plan at the observed rates: run again with a "
        f"budget of {format_usd(needed)} to resume" + tail
    )
