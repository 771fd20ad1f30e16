"""Batch API endpoints under the same policy: which ``:batch`` endpoint may serve a batch.

OpenRouter lists a model's batch endpoints on their own, with their own prices, judged
by the same :class:`~provider_router.routing.policy.ProviderPolicy`. A batch runs on
*one* provider, and the Batch API honours only ``provider.only`` (no ``quantizations``
filter), so the pin keeps a rejected endpoint out: a provider with any batch endpoint
the policy rejects is never pinned. :func:`batch_route` pins the cheapest allowed one
alone, so the budget reserves at the price the batch is billed at;
:attr:`BatchRoute.allowed_providers` is what a result line's served provider is checked
against. :func:`price_against_sync` sets its price beside the live sync listing's (a
promotion on the sync side can make sync the cheaper route).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from provider_router._exceptions import ConfigurationError
from provider_router.catalog.records import Endpoint, ModelEndpoints
from provider_router.routing.policy import Decision, Decisions, ProviderPolicy
from provider_router.routing.ranking import Workload, rank

__all__ = [
    "BATCH_SUFFIX",
    "BatchRoute",
    "PriceCheck",
    "batch_listing_id",
    "batch_route",
    "price_against_sync",
]

BATCH_SUFFIX: Final = ":batch"


def batch_listing_id(model_id: str) -> str:
    """``author/slug:batch``: the id whose endpoints listing is the Batch API's."""
    base = base_model_id(model_id)
    return f"{base}{BATCH_SUFFIX}"


def base_model_id(model_id: str) -> str:
    """The model id without a ``:batch`` suffix."""
    model_id = model_id.strip()
    return model_id[: -len(BATCH_SUFFIX)] if model_id.endswith(BATCH_SUFFIX) else model_id


@dataclass(frozen=True, slots=True)
class BatchRoute:
    """Where a batch of ``model_id`` may run, and why.

    Attributes:
        model_id: the base model id (what a submit sends as ``model``).
        decisions: the policy's verdict on every ``:batch`` endpoint.
        endpoint: the chosen endpoint (the cheapest allowed one for the workload),
            or None when no batch endpoint may serve the model.
        reason: one plain sentence: why this endpoint, or why none.
        unpinnable: allowed endpoints left out because their provider also lists a
            rejected variant that a provider pin could not exclude.
    """

    model_id: str
    decisions: Decisions
    endpoint: Endpoint | None
    reason: str
    unpinnable: tuple[Endpoint, ...] = ()

    @property
    def available(self) -> bool:
        return self.endpoint is not None

    @property
    def allowed_providers(self) -> frozenset[str]:
        """Provider names (lower case) whose answers the policy accepts in a batch: the
        allowed batch endpoints a pin keeps alone (a provider that also lists a rejected
        variant is not one: a line's provider name cannot tell the variants apart)."""
        return frozenset(e.provider_name.lower() for e in _pinnable(self.decisions)[0])

    def unallowed(self, provider: object) -> str | None:
        """Why a line served by ``provider`` is quarantined (None: allowed, or not named:
        unknown is kept, as on the sync route)."""
        if not isinstance(provider, str) or not provider:
            return None
        allowed = self.allowed_providers
        if provider.lower() in allowed:
            return None
        return (
            f"served by {provider[:80]!r}, not one of the allowed providers "
            f"({', '.join(sorted(allowed)) or 'none'})"
        )

    @property
    def only(self) -> tuple[str, ...]:
        """The ``provider.only`` pin (empty when no endpoint is available)."""
        return () if self.endpoint is None else (self.endpoint.provider_slug,)

    def provider_object(self) -> dict[str, Any]:
        """The submit body's ``provider``: the pin alone, no fallback.

        Raises:
            ConfigurationError: no batch endpoint may serve the model (``reason`` says why).
        """
        if self.endpoint is None:
            raise ConfigurationError(self.reason)
        return {"only": list(self.only), "allow_fallbacks": False}

    def prices(self) -> tuple[Decimal, Decimal]:
        """(prompt, completion) USD per token of the chosen endpoint.

        Raises:
            ConfigurationError: no batch endpoint is available.
        """
        if self.endpoint is None:
            raise ConfigurationError(self.reason)
        pricing = self.endpoint.pricing
        if pricing.prompt is None or pricing.completion is None:
            raise ConfigurationError(f"batch endpoint {self.endpoint.slug!r} has no fixed price")
        return pricing.prompt, pricing.completion


def _pinnable(decisions: Sequence[Decision]) -> tuple[list[Endpoint], list[Endpoint]]:
    """(allowed endpoints a provider pin keeps alone, allowed ones it could not)."""
    tainted = {d.endpoint.provider_slug.lower() for d in decisions if not d.allowed}
    keep: list[Endpoint] = []
    left_out: list[Endpoint] = []
    for decision in decisions:
        if decision.allowed:
            target = left_out if decision.endpoint.provider_slug.lower() in tainted else keep
            target.append(decision.endpoint)
    return keep, left_out


def batch_route(
    listing: ModelEndpoints,
    policy: ProviderPolicy,
    workload: Workload,
    *,
    model_id: str | None = None,
) -> BatchRoute:
    """Judge a ``:batch`` listing by ``policy`` and choose the endpoint to pin.

    Args:
        listing: the ``:batch`` endpoints listing (``Catalog.batch_endpoints``).
        policy: the same policy the sync route uses.
        workload: the request shape the endpoints are ranked by (their own prices).
        model_id: the base model id (default: the listing's id without ``:batch``).
    """
    base = base_model_id(model_id or listing.id)
    decisions = policy.evaluate(listing.endpoints, model_id=base)
    if not listing.endpoints:
        return BatchRoute(
            base, decisions, None, f"{base} has no Batch API endpoint; only the sync route"
        )
    keep, left_out = _pinnable(decisions)
    if not keep:
        if left_out:
            names = ", ".join(sorted({e.provider_slug for e in left_out}))
            why = (
                f"no batch endpoint of {base} can be pinned safely: {names} also list a variant "
                "the policy rejects, and the Batch API has no quantization filter"
            )
        else:
            why = f"the policy rejects every batch endpoint of {base}: " + "; ".join(
                f"{d.endpoint.slug}: {d.reason}" for d in decisions.rejected
            )
        return BatchRoute(base, decisions, None, why, tuple(left_out))
    best = rank(keep, workload=workload)[0].endpoint
    why = f"{best.provider_name} ({best.slug}), the cheapest batch endpoint the policy allows"
    return BatchRoute(base, decisions, best, why, tuple(left_out))


@dataclass(frozen=True, slots=True)
class PriceCheck:
    """The pinned ``:batch`` endpoint's price beside the cheapest allowed sync endpoint's,
    per request of one workload (USD)."""

    batch: Decimal
    sync: Decimal | None
    """None: no sync endpoint the policy allows has a fixed price."""
    sync_endpoint: Endpoint | None = None

    @property
    def sync_cheaper(self) -> bool:
        return self.sync is not None and self.sync < self.batch

    def sentence(self, dataset: str, asked: str) -> str:
        """One sentence: which route the dataset takes on price, and why."""
        assert self.sync is not None
        assert self.sync_endpoint is not None
        prices = (
            f"{self.sync_endpoint.provider_name}'s sync price (${self.sync:.6g} a request) is "
            f"below the :batch price (${self.batch:.6g})"
        )
        if asked == "batch":
            return f"dataset {dataset!r} keeps route batch as asked, though {prices}"
        return f"dataset {dataset!r} goes sync: {prices}, a promotion on the sync side"


def price_against_sync(
    route: BatchRoute,
    sync_listing: ModelEndpoints,
    policy: ProviderPolicy,
    workload: Workload,
) -> PriceCheck:
    """The pinned batch endpoint's cost of ``workload`` and the cheapest allowed sync
    endpoint's (at the listing's live prices).

    Raises:
        ConfigurationError: no batch endpoint is pinned, or it has no fixed price.
    """
    route.prices()  # refuses what has no pin or no fixed price
    assert route.endpoint is not None
    tokens = (workload.prompt_tokens, workload.completion_tokens + workload.reasoning_tokens)
    batch = route.endpoint.pricing.cost(*tokens)
    decisions = policy.evaluate(sync_listing.endpoints, model_id=route.model_id)
    priced = [
        (e.pricing.cost(*tokens), e.slug, e)
        for e in decisions.allowed
        if e.pricing.prompt is not None and e.pricing.completion is not None
    ]
    if not priced:
        return PriceCheck(batch, None)
    cost, _, endpoint = min(priced, key=lambda item: (item[0], item[1]))
    return PriceCheck(batch, cost, endpoint)
