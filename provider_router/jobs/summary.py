"""The end of a run: why it stopped, where each dataset stands, and the money.

:class:`RunSummary` is built once at the end from the run's counters
(:class:`~provider_router.jobs.counter.Counter`) and written as ``summary.json``;
the terminal's tables are :mod:`provider_router.jobs.observe.summary_view`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

from provider_router._format import decimal_str, format_usd
from provider_router._money import from_units
from provider_router._spend_limits import SpendLimit
from provider_router.client._cost_check import ACTIVITY_URL
from provider_router.jobs.counter import Counter

__all__ = [
    "DatasetReport",
    "RunSummary",
    "SharedLedger",
    "StopReason",
    "disputed_line",
    "floor_sentence",
    "truncation_line",
]


class StopReason(StrEnum):
    """Why a run ended."""

    COMPLETE = "complete"
    """Every dataset reached its target, its cap or the end of its prompts."""
    INCOMPLETE = "incomplete"
    """Nothing left to try in this run, but some prompts failed (re-run to retry them)."""
    TARGET_NOT_REACHED = "target_not_reached"
    """Every prompt was done, and a dataset's output-token target is still not reached."""
    BUDGET = "budget_exhausted"
    """A budget cannot cover another request: our ledger's, or one OpenRouter keeps
    (the key's limit, a workspace or guardrail budget: ``spend_limit`` says which)."""
    CREDITS = "credits_exhausted"
    """OpenRouter's balance ran out (a 402), or one request is above the account's
    in-flight budget (``spend_limit`` says so)."""
    INTERRUPTED = "interrupted"
    """Ctrl-C: in-flight requests were let finish."""
    ABANDONED = "abandoned"
    """A second Ctrl-C: in-flight requests were cancelled (counted at worst case)."""
    ERROR = "error"
    """A failure that every request would hit (for example a rejected API key)."""


def _str(value: Decimal | None) -> str | None:
    return None if value is None else decimal_str(value)


@dataclass(frozen=True, slots=True)
class SharedLedger:
    """A ledger other runs share (``run --ledger``), as a run saw it at its end.

    Attributes:
        name: its name (``--ledger-name``).
        url: its Redis URL, without credentials.
        limit: what every run on it may spend together (changed by ``ledger topup`` only).
        spent: what every run on it spent.
        reserved: what every run on it holds for requests in flight.
    """

    name: str
    url: str
    limit: Decimal = Decimal(0)
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)

    def topup(self, limit: Decimal) -> str:
        """The command that sets its limit to ``limit``."""
        return (
            f"provider-router ledger topup {self.url} --name {self.name} "
            f"--limit {decimal_str(limit)}"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (money as exact decimal strings; no URL)."""
        return {
            "name": self.name,
            "limit_usd": decimal_str(self.limit),
            "spent_usd": decimal_str(self.spent),
            "reserved_usd": decimal_str(self.reserved),
        }


@dataclass
class DatasetReport:
    """Where a dataset stands at the end of a run (all runs so far, plus this run's counter).

    Attributes:
        name: the dataset.
        prompts: good prompts known in its files (None until counted).
        completed: prompts completed over every run.
        output_tokens: completion tokens over every run.
        cost: their cost over every run (USD).
        target_output_tokens: its target, if any.
        max_requests: its request cap, if any.
        bad_lines: lines skipped as bad in this run.
        lost: requests found lost after a crash (all runs).
        run: what this run did.
        to_finish: USD needed to finish it at observed rates (None: unknown).
        truncated: completions cut at ``max_tokens`` (``finish_reason: length``), over
            every run: in ``completed`` and the outputs, paid for, not whole answers.
        truncated_cost: what they cost (USD, in ``cost``).
        set_aside: completions moved out of the outputs, over every run (kept in
            ``DIR/set_aside/<why>/``: cut ones by ``run --redo-truncated``, answers to a
            prompt edited under its id); their prompts ran again.
        set_aside_cost: what they cost (USD: spent, in no dataset's ``cost``).
    """

    name: str
    prompts: int | None
    completed: int
    output_tokens: int
    cost: Decimal
    target_output_tokens: int | None
    max_requests: int | None
    bad_lines: int
    lost: int
    run: Counter
    to_finish: Decimal | None = None
    truncated: int = 0
    truncated_cost: Decimal = Decimal(0)
    set_aside: int = 0
    set_aside_cost: Decimal = Decimal(0)

    @property
    def finished(self) -> bool:
        """Reached its target or cap, or completed every prompt."""
        if (
            self.target_output_tokens is not None
            and self.output_tokens >= self.target_output_tokens
        ):
            return True
        if self.max_requests is not None and self.completed >= self.max_requests:
            return True
        return self.prompts is not None and self.completed >= self.prompts

    @property
    def request_cap(self) -> int | None:
        """The most prompts it will complete: its prompts, capped by ``max_requests``."""
        caps = [c for c in (self.prompts, self.max_requests) if c is not None]
        return min(caps) if caps else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "prompts": self.prompts,
            "completed": self.completed,
            "output_tokens": self.output_tokens,
            "cost": decimal_str(self.cost),
            "target_output_tokens": self.target_output_tokens,
            "max_requests": self.max_requests,
            "finished": self.finished,
            "bad_lines": self.bad_lines,
            "lost_in_crashes": self.lost,
            "truncated": self.truncated,
            "truncated_cost_usd": decimal_str(self.truncated_cost),
            "set_aside": self.set_aside,
            "set_aside_cost_usd": decimal_str(self.set_aside_cost),
            "to_finish_usd": _str(self.to_finish),
            "this_run": self.run.to_json(),
        }


@dataclass
class RunSummary:
    """The end of a run: why it stopped, every dataset and provider, and the money.

    Attributes:
        reason: why it stopped.
        datasets: per-dataset reports, in plan order.
        providers: this run's counters per serving provider.
        provider_health: errors and 429s per provider as the client observed them.
        budget: the budget in force at the end: the job's ledger's limit, or on a
            shared ledger the job's own cap (USD).
        spent: the job's spend over every run (USD): its ledger's spent total, or on
            a shared ledger what its journal records it paid and this run spent.
        reserved: still reserved at the end (USD; 0 after a clean stop).
        to_finish: USD still to spend to finish the plan at observed rates (None:
            unknown; see :mod:`provider_router.jobs.finish`).
        budget_to_finish: the budget that allows it, with a margin and room for the
            largest reservation (None: unknown).
        wall_time: seconds this run took.
        bad_lines: ``file:line: problem`` for each line skipped in this run.
        recovered: notes on what resuming repaired (journal, ledger).
        message: one line on why it stopped.
        preflight: USD the preflights of this job directory cost, over every run
            (part of ``spent``, in no dataset's cost: ``run``'s 1-token pinned request).
        disputed: one line per answer whose ``usage.cost`` was disputed, over every
            run: what it said and what was booked instead (docs/ledger.md).
        in_flight: requests still in flight when it was written (sent, not answered).
        waiting_for_budget: requests still waiting for room in the budget (not sent).
        cache_saved: USD prompt caching saved in this run (cached tokens at the serving
            provider's prompt price less its cache-read price: ``Router.cache_saved``).
        batches: the Batch API route's datasets (``BatchView.to_json``,
            :mod:`provider_router.jobs.observe.batch_view`), None when the job sent no batch.
        batch_sentences: the same, one plain sentence per dataset (what every view says).
        verification: with ``run --verify``, the job's checks, what they excluded, the
            rows flagged and what the checks cost (:meth:`provider_router.jobs.drift.
            DriftWatch.summary`; None without it).
        refused: the largest reservation the budget refused (room a resume needs).
        limit_outside: the ledger's limit at the end is not one the job's runs gave
            it (``ledger topup`` changed it): raising it takes ``--raise-budget``.
        shared: the ledger other runs share, when the job spends from one.
        price_vs_floor: what this run's answers cost against the same tokens at the
            floor's prices (the cheapest allowed endpoint's): ``paid_usd``,
            ``floor_usd``, ``ratio``, ``floor_endpoint``, ``floor_provider``,
            ``max_premium`` (None: no answer, or no router).
        admission: per endpoint tag, what admission saw (``LaneStats.to_json``:
            admitted, served, refused, learned capacity, waits, rests).
        spend_limit: the limit OpenRouter keeps that stopped the run (a 402 or 403:
            the key's limit, a workspace or guardrail budget, the credits), with what
            lifts it; None when none did.
        openrouter: what the run asked of OpenRouter besides the route (its trace,
            context compression, distillable text:
            :func:`provider_router.jobs.router_options.openrouter_summary`).
    """

    reason: StopReason
    datasets: list[DatasetReport]
    providers: dict[str, Counter]
    provider_health: dict[str, dict[str, Any]]
    budget: Decimal
    spent: Decimal
    reserved: Decimal
    to_finish: Decimal | None
    wall_time: float
    bad_lines: list[str]
    recovered: list[str]
    message: str = ""
    budget_to_finish: Decimal | None = None
    preflight: Decimal = Decimal(0)
    disputed: list[str] = field(default_factory=list)
    in_flight: int = 0
    waiting_for_budget: int = 0
    cache_saved: Decimal = Decimal(0)
    batches: dict[str, Any] | None = None
    batch_sentences: list[str] = field(default_factory=list)
    verification: dict[str, Any] | None = None
    refused: Decimal = Decimal(0)
    limit_outside: bool = False
    shared: SharedLedger | None = None
    price_vs_floor: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None
    spend_limit: SpendLimit | None = None
    openrouter: dict[str, Any] | None = None

    @property
    def truncated(self) -> int:
        """Completions cut at ``max_tokens``, over every run (every dataset's)."""
        return sum(d.truncated for d in self.datasets)

    @property
    def truncated_cost(self) -> Decimal:
        """What they cost (USD)."""
        return sum((d.truncated_cost for d in self.datasets), Decimal(0))

    def floor_sentence(self) -> str | None:
        """One sentence on the price paid against the floor and where requests waited
        (None: nothing to say)."""
        return floor_sentence(self.price_vs_floor, self.admission)

    @property
    def budget_to_resume(self) -> Decimal | None:
        """After a budget or credits stop, the budget that finishes the plan when it is
        above this run's (None: running again with the same budget will do)."""
        needed = self.budget_to_finish
        money = self.reason in (StopReason.BUDGET, StopReason.CREDITS)
        if money and needed is not None and needed > self.budget:
            return needed
        return None

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        return {
            "reason": self.reason.value,
            "message": self.message,
            **({"spend_limit": self.spend_limit.to_json()} if self.spend_limit else {}),
            "budget_usd": decimal_str(self.budget),
            "spent_usd": decimal_str(self.spent),
            "reserved_usd": decimal_str(self.reserved),
            "preflight_usd": decimal_str(self.preflight),
            "cache_saved_usd": decimal_str(self.cache_saved),
            "to_finish_usd": _str(self.to_finish),
            "budget_to_finish_usd": _str(self.budget_to_finish),
            "in_flight": self.in_flight,
            "waiting_for_budget": self.waiting_for_budget,
            "truncated": self.truncated,
            "truncated_cost_usd": decimal_str(self.truncated_cost),
            "wall_time_s": round(self.wall_time, 3),
            "datasets": {d.name: d.to_json() for d in self.datasets},
            "providers": {
                name: {**counter.to_json(), **self.provider_health.get(name, {})}
                for name, counter in sorted(self.providers.items())
            },
            **({"price_vs_floor": self.price_vs_floor} if self.price_vs_floor else {}),
            **({"admission": self.admission} if self.admission else {}),
            **({"verification": self.verification} if self.verification is not None else {}),
            **({"openrouter": self.openrouter} if self.openrouter is not None else {}),
            "bad_lines": self.bad_lines,
            "recovered": self.recovered,
            "disputed": self.disputed,
            **({"batches": self.batches} if self.batches is not None else {}),
            **({"limit_set_outside": True} if self.limit_outside else {}),
            **({"shared_ledger": self.shared.to_json()} if self.shared is not None else {}),
        }

    def write(self, path: Path) -> None:
        """Write ``summary.json`` (atomically: a crash never leaves half a file)."""
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)


def floor_sentence(
    figures: Mapping[str, Any] | None, lanes: Mapping[str, Mapping[str, Any]] | None
) -> str | None:
    """The price paid against the floor and where requests waited, in one sentence, from
    ``summary.json``'s ``price_vs_floor`` and ``admission`` (None: nothing to say)."""
    if not figures:
        return None
    premium = figures.get("max_premium")
    cap = "no cap" if premium is None else f"max_premium {premium}"
    sentence = (
        f"Paid ${figures['paid_usd']}, {Decimal(figures['ratio']):.4f}× the floor "
        f"(${figures['floor_usd']} at {figures['floor_provider']}'s prices; {cap})"
    )
    lanes = lanes or {}
    waited = sum(float(lane.get("wait_s_total", 0)) for lane in lanes.values())
    if waited > 0:
        most = max(lanes.items(), key=lambda item: float(item[1].get("wait_s_total", 0)))
        requests = sum(int(lane.get("waited_requests", 0)) for lane in lanes.values())
        sentence += (
            f"; {requests:,} requests waited {waited:,.1f} s in all for an endpoint with "
            f"room, most for {most[1].get('provider', most[0])}"
        )
    return sentence + "."


def disputed_line(entry: Mapping[str, Any]) -> str:
    """One line for a journal's ``disputed`` entry (:meth:`FileJournal.note_disputed`)."""
    booked = from_units(int(entry.get("booked") or 0))
    gen = entry.get("gen") or "(no id)"
    return (
        f"{entry.get('key')} (generation {gen}): the answer's usage.cost "
        f"${entry.get('reported')} was not booked; ${decimal_str(booked)} (its worst "
        f"case) was: check generation {gen} at {ACTIVITY_URL}"
    )


def truncation_line(answers: int, truncated: int, cost: Decimal, truncated_cost: Decimal) -> str:
    """The sentence every view says about answers cut at ``max_tokens`` ("" when none).

    ``answers`` and ``cost``: every completion of the job and what they cost.
    """
    if not truncated:
        return ""
    share = f" ({truncated / answers:.0%})" if answers else ""
    return (
        f"{truncated:,} of {answers:,} answers{share} were cut at max_tokens "
        f"(finish_reason: length): {format_usd(truncated_cost)} of the {format_usd(cost)} "
        "they cost; they are in the outputs (export skips them)"
    )
