"""The ``provider`` routing object, and the price ceilings a reservation assumes.

A :class:`RoutePlan` is computed once per catalog refresh from the policy's decisions
and the ranking, so the per-request path only picks a prebuilt dict: ``order`` (the
allowed endpoints' tags, best first, demoted providers last), ``only`` (exactly those
tags), ``ignore`` (the rejected ones), ``allow_fallbacks``, ``quantizations`` (belt and
braces against a tag re-quantized between refreshes) and ``max_price``: the highest
prices among the allowed endpoints, the very ceilings the ledger reservation is
computed from, so OpenRouter cannot serve a request at a price the reservation did not
cover. Tags, not base slugs: a base slug matches every endpoint of a provider,
including a rejected quantization.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Protocol

from provider_router._constants import PER_MILLION
from provider_router._exceptions import ConfigurationError
from provider_router._format import tidy
from provider_router.catalog._billable import (
    IMAGE_PROMPT_TOKENS_BOUND,
    measure_messages,
)
from provider_router.catalog.records import Endpoint, Pricing, Quantization
from provider_router.catalog.verdicts import VerificationReport
from provider_router.routing.endpoint_route import EndpointRoute, endpoint_routes
from provider_router.routing.policy import STANDARD_TIERS
from provider_router.routing.ranking import RankedEndpoint, Workload, rank

__all__ = ["RoutePlan", "build_route_plan", "cache_saving", "estimate_prompt_tokens"]

_ZERO: Final = Decimal(0)


class _Decision(Protocol):
    @property
    def endpoint(self) -> Endpoint: ...
    @property
    def allowed(self) -> bool: ...


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """An upper bound on the prompt tokens of ``messages``, without a tokenizer.

    Byte-level BPE tokenizers (Kimi's included) emit at least one byte per token,
    so the UTF-8 length of the text bounds its token count; each message adds
    :data:`~provider_router.catalog._billable.MESSAGE_OVERHEAD_TOKENS` of template, each image part
    :data:`~provider_router.catalog._billable.IMAGE_PROMPT_TOKENS_BOUND`. It overestimates
    ordinary text about fourfold, which only makes the prompt part of a
    reservation (small beside ``max_tokens`` of completion) safely large.

    Raises:
        ConfigurationError: a content part that cannot be priced (audio, file...).
    """
    return measure_messages(messages).estimate


# Ceilings include every override (long-context, time-of-day): a worst case must
# hold whichever price applies when the request runs.
def _prompt_ceiling(pricing: Pricing) -> Decimal:
    prices = [pricing.prompt, pricing.input_cache_write, pricing.input_cache_write_1h]
    for o in pricing.overrides:
        prices += [o.prompt, o.input_cache_write, o.input_cache_write_1h]
    return max(p for p in prices if p is not None)


def _completion_ceiling(pricing: Pricing) -> Decimal:
    prices = [pricing.completion, pricing.internal_reasoning]
    prices += [o.completion for o in pricing.overrides]
    return max(p for p in prices if p is not None)


def _quantizations(allowed: Iterable[Endpoint]) -> tuple[str, ...] | None:
    """The allowed endpoints' quantization values, as the request filter names them.

    ``None`` (send no filter) when one is a string the spec does not list: naming
    it would be refused, and leaving it out would exclude an allowed endpoint.
    """
    values: set[str] = set()
    for endpoint in allowed:
        quantization = endpoint.quantization
        if quantization is None:
            values.add(Quantization.UNKNOWN.value)  # OpenRouter files null under unknown
        elif quantization is Quantization.UNRECOGNIZED:
            return None
        else:
            values.add(quantization.value)
    return tuple(sorted(values))


def _standard_twins(allowed: Sequence[Endpoint], rejected: Sequence[Endpoint]) -> list[Endpoint]:
    """The standard endpoints of providers whose tier endpoint (flex...) is allowed.

    OpenRouter bills the tier that served, and a provider may serve a tier request on
    its standard tier (service-tiers guide): the ceilings, and so the reservation,
    cover that price too.
    """
    tiered = {e.provider_name for e in allowed if e.service_tier not in STANDARD_TIERS}
    if not tiered:
        return []
    return [
        e
        for e in rejected
        if e.provider_name in tiered
        and e.service_tier in STANDARD_TIERS
        and not e.pricing.is_dynamic
    ]


def _unpriceable_tiers(allowed: Sequence[Endpoint], rejected: Sequence[Endpoint]) -> list[Endpoint]:
    """Tier endpoints (flex...) whose provider's standard endpoint has dynamic pricing.

    A provider may serve a tier request on its standard tier and bill that tier
    (service-tiers guide); priced ``"-1"``, that bill has no ceiling, so the tier
    endpoint cannot be reserved for either (refuse what cannot be priced).
    """
    dynamic = {
        e.provider_name
        for e in (*allowed, *rejected)
        if e.service_tier in STANDARD_TIERS and e.pricing.is_dynamic
    }
    if not dynamic:
        return []
    return [
        e for e in allowed if e.service_tier not in STANDARD_TIERS and e.provider_name in dynamic
    ]


def _max_context(allowed: Iterable[Endpoint]) -> int | None:
    lengths = [e.context_length for e in allowed]
    if any(length is None or length <= 0 for length in lengths):
        return None
    return max(length for length in lengths if length is not None)


def _per_million(price: Decimal) -> str:
    return format(price * PER_MILLION, "f")


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """Where requests for one model may go, best first, and at what price ceilings.

    Attributes:
        model: the model id.
        ranked: the allowed endpoints, ranked for the workload.
        ignore: tags of the rejected endpoints.
        allowed_providers: display names of the allowed endpoints' providers: a
            response served by any other provider is a policy violation.
        ambiguous_providers: display names that have both allowed and rejected
            endpoints; a response names only the provider, so for these the
            check rests on ``only`` (tags) alone.
        max_prompt_price: highest prompt-side price per token (cache writes included).
        max_completion_price: highest completion (or reasoning) price per token.
        max_request_price: highest per-request fee.
        max_image_price: highest per-image fee.
        max_image_token_price: highest price of an image token (``image_token``,
            or the prompt ceiling when that is higher).
        allow_fallbacks: sent as ``provider.allow_fallbacks``.
        quantizations: sent as ``provider.quantizations`` (``None``: not sent).
        cache_ranked: the allowed endpoints ranked for the workload at its expected
            cache hit rate (``input_cache_read`` priced): the order a session is
            pinned by (:mod:`provider_router.client.affinity`); the plain ranking when
            the workload expects no hits.
        max_context_length: the largest ``context_length`` among the allowed
            endpoints (``None`` when one does not list it: no bound is known).
        routes: each allowed endpoint as a route of its own (its one-tag ``provider``
            object and its own ceilings), in rank order: what cost-first admission
            sends each attempt with.
        floor: the route with the lowest cost per request of the workload (rank
            breaks ties): the price every token is compared with ("the floor").
    """

    model: str
    ranked: tuple[RankedEndpoint, ...]
    ignore: tuple[str, ...]
    allowed_providers: frozenset[str]
    ambiguous_providers: frozenset[str]
    max_prompt_price: Decimal
    max_completion_price: Decimal
    max_request_price: Decimal
    max_image_price: Decimal = _ZERO
    max_image_token_price: Decimal = _ZERO
    allow_fallbacks: bool = True
    quantizations: tuple[str, ...] | None = None
    cache_ranked: tuple[RankedEndpoint, ...] = ()
    max_context_length: int | None = None
    routes: tuple[EndpointRoute, ...] = ()
    floor: EndpointRoute | None = None
    _pricing_by_provider: Mapping[str, tuple[Pricing, ...]] = field(default_factory=dict)
    _cache: dict[frozenset[str], dict[str, Any]] = field(default_factory=dict)
    _pinned: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The whole plan (every endpoint's listing and pricing) is ~10 kB: say what it is.
        return (
            f"RoutePlan(model={self.model!r}, order={list(self.order)!r}, "
            f"ignored={len(self.ignore)}, max_price_per_M=(prompt "
            f"${tidy(self.max_prompt_price * PER_MILLION)}, completion "
            f"${tidy(self.max_completion_price * PER_MILLION)}), "
            f"allow_fallbacks={self.allow_fallbacks})"
        )

    @property
    def order(self) -> tuple[str, ...]:
        """Allowed tags, best rank first (before demotion)."""
        return tuple(r.endpoint.slug for r in self.ranked)

    def provider_object(self, demoted: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The request's ``provider`` object; providers in ``demoted`` go last.

        The dict is cached per demoted set and shared between requests: callers
        must not mutate it.
        """
        cached = self._cache.get(demoted)
        if cached is not None:
            return cached
        healthy = [r.endpoint.slug for r in self.ranked if r.endpoint.provider_name not in demoted]
        sick = [r.endpoint.slug for r in self.ranked if r.endpoint.provider_name in demoted]
        order = healthy + sick
        obj: dict[str, Any] = {
            "order": order,
            "only": list(self.order),
            "allow_fallbacks": self.allow_fallbacks,
            "max_price": {
                "prompt": _per_million(self.max_prompt_price),
                "completion": _per_million(self.max_completion_price),
                "request": format(self.max_request_price, "f"),
                "image": format(self.max_image_price, "f"),
            },
        }
        if self.ignore:
            obj["ignore"] = list(self.ignore)
        if self.quantizations is not None:
            obj["quantizations"] = list(self.quantizations)
        if len(self._cache) < 64:
            self._cache[demoted] = obj
        return obj

    def pinned_object(self, tag: str, *, fallbacks: bool = False) -> dict[str, Any]:
        """The ``provider`` object that pins a request to one allowed endpoint ``tag``.

        ``only`` names that one tag and there is no ``order``: OpenRouter's
        prompt-cache sticky routing is off whenever ``order`` is set (its
        prompt-caching guide), and a one-tag ``only`` leaves it nothing else to
        choose. The price ceilings, ``ignore`` and ``quantizations`` are the
        plan's, so the reservation covers the request as before. Cached per tag
        and shared: callers must not mutate it.

        With ``fallbacks`` the object is instead ``order: [tag]`` with the plan's
        whole ``only``: the pin is tried first on every request, and a 429 or an
        error there falls back inside OpenRouter to the other allowed endpoints (that
        one request misses the cache; the session stays pinned). The pin itself is
        the stickiness then (OpenRouter's own is off with an ``order``).
        """
        key = f"{tag}\x00fallbacks" if fallbacks else tag
        cached = self._pinned.get(key)
        if cached is not None:
            return cached
        if tag not in self.order:
            raise ValueError(f"{tag!r} is not an allowed endpoint of {self.model!r}")
        obj = {k: v for k, v in self.provider_object().items() if k != "order"}
        if fallbacks:
            obj = {"order": [tag], **obj}
        else:
            obj["only"] = [tag]
        self._pinned[key] = obj
        return obj

    def route(self, tag: str) -> EndpointRoute:
        """The route of the allowed endpoint ``tag``.

        Raises:
            KeyError: ``tag`` is not an allowed endpoint of this plan.
        """
        for route in self.routes:
            if route.tag == tag:
                return route
        raise KeyError(tag)

    def floor_cost(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> Decimal | None:
        """What these tokens cost at the floor's prices (USD, exact; ``None`` without
        a floor or for inconsistent counts): what an answer is compared with."""
        floor = self.floor
        if floor is None:
            return None
        try:
            return floor.endpoint.pricing.cost(
                prompt_tokens,
                completion_tokens,
                cached_tokens=cached_tokens,
                cache_write_tokens=cache_write_tokens,
            )
        except ValueError:
            return None

    def worst_case(self, prompt_tokens: int, max_tokens: int, images: int = 0) -> Decimal:
        """The most a request can cost on any allowed endpoint (USD, exact).

        ``prompt_tokens`` bounds the text prompt; each of ``images`` adds
        :data:`~provider_router.catalog._billable.IMAGE_PROMPT_TOKENS_BOUND` tokens at the
        dearer of the prompt and image-token prices, and the per-image fee.
        """
        worst = (
            prompt_tokens * self.max_prompt_price
            + max_tokens * self.max_completion_price
            + self.max_request_price
        )
        if images:
            token_price = max(self.max_prompt_price, self.max_image_token_price)
            worst += images * (IMAGE_PROMPT_TOKENS_BOUND * token_price + self.max_image_price)
        return worst

    def estimate(
        self,
        provider: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> Decimal | None:
        """Our own price of a finished request, from the serving provider's listing.

        ``None`` when the provider is not one of the allowed ones or the counts
        are inconsistent. A provider with several allowed endpoints is priced at
        the dearest (a response does not say which endpoint served it).
        """
        pricings = self._pricing_by_provider.get(provider) if provider else None
        if not pricings:
            return None
        try:
            if len(pricings) == 1:
                # The common case (one endpoint per provider): no generator, no max().
                return pricings[0].cost(
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens=cached_tokens,
                    cache_write_tokens=cache_write_tokens,
                )
            return _dearest(
                pricings, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens
            )
        except ValueError:
            return None


def cache_saving(
    plan: RoutePlan, provider: str | None, prompt_tokens: int, cached_tokens: int
) -> Decimal:
    """What reading ``cached_tokens`` from cache saved on ``provider`` (USD, exact).

    The prompt side priced without the cache, less the same priced with it, from the
    serving provider's listing; 0 when nothing was read or it cannot be priced
    (what OpenRouter's ``/generation.cache_discount`` reports, computed here).
    """
    if not cached_tokens:
        return _ZERO
    pricings = plan._pricing_by_provider.get(provider) if provider else None
    if not pricings:
        return _ZERO
    # Each endpoint's own full price less its own cache-read price, the smallest when
    # the provider has several (a response does not say which served): the dearest
    # full price less the dearest read would mix two listings.
    try:
        return min(
            p.cost(prompt_tokens, 0) - p.cost(prompt_tokens, 0, cached_tokens=cached_tokens)
            for p in pricings
        )
    except ValueError:
        return _ZERO


def _dearest(
    pricings: Sequence[Pricing],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    cache_write_tokens: int,
) -> Decimal:
    """The highest of the pricings' costs for these counts.

    A function of its own: the generator in it makes its arguments cells, and in
    :meth:`RoutePlan.estimate` they would be cells on every request, one endpoint or
    several (docs/performance.md).
    """
    return max(
        p.cost(
            prompt_tokens,
            completion_tokens,
            cached_tokens=cached_tokens,
            cache_write_tokens=cache_write_tokens,
        )
        for p in pricings
    )


def build_route_plan(
    model: str,
    decisions: Iterable[_Decision],
    *,
    workload: Workload,
    allow_fallbacks: bool = True,
    cache_workload: Workload | None = None,
    verified: VerificationReport | None = None,
) -> RoutePlan:
    """Rank the allowed endpoints and fix the routing object and price ceilings.

    ``cache_workload`` (the workload at its expected cache hit rate) ranks
    :attr:`RoutePlan.cache_ranked`; without it that is the plain ranking. With
    ``verified`` both rank by cost per accepted sample
    (:meth:`ProviderPolicy.ranking_report`).

    Endpoints with dynamic pricing (``"-1"``) are treated as rejected: a request
    routed to them could not be reserved for.

    Raises:
        ConfigurationError: the policy allows no priced endpoint of ``model``.
    """
    allowed: list[Endpoint] = []
    rejected: list[Endpoint] = []
    for decision in decisions:
        endpoint = decision.endpoint
        if decision.allowed and not endpoint.pricing.is_dynamic:
            allowed.append(endpoint)
        else:
            rejected.append(endpoint)
    unpriceable = _unpriceable_tiers(allowed, rejected)
    if unpriceable:
        allowed = [e for e in allowed if e not in unpriceable]
        rejected.extend(unpriceable)
    if not allowed:
        raise ConfigurationError(
            f"the policy allows no endpoint of {model!r} "
            f"({len(rejected)} rejected); nothing can be routed"
        )
    ranked = tuple(rank(allowed, workload=workload, verified=verified))
    priced = allowed + _standard_twins(allowed, rejected)
    cache_ranked = (
        ranked
        if cache_workload is None or cache_workload == workload
        else tuple(rank(allowed, workload=cache_workload, verified=verified))
    )
    allowed_tags = {e.slug for e in allowed}
    ignore = tuple(sorted({e.slug for e in rejected} - allowed_tags))
    allowed_names = frozenset(e.provider_name for e in allowed)
    rejected_names = frozenset(e.provider_name for e in rejected)
    pricing_by_provider: dict[str, list[Pricing]] = {}
    for endpoint in allowed:
        pricing_by_provider.setdefault(endpoint.provider_name, []).append(endpoint.pricing)
    quantizations = _quantizations(allowed)
    routes = endpoint_routes(
        [(r.rank, r.endpoint, r.cost_per_request) for r in ranked],
        priced[len(allowed) :],
        ignore=ignore,
        quantizations=quantizations,
    )
    floor = min(routes, key=lambda r: (r.cost_per_request, r.rank))
    return RoutePlan(
        model=model,
        ranked=ranked,
        ignore=ignore,
        allowed_providers=allowed_names,
        ambiguous_providers=allowed_names & rejected_names,
        max_prompt_price=max(_prompt_ceiling(e.pricing) for e in priced),
        max_completion_price=max(_completion_ceiling(e.pricing) for e in priced),
        max_request_price=max((e.pricing.request or _ZERO) for e in priced),
        max_image_price=max((e.pricing.image or _ZERO) for e in priced),
        max_image_token_price=max((e.pricing.image_token or _ZERO) for e in priced),
        allow_fallbacks=allow_fallbacks,
        quantizations=quantizations,
        cache_ranked=cache_ranked,
        max_context_length=_max_context(allowed),
        routes=routes,
        floor=floor,
        _pricing_by_provider={k: tuple(v) for k, v in pricing_by_provider.items()},
    )
