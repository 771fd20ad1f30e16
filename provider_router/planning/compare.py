"""Sync or batch: the same plan projected both ways, side by side, and the route each
dataset takes.

Pure, like :mod:`provider_router.planning.projection`, whose :func:`project` prices
both routes: the sync one on the model's endpoints, the batch one on the single
``:batch`` endpoint :func:`~provider_router.routing.batch_endpoints.batch_route` pins,
at its own prices and with no cache reads (the side that never under-reserves). It
also estimates each route's time, expected and worst (docs/projection.md, "Sync or
batch"). A dataset's ``route`` (``sync``, ``batch`` or ``auto``) decides which it
takes; ``auto`` takes batch where an allowed batch endpoint exists, the dataset has no
deadline sooner than the window, and the live sync price is not below the ``:batch``
one (a promotion).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from statistics import NormalDist
from typing import Any, Final, Literal

from provider_router._exceptions import ConfigurationError
from provider_router.catalog.records import Endpoint, ModelEndpoints
from provider_router.planning.projection import project
from provider_router.planning.projection_result import Projection
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.routing.batch_endpoints import (
    BatchRoute,
    PriceCheck,
    batch_route,
    price_against_sync,
)
from provider_router.routing.policy import ProviderPolicy

__all__ = [
    "BATCH_MAX_BYTES",
    "BATCH_MAX_REQUESTS",
    "BATCH_WINDOW_SECONDS",
    "RouteChoice",
    "RouteComparison",
    "RouteOption",
    "compare_routes",
]

Route = Literal["sync", "batch", "auto"]
ROUTES: Final[tuple[str, ...]] = ("sync", "batch", "auto")
BATCH_MAX_REQUESTS: Final = 5_000
BATCH_MAX_BYTES: Final = 200 * 1024 * 1024
BATCH_WINDOW_SECONDS: Final = 24 * 3600.0
BATCH_MEDIAN_SECONDS: Final = 7 * 60.0
BATCH_P90_SECONDS: Final = 3600.0
_SIGMA: Final = math.log(BATCH_P90_SECONDS / BATCH_MEDIAN_SECONDS) / NormalDist().inv_cdf(0.9)
_BYTES_PER_TOKEN: Final = 4
"""About four characters a token, as the prompt estimate counts them."""
_LINE_OVERHEAD_BYTES: Final = 256
"""custom_id, max_tokens and the JSON around each line (a generous allowance)."""


@dataclass(frozen=True, slots=True)
class RouteOption:
    """One route for the whole plan: its projection (None: unavailable) and times.

    Attributes:
        route: ``"sync"`` or ``"batch"``.
        projection: the plan priced on this route, or None when it cannot run.
        expected_seconds / worst_seconds: wall time of the whole plan (None: unknown).
        batches: how many batches the plan splits into (0 for sync).
        reason: why it is unavailable, or what it runs on.
    """

    route: Literal["sync", "batch"]
    projection: Projection | None
    expected_seconds: float | None
    worst_seconds: float | None
    batches: int
    reason: str

    @property
    def available(self) -> bool:
        return self.projection is not None

    @property
    def expected_cost(self) -> Decimal | None:
        if self.projection is None:
            return None
        return self.projection.total.expected.cost("cheapest")

    def fits(self) -> bool | None:
        """Whether the whole plan's expected cost fits the budget (None: no budget)."""
        if self.projection is None:
            return None
        fit = self.projection.budget_fit("cheapest")
        return None if fit is None else fit.fits


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """The route one dataset takes, and why."""

    dataset: str
    asked: str
    route: Literal["sync", "batch"]
    reason: str


@dataclass(frozen=True, slots=True)
class RouteComparison:
    """Sync and batch side by side for one plan, and each dataset's route."""

    sync: RouteOption
    batch: RouteOption
    batch_route: BatchRoute
    choices: tuple[RouteChoice, ...]
    concurrency: int = 1
    """Requests in flight the sync times assume."""

    @property
    def saving(self) -> Decimal | None:
        """Expected USD saved by running everything as batches (None: batch unavailable)."""
        sync, batch = self.sync.expected_cost, self.batch.expected_cost
        return None if sync is None or batch is None else sync - batch

    def to_dict(self) -> dict[str, Any]:
        def option(o: RouteOption) -> dict[str, Any]:
            fit = None if o.projection is None else o.projection.budget_fit("cheapest")
            return {
                "available": o.available,
                "reason": o.reason,
                "expected_cost": None if o.expected_cost is None else str(o.expected_cost),
                "high_cost": None
                if o.projection is None
                else str(o.projection.total.high.cost("cheapest")),
                "expected_seconds": o.expected_seconds,
                "worst_seconds": o.worst_seconds,
                "batches": o.batches,
                "fits_budget": o.fits(),
                "uniform_target": None if fit is None else fit.uniform_target,
            }

        return {
            "sync": option(self.sync),
            "batch": option(self.batch),
            "batch_pin": list(self.batch_route.only),
            "routes": {c.dataset: {"route": c.route, "reason": c.reason} for c in self.choices},
        }


def _no_cache(workload: WorkloadEstimate) -> WorkloadEstimate:
    return WorkloadEstimate(
        workload.prompt_tokens,
        workload.completion_tokens,
        completion_tokens_low=workload.low,
        completion_tokens_high=workload.high,
        reasoning_tokens=workload.reasoning_tokens,
        cached_prompt_share=0,
        source=workload.source,
    )


def _sync_seconds(
    projection: Projection, endpoint: Endpoint, concurrency: int
) -> tuple[float | None, float | None]:
    latency, throughput = endpoint.latency_last_30m, endpoint.throughput_last_30m
    if latency is None or throughput is None or latency.p50 is None or not throughput.p50:
        return None, None
    worst_ttft = latency.p99 if latency.p99 is not None else latency.p50
    expected = worst = 0.0
    for dataset in projection.datasets:
        for scenario, ttft in ((dataset.expected, latency.p50), (dataset.high, worst_ttft)):
            requests = scenario.tokens.requests
            if not requests:
                continue
            per_response = scenario.tokens.completion_tokens / requests
            seconds = requests * (ttft / 1000 + per_response / throughput.p50) / concurrency
            if scenario is dataset.expected:
                expected += seconds
            else:
                worst += seconds
    return expected, worst


def _batches_needed(projection: Projection, prompt_tokens: Decimal) -> int:
    line_bytes = float(prompt_tokens) * _BYTES_PER_TOKEN + _LINE_OVERHEAD_BYTES
    per_batch = max(1, min(BATCH_MAX_REQUESTS, int(BATCH_MAX_BYTES // line_bytes)))
    return sum(math.ceil(d.expected.tokens.requests / per_batch) for d in projection.datasets)


def median_of_slowest(batches: int) -> float:
    """Median wall time of the slowest of ``batches`` batches run at once (capped at 24 h)."""
    if batches < 1:
        return 0.0
    quantile = 0.5 ** (1 / batches)
    seconds = BATCH_MEDIAN_SECONDS * math.exp(_SIGMA * NormalDist().inv_cdf(quantile))
    return min(seconds, BATCH_WINDOW_SECONDS)


def _choose(
    demand: DatasetDemand,
    asked: str,
    deadline_hours: float | None,
    batch: BatchRoute,
    price: PriceCheck | None = None,
) -> RouteChoice:
    if asked not in ROUTES:
        raise ConfigurationError(f"dataset {demand.name!r}: route must be one of {ROUTES}")
    if asked == "sync":
        return RouteChoice(demand.name, asked, "sync", "the plan asks for sync")
    if not batch.available:
        if asked == "batch":
            raise ConfigurationError(
                f"dataset {demand.name!r} asks for route batch, but {batch.reason}"
            )
        return RouteChoice(demand.name, asked, "sync", batch.reason)
    if (
        asked == "auto"
        and deadline_hours is not None
        and deadline_hours * 3600 < BATCH_WINDOW_SECONDS
    ):
        return RouteChoice(
            demand.name,
            asked,
            "sync",
            f"its deadline ({deadline_hours:g} h) is sooner than the batch window (24 h)",
        )
    if price is not None and price.sync_cheaper:
        sentence = price.sentence(demand.name, asked)
        return RouteChoice(demand.name, asked, "sync" if asked == "auto" else "batch", sentence)
    return RouteChoice(demand.name, asked, "batch", batch.reason)


def compare_routes(
    demands: Sequence[DatasetDemand],
    sync_listing: ModelEndpoints,
    batch_listing: ModelEndpoints,
    policy: ProviderPolicy,
    workload: WorkloadEstimate,
    *,
    budget: Decimal | str | int | None = None,
    model_id: str | None = None,
    concurrency: int = 1,
    routes: Mapping[str, str] | None = None,
    deadlines: Mapping[str, float | None] | None = None,
) -> RouteComparison:
    """Project ``demands`` on both routes and choose each dataset's route.

    Args:
        demands: the datasets, in priority order (as :func:`project` takes them).
        sync_listing / batch_listing: ``Catalog.endpoints`` and
            ``Catalog.batch_endpoints`` of the model.
        policy: one policy for both routes.
        workload: the request shape (a dataset's own overrides it).
        budget: USD both routes are fitted into.
        concurrency: requests in flight on the sync route.
        routes: per dataset ``sync`` / ``batch`` / ``auto`` (default sync).
        deadlines: per dataset, hours within which it must be done (``auto`` only).

    Raises:
        ConfigurationError: as :func:`project`; or a dataset asks for ``batch`` and the
            model has no batch endpoint the policy allows.
    """
    if concurrency < 1:
        raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
    model = model_id or sync_listing.id
    sync = project(demands, sync_listing, policy, workload, budget=budget, model_id=model)
    expected, worst = _sync_seconds(sync, sync.cheapest, concurrency)
    sync_option = RouteOption(
        "sync", sync, expected, worst, 0, f"{sync.cheapest.provider_name} first, and the mix"
    )
    pinned = batch_route(batch_listing, policy, _no_cache(workload).to_workload(), model_id=model)
    if pinned.endpoint is None:
        batch_option = RouteOption("batch", None, None, None, 0, pinned.reason)
    else:
        batch_demands = [
            replace(d, workload=None if d.workload is None else _no_cache(d.workload))
            for d in demands
        ]
        batch = project(
            batch_demands,
            [pinned.endpoint],
            policy,
            _no_cache(workload),
            budget=budget,
            model_id=model,
        )
        count = _batches_needed(batch, workload.prompt_tokens)
        batch_option = RouteOption(
            "batch", batch, median_of_slowest(count), BATCH_WINDOW_SECONDS, count, pinned.reason
        )
    asked = routes or {}
    due = deadlines or {}
    price = None
    if pinned.endpoint is not None and pinned.endpoint.pricing.prompt is not None:
        # A promotion can put the live sync price below the :batch one: auto goes sync.
        price = price_against_sync(pinned, sync_listing, policy, workload.to_workload())
    choices = tuple(
        _choose(d, asked.get(d.name, "sync"), due.get(d.name), pinned, price) for d in demands
    )
    return RouteComparison(sync_option, batch_option, pinned, choices, concurrency)
