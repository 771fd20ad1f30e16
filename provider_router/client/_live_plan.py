"""The route plan in force for one model, kept fresh: :class:`LivePlan`.

The plan (:func:`~provider_router.routing.route_plan.build_route_plan`) is built
from the policy's decisions over the model's endpoint listing: a fixed
:class:`~provider_router.ModelEndpoints`, a catalog given by the caller, or the
router's own catalog on the router's connection. Every ``ttl`` seconds the next
request starts a rebuild in the background and goes on under the old plan; a
rebuild that fails keeps the old plan until another ``ttl`` has passed. A new
policy is published only with its plan, so the two never disagree.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final

from provider_router._exceptions import ConfigurationError
from provider_router._http.session import HttpClient
from provider_router._log import get_logger
from provider_router._types import Clock
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload
from provider_router.routing.route_plan import RoutePlan, build_route_plan

__all__ = ["NOT_OPEN", "LivePlan"]

# The Router's logger: its plan's lines are the router's lines.
log = get_logger("provider_router.client.router")

NOT_OPEN: Final = "the Router is not open: use `async with Router(...)`"


class LivePlan:
    """The route plan in force, rebuilt from a fresh listing every ``ttl`` seconds.

    Args:
        model: the model routed.
        policy: the policy in force until :meth:`rebuild` is given another.
        source: a fixed listing (never rebuilt on a timer), a catalog of the
            caller's (not closed here), or ``None``: a catalog of our own on the
            connection :meth:`open` is given.
        ttl: seconds before the plan is rebuilt (and the own catalog's TTL).
        workload: the request shape endpoints are ranked for.
        allow_fallbacks: the routing object's ``allow_fallbacks``.
        cache_workload: the workload at its expected cache hit rate (pinned sessions).
        clock: monotonic seconds.
    """

    __slots__ = (
        "_clock",
        "_endpoints",
        "_lock",
        "_own_catalog",
        "_plan",
        "_refresh",
        "_time",
        "allow_fallbacks",
        "cache_workload",
        "catalog",
        "model",
        "policy",
        "ttl",
        "workload",
    )

    def __init__(
        self,
        model: str,
        policy: ProviderPolicy,
        source: ModelEndpoints | Catalog | None,
        *,
        ttl: float,
        workload: Workload,
        allow_fallbacks: bool,
        cache_workload: Workload,
        clock: Clock,
    ) -> None:
        self.model = model
        self.policy = policy
        """The policy the plan in force was built from."""
        self.catalog = source if isinstance(source, Catalog) else None
        """The catalog listings come from (``None`` before :meth:`open` unless given,
        and with a fixed listing)."""
        self._endpoints = None if isinstance(source, Catalog) else source
        self._own_catalog = False
        self.ttl = ttl
        self.workload = workload
        self.allow_fallbacks = allow_fallbacks
        self.cache_workload = cache_workload
        self._clock = clock
        self._plan: RoutePlan | None = None
        self._time = 0.0
        self._refresh: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one rebuild at a time

    @property
    def plan(self) -> RoutePlan:
        """The plan in force (raises if the router is not open)."""
        if self._plan is None:
            raise ConfigurationError(NOT_OPEN)
        return self._plan

    async def open(self, http: HttpClient) -> None:
        """Build the first plan (on a catalog of our own over ``http`` if none was given)."""
        if self._endpoints is None and self.catalog is None:
            self.catalog = Catalog(ttl=self.ttl, http=http)
            self._own_catalog = True
        await self.rebuild()

    async def close(self) -> None:
        """Stop a rebuild under way and close our own catalog."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
            self._refresh = None
        if self._own_catalog and self.catalog is not None:
            await self.catalog.aclose()
            self.catalog = None
            self._own_catalog = False

    def expire(self) -> None:
        """Rebuild the plan at the next request (an endpoint's route turned out gone)."""
        self._time = -math.inf

    def current(self) -> RoutePlan:
        """The plan for a request now; starts a background rebuild when it is ``ttl`` old."""
        plan = self._plan
        if plan is None:
            raise ConfigurationError(NOT_OPEN)
        if (
            self._endpoints is None
            and self._clock() - self._time >= self.ttl
            and (self._refresh is None or self._refresh.done())
        ):
            self._refresh = asyncio.create_task(self._refresh_plan())
        return plan

    async def rebuild(self, policy: ProviderPolicy | None = None) -> None:
        """Build the plan from ``policy`` (default: the one in force) and install both
        together. One rebuild at a time: a refresh started while another rebuild runs
        waits for it, then reads the policy it left; and the policy is published only
        with its plan, so the two never disagree, whichever fails."""
        async with self._lock:
            if policy is None:
                policy = self.policy
            if self._endpoints is not None:
                listing = self._endpoints
            else:
                assert self.catalog is not None
                listing = await self.catalog.endpoints(self.model, refresh=self._plan is not None)
            decisions = policy.evaluate(listing, model_id=self.model)
            plan = build_route_plan(
                self.model,
                decisions,
                workload=self.workload,
                allow_fallbacks=self.allow_fallbacks,
                cache_workload=self.cache_workload,
                verified=policy.ranking_report(self.model),
            )
            self.policy, self._plan = policy, plan
            self._time = self._clock()
        log.info(
            "route.plan",
            model=self.model,
            order=list(plan.order),
            ignore=list(plan.ignore),
            max_price=plan.provider_object()["max_price"],
        )

    async def _refresh_plan(self) -> None:
        try:
            await self.rebuild()
        except Exception as exc:
            # Keep routing on the old plan; try again after another TTL.
            self._time = self._clock()
            log.warning("route.plan_refresh_failed", model=self.model, error=str(exc))
