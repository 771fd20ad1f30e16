"""One allowed endpoint as a route of its own: its ``provider`` object and price ceilings.

Cost-first admission (:mod:`provider_router.client.admission`) sends each attempt to
exactly one endpoint it chose: a one-tag ``only`` with ``allow_fallbacks: false``, so
OpenRouter answers that endpoint's refusal to us instead of spilling the request to a
dearer endpoint we did not choose. ``max_price`` and the reservation are then that
endpoint's own ceilings, not the dearest allowed endpoint's. There is no ``order``:
OpenRouter's prompt-cache sticky routing stays on. Pure: built with the route plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from provider_router._constants import PER_MILLION
from provider_router.catalog._billable import IMAGE_PROMPT_TOKENS_BOUND
from provider_router.catalog.records import Endpoint, Pricing
from provider_router.routing.policy import STANDARD_TIERS

__all__ = ["EndpointRoute", "endpoint_routes"]

_ZERO: Final = Decimal(0)


@dataclass(frozen=True, slots=True)
class EndpointRoute:
    """An allowed endpoint, routed to alone.

    Attributes:
        tag: the endpoint's tag (what ``only`` names).
        provider_name: its provider's display name (what an answer names).
        rank: its place in the plan's ranking (1 for the best).
        endpoint: the listing's record.
        cost_per_request: USD of one request of the plan's workload here.
        prompt_price: its prompt-side ceiling per token (cache writes and overrides).
        completion_price: its completion (or reasoning) ceiling per token.
        request_price: its per-request fee.
        image_price: its per-image fee.
        image_token_price: its image-token price (or its prompt ceiling when higher).
        object: the request's ``provider`` object for this endpoint alone (shared:
            callers must not mutate it).
    """

    tag: str
    provider_name: str
    rank: int
    endpoint: Endpoint
    cost_per_request: Decimal
    prompt_price: Decimal
    completion_price: Decimal
    request_price: Decimal
    image_price: Decimal
    image_token_price: Decimal
    object: Mapping[str, Any]

    def __repr__(self) -> str:
        return (
            f"EndpointRoute({self.tag!r}, rank={self.rank}, per_request=${self.cost_per_request})"
        )

    @property
    def pricing(self) -> Pricing:
        """The endpoint's listed pricing."""
        return self.endpoint.pricing

    def worst_case(self, prompt_tokens: int, max_tokens: int, images: int = 0) -> Decimal:
        """The most a request can cost here (USD, exact): the plan's formula
        (:meth:`RoutePlan.worst_case <provider_router.RoutePlan.worst_case>`) at this
        endpoint's own ceilings."""
        worst = (
            prompt_tokens * self.prompt_price
            + max_tokens * self.completion_price
            + self.request_price
        )
        if images:
            token_price = max(self.prompt_price, self.image_token_price)
            worst += images * (IMAGE_PROMPT_TOKENS_BOUND * token_price + self.image_price)
        return worst

    def fits(self, needs: Collection[str], min_context: int) -> bool:
        """Whether a request needing ``needs`` (``tools``, ``response_format``) and a
        context of ``min_context`` tokens can be sent here: a one-tag ``only`` has no
        fallback, and an endpoint without tools answers in plain text (paid)."""
        endpoint = self.endpoint
        if any(need not in endpoint.supported_parameters for need in needs):
            return False
        length = endpoint.context_length
        return length is None or length <= 0 or length >= min_context


def _prompt_ceiling(pricings: Sequence[Pricing]) -> Decimal:
    prices: list[Decimal | None] = []
    for pricing in pricings:
        prices += [pricing.prompt, pricing.input_cache_write, pricing.input_cache_write_1h]
        for o in pricing.overrides:
            prices += [o.prompt, o.input_cache_write, o.input_cache_write_1h]
    return max(p for p in prices if p is not None)


def _completion_ceiling(pricings: Sequence[Pricing]) -> Decimal:
    prices: list[Decimal | None] = []
    for pricing in pricings:
        prices += [pricing.completion, pricing.internal_reasoning]
        prices += [o.completion for o in pricing.overrides]
    return max(p for p in prices if p is not None)


def _per_million(price: Decimal) -> str:
    return format(price * PER_MILLION, "f")


def endpoint_routes(
    ranked: Sequence[tuple[int, Endpoint, Decimal]],
    twins: Sequence[Endpoint],
    *,
    ignore: Sequence[str],
    quantizations: Sequence[str] | None,
) -> tuple[EndpointRoute, ...]:
    """One route per allowed endpoint, in rank order.

    Args:
        ranked: ``(rank, endpoint, cost per request)`` of each allowed endpoint.
        twins: standard endpoints of providers whose tier endpoint (flex...) is
            allowed: a provider may serve a tier request on its standard tier and
            bill that, so a tier endpoint's ceilings cover its twin's prices too.
        ignore: the plan's ``ignore`` (rejected tags), sent as is.
        quantizations: the plan's ``quantizations`` filter (``None``: not sent).
    """
    routes = []
    for rank, endpoint, cost in ranked:
        priced = [endpoint.pricing]
        if endpoint.service_tier not in STANDARD_TIERS:
            priced += [t.pricing for t in twins if t.provider_name == endpoint.provider_name]
        prompt = _prompt_ceiling(priced)
        completion = _completion_ceiling(priced)
        request = max((p.request or _ZERO) for p in priced)
        image = max((p.image or _ZERO) for p in priced)
        image_token = max((p.image_token or _ZERO) for p in priced)
        obj: dict[str, Any] = {
            "only": [endpoint.slug],
            "allow_fallbacks": False,
            "max_price": {
                "prompt": _per_million(prompt),
                "completion": _per_million(completion),
                "request": format(request, "f"),
                "image": format(image, "f"),
            },
        }
        if ignore:
            obj["ignore"] = list(ignore)
        if quantizations is not None:
            obj["quantizations"] = list(quantizations)
        routes.append(
            EndpointRoute(
                tag=endpoint.slug,
                provider_name=endpoint.provider_name,
                rank=rank,
                endpoint=endpoint,
                cost_per_request=cost,
                prompt_price=prompt,
                completion_price=completion,
                request_price=request,
                image_price=image,
                image_token_price=image_token,
                object=obj,
            )
        )
    return tuple(routes)
