"""What a plan will cost before a cent is spent, and how much of it fits a budget.

Pure: no I/O, no clock. Token totals are integers and every dollar figure is an exact
:class:`~decimal.Decimal` computed with the endpoints' own
:meth:`~provider_router.catalog.records.Pricing.cost`, so caching and reasoning are
priced exactly as OpenRouter bills them. Per dataset, the requests a target needs at
each of the workload's three response lengths give a low, expected and high scenario,
each priced under the cheapest allowed endpoint and under the routing mix (the
router falls through endpoints in rank order by uptime), and the total when the
cheapest endpoints are full (within the Router's ``max_premium``). docs/projection.md
gives the model, its assumptions and error bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Final, Literal

from provider_router._constants import DEFAULT_MAX_PREMIUM
from provider_router._exceptions import ConfigurationError
from provider_router.catalog.records import Endpoint, ModelEndpoints, Pricing
from provider_router.catalog.verdicts import VerificationReport
from provider_router.planning.plan import Plan
from provider_router.planning.projection_result import (
    _EMPTY_SCENARIO,
    BudgetFit,
    CostBasis,
    CostRange,
    DatasetProjection,
    PartialDataset,
    Projection,
    RouteShare,
    Scenario,
    TokenTotals,
)
from provider_router.planning.workload import (
    DatasetDemand,
    WorkloadEstimate,
    _count,
    _decimal,
    demands_from_plan,
)
from provider_router.routing.policy import Decisions, ProviderPolicy
from provider_router.routing.ranking import DEFAULT_ASSUMED_UPTIME, RankedEndpoint, rank

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
    "flat_pricing",
    "project",
]

_BASES: Final[tuple[CostBasis, ...]] = ("cheapest", "mix")
_ZERO: Final = Decimal(0)
_ONE: Final = Decimal(1)


def _ceil_div(numerator: int, denominator: Decimal) -> int:
    return int((numerator / denominator).to_integral_value(rounding=ROUND_CEILING))


# --- the arithmetic -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Market:
    """The priced endpoints one workload routes to."""

    ranked: tuple[RankedEndpoint, ...]
    cheapest: Endpoint
    mix: tuple[RouteShare, ...]
    cheapest_pricing: Pricing
    mix_pricing: tuple[tuple[Decimal, Pricing], ...]

    def costs(self, tokens: TokenTotals) -> tuple[Decimal, Decimal]:
        cheapest = tokens.cost_at(self.cheapest_pricing)
        mix = sum((share * tokens.cost_at(p) for share, p in self.mix_pricing), _ZERO)
        return cheapest, mix


def flat_pricing(endpoint: Endpoint, prompt_tokens_per_request: Decimal) -> Pricing:
    """The prices in force for requests of this prompt length, with no overrides left.

    Long-context overrides apply per request (``min_prompt_tokens``), so they are
    resolved here, once, rather than against a plan's total prompt tokens.
    Time-of-day overrides are not applied: the listed prices are those in force
    when the listing was read.
    """
    pricing = endpoint.pricing
    if not pricing.overrides:
        return pricing
    return pricing.effective(prompt_tokens_per_request).model_copy(update={"overrides": ()})


def _routing_mix(ranked: Sequence[RankedEndpoint]) -> tuple[RouteShare, ...]:
    # The router tries endpoints in rank order and falls through on failure.
    shares = []
    missed = _ONE
    for entry in ranked:
        shares.append(missed * entry.success_probability)
        missed *= _ONE - entry.success_probability
    served = _ONE - missed
    return tuple(
        RouteShare(entry.endpoint, entry.rank, share / served, entry.cost_per_request)
        for entry, share in zip(ranked, shares, strict=True)
        if share
    )


def _market(
    decisions: Decisions,
    workload: WorkloadEstimate,
    assumed_uptime: Decimal | float | int,
    verified: VerificationReport | None,
) -> _Market:
    allowed = decisions.allowed
    if not allowed:
        reasons = "; ".join(
            f"{d.endpoint.provider_name}: {d.reason}" for d in decisions.rejected[:6]
        )
        raise ConfigurationError(
            f"the policy allows none of the {len(decisions)} endpoints of "
            f"{decisions.model_id!r}, so nothing can be projected ({reasons or 'no endpoints'})"
        )
    ranked = tuple(
        rank(
            allowed,
            workload=workload.to_workload(),
            assumed_uptime=assumed_uptime,
            verified=verified,
        )
    )
    cheapest = min(ranked, key=lambda r: (r.cost_per_request, r.rank)).endpoint
    mix = _routing_mix(ranked)
    prompt = workload.prompt_tokens
    return _Market(
        ranked,
        cheapest,
        mix,
        flat_pricing(cheapest, prompt),
        tuple((s.share, flat_pricing(s.endpoint, prompt)) for s in mix),
    )


def _tokens(
    demand: DatasetDemand, workload: WorkloadEstimate, per_response: Decimal, cap: int | None
) -> tuple[TokenTotals, str]:
    """Totals for one dataset at one response length, with an optional output cap."""
    target = demand.target_output_tokens
    if cap is not None:
        target = cap if target is None else min(target, cap)
    limits: list[tuple[int, str]] = []
    if target is not None:
        limits.append((_ceil_div(target, per_response), "target"))
    if demand.max_requests is not None:
        limits.append((demand.max_requests, "max_requests"))
    if demand.available_prompts is not None:
        limits.append((demand.available_prompts, "prompts"))
    requests, limited_by = min(limits, key=lambda item: item[0])
    prompt = _count(requests * workload.prompt_tokens)
    completion = _count(requests * per_response)
    return (
        TokenTotals(
            requests=requests,
            prompt_tokens=prompt,
            cached_tokens=_count(prompt * workload.cached_prompt_share),
            completion_tokens=completion,
            reasoning_tokens=_count(completion * workload.reasoning_share),
            cache_write_tokens=_count(prompt * workload.cache_write_share),
        ),
        limited_by,
    )


def _scenario(
    demand: DatasetDemand,
    workload: WorkloadEstimate,
    market: _Market,
    per_response: Decimal,
    cap: int | None = None,
) -> tuple[Scenario, str]:
    tokens, limited_by = _tokens(demand, workload, per_response, cap)
    cheapest, mix = market.costs(tokens)
    return Scenario(per_response, tokens, cheapest, mix), limited_by


@dataclass(frozen=True, slots=True)
class _Priced:
    """A dataset with its workload and market: everything needed to re-price it."""

    demand: DatasetDemand
    workload: WorkloadEstimate
    market: _Market

    def scenario(self, per_response: Decimal, cap: int | None = None) -> Scenario:
        return _scenario(self.demand, self.workload, self.market, per_response, cap)[0]

    def extremes(self, cap: int | None = None) -> tuple[Scenario, Scenario]:
        """(cheaper, dearer) of the low- and high-length scenarios, by mix cost."""
        short = self.scenario(self.workload.low, cap)
        long = self.scenario(self.workload.high, cap)
        return (short, long) if short.cost_mix <= long.cost_mix else (long, short)

    def cost(
        self, basis: CostBasis, which: Literal["expected", "high"], cap: int | None
    ) -> Decimal:
        if which == "expected":
            return self.scenario(self.workload.completion_tokens, cap).cost(basis)
        return self.extremes(cap)[1].cost(basis)

    def projection(self) -> DatasetProjection:
        expected, limited_by = _scenario(
            self.demand, self.workload, self.market, self.workload.completion_tokens
        )
        low, high = self.extremes()
        target = self.demand.target_output_tokens
        return DatasetProjection(
            name=self.demand.name,
            target_output_tokens=target,
            low=low,
            expected=expected,
            high=high,
            limited_by=limited_by,
            target_reached=target is None or expected.tokens.completion_tokens >= target,
        )

    def ceiling(self) -> int:
        """An output cap at or above which the cap never binds (any scenario)."""
        full = self.scenario(self.workload.high)
        return max(full.tokens.completion_tokens, self.demand.target_output_tokens or 0)


def _largest(limit: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[0, limit]`` with ``fits(n)``, for a monotone ``fits``."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _fits_within(item: _Priced, basis: CostBasis, money: Decimal) -> Callable[[int], bool]:
    return lambda cap: item.cost(basis, "expected", cap) <= money


def _budget_fit(
    priced: Sequence[_Priced], total: DatasetProjection, budget: Decimal, basis: CostBasis
) -> BudgetFit:
    needed = total.cost(basis)
    ceiling = max(p.ceiling() for p in priced)

    def plan_cost(which: Literal["expected", "high"], cap: int) -> Decimal:
        return sum((p.cost(basis, which, cap) for p in priced), _ZERO)

    fits, fits_high = needed.expected <= budget, needed.high <= budget
    uniform = None if fits else _largest(ceiling, lambda c: plan_cost("expected", c) <= budget)
    conservative = (
        None if fits_high else _largest(ceiling, lambda c: plan_cost("high", c) <= budget)
    )
    whole: list[str] = []
    partial = None
    left = budget
    for item in priced:
        cost = item.scenario(item.workload.completion_tokens).cost(basis)
        if cost <= left:
            whole.append(item.demand.name)
            left -= cost
            continue
        tokens = _largest(item.ceiling(), _fits_within(item, basis, left))
        scenario = item.scenario(item.workload.completion_tokens, tokens)
        partial = PartialDataset(
            item.demand.name, scenario.tokens.completion_tokens, scenario.cost(basis)
        )
        break
    return BudgetFit(
        basis=basis,
        budget=budget,
        needed=needed,
        fits=fits,
        fits_high=fits_high,
        uniform_target=uniform,
        uniform_target_conservative=conservative,
        whole_datasets=tuple(whole),
        partial=partial,
    )


def _sum(name: str, parts: Sequence[DatasetProjection]) -> DatasetProjection:
    targets = [p.target_output_tokens for p in parts]
    return DatasetProjection(
        name=name,
        target_output_tokens=(
            None if any(t is None for t in targets) else sum(t for t in targets if t)
        ),
        low=sum((p.low for p in parts), _EMPTY_SCENARIO),
        expected=sum((p.expected for p in parts), _EMPTY_SCENARIO),
        high=sum((p.high for p in parts), _EMPTY_SCENARIO),
        limited_by="mixed",
        target_reached=all(p.target_reached for p in parts),
    )


def _capacity_limited(
    priced: Sequence[_Priced], total: DatasetProjection, max_premium: Decimal | None
) -> CostRange:
    """What the plan costs when the cheapest endpoints are full: cost-first admission
    holds the average premium within ``max_premium``, so at most the cheapest cost ×
    (1 + premium); with no cap, requests spill anywhere: at most every token at the
    dearest allowed endpoint's price."""
    cheapest = total.cost("cheapest")
    if max_premium is not None:
        factor = _ONE + max_premium
        return CostRange(cheapest.low * factor, cheapest.expected * factor, cheapest.high * factor)
    costs = []
    for which in ("low", "expected", "high"):
        cost = _ZERO
        for item in priced:
            tokens = getattr(item.projection(), which).tokens
            prompt = item.workload.prompt_tokens
            cost += max(
                tokens.cost_at(flat_pricing(r.endpoint, prompt)) for r in item.market.ranked
            )
        costs.append(cost)
    return CostRange(*costs)


def project(
    plan: Plan | Sequence[DatasetDemand],
    endpoints: ModelEndpoints | Iterable[Endpoint],
    policy: ProviderPolicy | None,
    workload: WorkloadEstimate,
    *,
    budget: Decimal | str | int | None = None,
    model_id: str | None = None,
    prompt_counts: Mapping[str, int] | None = None,
    assumed_uptime: Decimal | float | int = DEFAULT_ASSUMED_UPTIME,
    max_premium: Decimal | None = DEFAULT_MAX_PREMIUM,
) -> Projection:
    """Project what ``plan`` costs on the endpoints ``policy`` allows.

    Args:
        plan: a batch :class:`~provider_router.planning.plan.Plan` or the datasets'
            demands in priority order.
        endpoints: the model's listing (``await catalog.endpoints(model)``) or bare
            endpoints (then give ``model_id``, or a ``Plan`` that names the model).
        policy: which endpoints may serve; ``None`` takes the plan's policy (or
            allows everything when ``plan`` is a list of demands).
        workload: the request shape; a dataset's own ``workload`` overrides it, and
            its ``max_tokens`` caps the response lengths (a plan's datasets carry
            their own).
        budget: USD to fit the plan into (default: the plan's budget, if any).
        model_id: the model, when ``endpoints`` is a bare iterable.
        prompt_counts: prompts per dataset of a ``Plan`` (caps its requests).
        assumed_uptime: percent used for endpoints that report no uptime.
        max_premium: the Router's cap on the premium over the floor (``None``: no
            cap; default: a ``Plan``'s own, else the Router's): prices
            :attr:`Projection.capacity_limited`, the cost when the cheapest endpoints
            are full.

    Raises:
        ConfigurationError: the policy allows no endpoint, a dataset is unbounded,
            an allowed endpoint has dynamic pricing, or the budget is not positive.
    """
    if isinstance(plan, Plan):
        demands = demands_from_plan(plan, prompt_counts=prompt_counts)
        if policy is None:
            policy = ProviderPolicy(**plan.policy)
        if budget is None:
            budget = plan.budget
        if max_premium is DEFAULT_MAX_PREMIUM:
            max_premium = plan.max_premium
        model_id = model_id or plan.model
    else:
        demands = tuple(plan)
    if not demands:
        raise ConfigurationError("a projection needs at least one dataset")
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"dataset names must be unique, got {names}")
    policy = policy or ProviderPolicy()
    if isinstance(endpoints, ModelEndpoints):
        decisions = policy.evaluate(endpoints, model_id=model_id)
    else:
        if model_id is None:
            raise ConfigurationError("project() needs model_id= when given bare endpoints")
        decisions = policy.evaluate(list(endpoints), model_id=model_id)
    verified = policy.ranking_report(decisions.model_id)
    markets: dict[WorkloadEstimate, _Market] = {}
    priced = []
    for demand in demands:
        own = (demand.workload or workload).capped(demand.max_tokens)
        if own not in markets:
            markets[own] = _market(decisions, own, assumed_uptime, verified)
        priced.append(_Priced(demand, own, markets[own]))
    datasets = tuple(p.projection() for p in priced)
    total = _sum("total", datasets)
    fits: tuple[BudgetFit, ...] = ()
    if budget is not None:
        amount = _decimal(budget, "budget")
        if amount <= 0:
            raise ConfigurationError(f"budget must be more than $0, got {amount}")
        fits = tuple(_budget_fit(priced, total, amount, basis) for basis in _BASES)
    first = priced[0].market
    return Projection(
        max_premium=max_premium,
        capacity_limited=_capacity_limited(priced, total, max_premium),
        model_id=decisions.model_id,
        decisions=decisions,
        ranked=first.ranked,
        cheapest=first.cheapest,
        mix=first.mix,
        workload=workload,
        datasets=datasets,
        total=total,
        budget_fits=fits,
    )
