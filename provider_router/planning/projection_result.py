"""The results of a projection, and their exact JSON form.

Frozen records that :func:`provider_router.planning.projection.project` returns; money and
fractional token counts become decimal strings in :meth:`Projection.to_dict`, so a
reader can parse them back exactly. Kept apart from the arithmetic so the text
report and the arithmetic both depend on them, and neither on the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal

from provider_router._format import decimal_str
from provider_router.catalog.records import Endpoint, Pricing
from provider_router.planning.workload import WorkloadEstimate
from provider_router.routing.policy import Decisions
from provider_router.routing.ranking import RankedEndpoint

__all__ = [
    "BudgetFit",
    "CostBasis",
    "CostRange",
    "DatasetProjection",
    "PartialDataset",
    "Projection",
    "RouteShare",
    "Scenario",
    "TokenTotals",
    "projection_to_dict",
]

CostBasis = Literal["cheapest", "mix"]
"""Which price a figure assumes: the cheapest allowed endpoint, or the routing mix."""

_ZERO: Final = Decimal(0)


# --- outputs --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """Whole-number totals of a (part of a) plan. Cached ⊂ prompt, reasoning ⊂ completion."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    """Prompt tokens written to the cache (⊂ prompt), billed at ``input_cache_write``."""

    def __add__(self, other: TokenTotals) -> TokenTotals:
        return TokenTotals(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def cost_at(self, pricing: Pricing) -> Decimal:
        """Exact USD of these totals at ``pricing``.

        ``pricing`` must carry no ``overrides``: they are conditions on one
        request's prompt, which totals do not have (see :func:`flat_pricing`).
        """
        return pricing.cost(
            self.prompt_tokens,
            self.completion_tokens,
            cached_tokens=self.cached_tokens,
            cache_write_tokens=self.cache_write_tokens,
            requests=self.requests,
        )


@dataclass(frozen=True, slots=True)
class Scenario:
    """Token totals under one response length, and what they cost."""

    completion_tokens_per_response: Decimal
    tokens: TokenTotals
    cost_cheapest: Decimal
    cost_mix: Decimal

    def cost(self, basis: CostBasis) -> Decimal:
        """The cost on ``basis``."""
        return self.cost_cheapest if basis == "cheapest" else self.cost_mix

    def __add__(self, other: Scenario) -> Scenario:
        tokens = self.tokens + other.tokens
        per_response = (
            Decimal(tokens.completion_tokens) / tokens.requests if tokens.requests else _ZERO
        )
        return Scenario(
            per_response,
            tokens,
            self.cost_cheapest + other.cost_cheapest,
            self.cost_mix + other.cost_mix,
        )


_EMPTY_SCENARIO: Final = Scenario(_ZERO, TokenTotals(), _ZERO, _ZERO)


@dataclass(frozen=True, slots=True)
class CostRange:
    """Low, expected and high USD."""

    low: Decimal
    expected: Decimal
    high: Decimal


@dataclass(frozen=True, slots=True)
class DatasetProjection:
    """One dataset (or the plan's total) in the low, expected and high scenario.

    Attributes:
        name: the dataset (``"total"`` for the sum).
        target_output_tokens: its target, if it has one.
        low: the cheaper of the two extreme response-length scenarios.
        expected: the expected scenario.
        high: the dearer extreme scenario.
        limited_by: what stops it in the expected scenario: ``"target"``,
            ``"max_requests"`` or ``"prompts"`` (``"mixed"`` for the total).
        target_reached: false when the request cap or the prompts run out
            before the target (expected scenario).
    """

    name: str
    target_output_tokens: int | None
    low: Scenario
    expected: Scenario
    high: Scenario
    limited_by: str
    target_reached: bool = True

    def cost(self, basis: CostBasis = "mix") -> CostRange:
        """Low, expected and high cost on ``basis``."""
        return CostRange(self.low.cost(basis), self.expected.cost(basis), self.high.cost(basis))


@dataclass(frozen=True, slots=True)
class RouteShare:
    """The share of successful requests an endpoint is expected to serve."""

    endpoint: Endpoint
    rank: int
    share: Decimal
    cost_per_request: Decimal


@dataclass(frozen=True, slots=True)
class PartialDataset:
    """The first dataset (in priority order) that does not fit whole, and what of it fits."""

    name: str
    output_tokens: int
    cost: Decimal


@dataclass(frozen=True, slots=True)
class BudgetFit:
    """What a budget buys on one cost basis.

    Attributes:
        basis: ``"cheapest"`` or ``"mix"``.
        budget: the budget in USD.
        needed: what the full plan costs (low / expected / high).
        fits: the full plan's expected cost is within the budget.
        fits_high: even its high cost is within the budget.
        uniform_target: the largest output-token cap per dataset whose expected
            cost fits (``None`` when the whole plan fits: no cap needed).
        uniform_target_conservative: the same using the high scenario.
        whole_datasets: the datasets, in priority (plan) order, that fit whole
            one after another (expected cost).
        partial: the next dataset and the output tokens of it the rest buys.
    """

    basis: CostBasis
    budget: Decimal
    needed: CostRange
    fits: bool
    fits_high: bool
    uniform_target: int | None
    uniform_target_conservative: int | None
    whole_datasets: tuple[str, ...]
    partial: PartialDataset | None


@dataclass(frozen=True, slots=True)
class Projection:
    """The projected cost of a plan.

    Attributes:
        model_id: the model.
        decisions: the policy's verdict on every endpoint.
        ranked: the allowed endpoints, best first, for the first dataset's workload.
        cheapest: the allowed endpoint with the lowest cost per request.
        mix: the expected routing mix (endpoints with a share, rank order).
        workload: the plan-wide workload.
        datasets: per dataset, in plan order.
        total: the sum over datasets.
        budget_fits: what the budget buys, one per basis (cheapest, mix);
            empty when no budget was given.
        max_premium: the Router's cap on the premium over the floor (``None``: none).
        capacity_limited: the total when the cheapest endpoints are full and requests
            spill to dearer ones: the cheapest endpoint's cost × (1 + ``max_premium``),
            the most cost-first admission pays on average; with no cap, every token at
            the dearest allowed endpoint's price. ``None`` for a projection made
            without it.
    """

    model_id: str
    decisions: Decisions
    ranked: tuple[RankedEndpoint, ...]
    cheapest: Endpoint
    mix: tuple[RouteShare, ...]
    workload: WorkloadEstimate
    datasets: tuple[DatasetProjection, ...]
    total: DatasetProjection
    budget_fits: tuple[BudgetFit, ...] = field(default=())
    max_premium: Decimal | None = None
    capacity_limited: CostRange | None = None

    def budget_fit(self, basis: CostBasis = "mix") -> BudgetFit | None:
        """The budget fit on ``basis`` (``None`` without a budget)."""
        for fit in self.budget_fits:
            if fit.basis == basis:
                return fit
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (money and fractional tokens as decimal strings)."""
        return projection_to_dict(self)


# --- the JSON form -------------------------------------------------------------


def projection_to_dict(projection: Projection) -> dict[str, Any]:
    """A JSON-ready form of ``projection`` (money and fractional tokens as strings)."""
    return {
        "model": projection.model_id,
        "workload": _workload_dict(projection.workload),
        "cheapest": _endpoint_dict(projection.cheapest),
        "mix": [
            {**_endpoint_dict(s.endpoint), "rank": s.rank, "share": decimal_str(s.share)}
            for s in projection.mix
        ],
        "datasets": [_dataset_dict(d) for d in projection.datasets],
        "total": _dataset_dict(projection.total),
        "budget": [_fit_dict(f) for f in projection.budget_fits],
        "capacity_limited": _capacity_dict(projection),
    }


def _capacity_dict(projection: Projection) -> dict[str, Any] | None:
    cost = projection.capacity_limited
    if cost is None:
        return None
    premium = projection.max_premium
    return {
        "max_premium": None if premium is None else decimal_str(premium),
        "low": decimal_str(cost.low),
        "expected": decimal_str(cost.expected),
        "high": decimal_str(cost.high),
    }


def _endpoint_dict(endpoint: Endpoint) -> dict[str, Any]:
    pricing = endpoint.pricing
    return {
        "provider": endpoint.provider_name,
        "slug": endpoint.slug,
        "prompt_per_million": _optional(pricing.prompt_per_million),
        "completion_per_million": _optional(pricing.completion_per_million),
        "uptime": endpoint.uptime,
    }


def _optional(value: Decimal | None) -> str | None:
    return None if value is None else decimal_str(value)


def _workload_dict(workload: WorkloadEstimate) -> dict[str, Any]:
    return {
        "prompt_tokens": decimal_str(workload.prompt_tokens),
        "completion_tokens": {
            "low": decimal_str(workload.low),
            "expected": decimal_str(workload.completion_tokens),
            "high": decimal_str(workload.high),
        },
        "reasoning_tokens": decimal_str(workload.reasoning_tokens),
        "cached_prompt_share": decimal_str(workload.cached_prompt_share),
        "source": workload.source,
    }


def _scenario_dict(scenario: Scenario) -> dict[str, Any]:
    tokens = scenario.tokens
    return {
        "completion_tokens_per_response": decimal_str(scenario.completion_tokens_per_response),
        "requests": tokens.requests,
        "prompt_tokens": tokens.prompt_tokens,
        "cached_tokens": tokens.cached_tokens,
        "completion_tokens": tokens.completion_tokens,
        "reasoning_tokens": tokens.reasoning_tokens,
        "cost_cheapest": decimal_str(scenario.cost_cheapest),
        "cost_mix": decimal_str(scenario.cost_mix),
    }


def _dataset_dict(dataset: DatasetProjection) -> dict[str, Any]:
    return {
        "name": dataset.name,
        "target_output_tokens": dataset.target_output_tokens,
        "limited_by": dataset.limited_by,
        "target_reached": dataset.target_reached,
        "low": _scenario_dict(dataset.low),
        "expected": _scenario_dict(dataset.expected),
        "high": _scenario_dict(dataset.high),
    }


def _fit_dict(fit: BudgetFit) -> dict[str, Any]:
    return {
        "basis": fit.basis,
        "budget": decimal_str(fit.budget),
        "needed": {
            "low": decimal_str(fit.needed.low),
            "expected": decimal_str(fit.needed.expected),
            "high": decimal_str(fit.needed.high),
        },
        "fits": fit.fits,
        "fits_high": fit.fits_high,
        "uniform_target": fit.uniform_target,
        "uniform_target_conservative": fit.uniform_target_conservative,
        "whole_datasets": list(fit.whole_datasets),
        "partial": None
        if fit.partial is None
        else {
            "name": fit.partial.name,
            "output_tokens": fit.partial.output_tokens,
            "cost": decimal_str(fit.partial.cost),
        },
    }
