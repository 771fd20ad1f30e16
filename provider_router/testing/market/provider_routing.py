"""OpenRouter's provider routing, re-implemented from its documentation.

Given a model and the request's ``provider`` object, decide which endpoints to try and
in what order (docs/simulator.md, "Routing"): ``only`` / ``ignore`` / ``order`` match
an endpoint by tag, base slug or display name; ``quantizations``, ``max_price`` and
``require_parameters`` filter (nothing left: 404); ``sort`` orders by price,
throughput or latency (load balancing off: no breaker), else the first endpoint is
drawn among the stable ones weighted by its traffic share (:func:`traffic_weights`) and
the rest follow by price, unstable ones last; ``order`` goes first, and
``allow_fallbacks: false`` tries only those.
Service-tier endpoints serve only when asked for, by tag or by the request's
``service_tier``. Billing follows the endpoint that served.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from provider_router._money import to_decimal
from provider_router.testing.market.listing import EndpointSpec, ModelSpec

__all__ = ["Preferences", "RoutingError", "parse_preferences", "plan_route"]

_PREFERENCE_KEYS = frozenset(
    [
        "order",
        "only",
        "ignore",
        "allow_fallbacks",
        "require_parameters",
        "data_collection",
        "zdr",
        "enforce_distillable_text",
        "quantizations",
        "sort",
        "preferred_min_throughput",
        "preferred_max_latency",
        "max_price",
    ]
)
_SORTS = frozenset(["price", "throughput", "latency", "exacto"])
_QUANT_FAMILIES = {"fp4": ("fp4", "mxfp4", "nvfp4"), "fp8": ("fp8", "mxfp8")}
_MAX_PRICE_KEYS = frozenset(["prompt", "completion", "request", "image", "audio"])

# Request fields that count as "parameters" for require_parameters (OAS#Parameter).
REQUEST_PARAMETERS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "top_a",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "max_tokens",
    "max_completion_tokens",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "response_format",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "include_reasoning",
    "reasoning",
    "reasoning_effort",
    "verbosity",
)
_SOFT_PARAMETERS = ("tools", "response_format", "structured_outputs", "verbosity")
_SOFT_SET = frozenset(_SOFT_PARAMETERS)
_NO_PROVIDERS = "No allowed providers are available for the selected model."
DOCS_URL = "https://openrouter.ai/docs/guides/routing/provider-selection"


class RoutingError(Exception):
    """The request cannot be routed: carries the HTTP status and OpenRouter's wording."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        excluded_by: Sequence[str] = (),
        model: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.excluded_by = tuple(excluded_by)
        self.model = model


@dataclass(frozen=True, slots=True)
class Preferences:
    """A validated ``provider`` object."""

    order: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    allow_fallbacks: bool = True
    require_parameters: bool = False
    quantizations: tuple[str, ...] | None = None
    sort: str | None = None
    max_prompt: Decimal | None = None
    max_completion: Decimal | None = None
    max_request: Decimal | None = None
    max_image: Decimal | None = None
    min_throughput: float | None = None
    max_latency_s: float | None = None
    enforce_distillable_text: bool = False


def _bad(message: str) -> RoutingError:
    return RoutingError(400, f"Invalid provider preferences: {message}")


def _names(obj: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _bad(f"provider.{key}: expected an array of provider slugs")
    return tuple(v.lower() for v in value)


def _flag(obj: Mapping[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"provider.{key}: expected a boolean, got {value!r}")
    return value


def _percentile(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("p50")
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"provider.{key}: expected a number or a percentile object")
    return float(value)


def _max_price(obj: Mapping[str, Any]) -> dict[str, Decimal]:
    value = obj.get("max_price")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad("provider.max_price: expected an object")
    result: dict[str, Decimal] = {}
    for key, amount in value.items():
        if key not in _MAX_PRICE_KEYS:
            raise _bad(f"provider.max_price: unknown key {key!r}")
        try:
            result[key] = to_decimal(amount, what=f"provider.max_price.{key}")
        except ValueError as exc:
            raise _bad(str(exc)) from None
        if result[key] < 0:
            raise _bad(f"provider.max_price.{key}: must not be negative")
    return result


def parse_preferences(obj: object) -> Preferences | None:
    """Validate a request's ``provider`` object; None when it is absent.

    Raises:
        RoutingError: 400 naming the offending field.
    """
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise _bad("provider: expected an object")
    for key in obj:
        if key not in _PREFERENCE_KEYS:
            raise _bad(f"provider: unrecognized key {key!r}")
    sort = obj.get("sort")
    if isinstance(sort, Mapping):
        sort = sort.get("by")
    if sort is not None and sort not in _SORTS:
        raise _bad(f"provider.sort: expected one of {sorted(_SORTS)}, got {sort!r}")
    quantizations = _names(obj, "quantizations")
    prices = _max_price(obj)
    return Preferences(
        order=_names(obj, "order") or (),
        only=_names(obj, "only"),
        ignore=_names(obj, "ignore") or (),
        allow_fallbacks=_flag(obj, "allow_fallbacks", True),
        require_parameters=_flag(obj, "require_parameters", False),
        quantizations=quantizations,
        sort=sort,
        max_prompt=prices.get("prompt"),
        max_completion=prices.get("completion"),
        max_request=prices.get("request"),
        max_image=prices.get("image"),
        min_throughput=_percentile(obj, "preferred_min_throughput"),
        max_latency_s=_percentile(obj, "preferred_max_latency"),
        enforce_distillable_text=_flag(obj, "enforce_distillable_text", False),
    )


TIERS = frozenset(["flex", "priority"])
"""The ``service_tier`` values of tier endpoints (the standard one is null or default)."""


def is_tier(endpoint: EndpointSpec) -> bool:
    """Whether ``endpoint`` is a service-tier endpoint (served only when asked for)."""
    return endpoint.service_tier in TIERS


def matches(item: str, endpoint: EndpointSpec) -> bool:
    """Whether an order/only/ignore item (lower-cased) names this endpoint.

    A tier endpoint answers only to its own tag (not to its provider's base slug).
    """
    if item == endpoint.tag:
        return True
    if endpoint.service_tier in TIERS:
        return False
    return item == endpoint.slug or item == endpoint.provider_name.lower()


def tier_candidates(
    endpoints: Sequence[EndpointSpec],
    prefs: Preferences | None,
    requested: str | None,
    model: ModelSpec,
    admit: str | None = None,
) -> list[EndpointSpec]:
    """The endpoints a request may use, given its ``service_tier`` and named tags.

    Raises:
        RoutingError: 404 when ``flex`` is asked for and the model has none.
    """
    named: set[str] = set()
    if prefs is not None:
        named = {*(prefs.only or ()), *prefs.order}
    if requested == "flex":
        flex = [e for e in endpoints if e.service_tier == "flex"]
        if not flex:
            raise RoutingError(404, _NO_PROVIDERS, excluded_by=["service_tier"], model=model.id)
        return flex
    chosen = [
        e
        for e in endpoints
        if e.service_tier not in TIERS or e.tag in named or e.service_tier in (requested, admit)
    ]
    return chosen


def _any_match(items: Iterable[str], endpoint: EndpointSpec) -> bool:
    return any(matches(item, endpoint) for item in items)


def _quantization_ok(allowed: tuple[str, ...], endpoint: EndpointSpec) -> bool:
    quant = endpoint.quantization or "unknown"
    return any(quant in _QUANT_FAMILIES.get(q, (q,)) for q in allowed)


def _price_key(endpoint: EndpointSpec) -> tuple[Decimal, str]:
    return (endpoint.blended_price, endpoint.tag)


# --- default routing: traffic shares (guides/providers/traffic-routing) ------------------
# Money is not involved in the shares, so floats are fine here.
ASSUMED_CACHE_SHARE = 0.5
"""The prompt share an endpoint with cheaper cache reads is assumed to read from cache
(its "real cache hit rate", which only OpenRouter measures: an assumption)."""
COMPETITIVE_EDGE = 1.25
"""Endpoints whose adjusted cost per unit of speed is within this factor of the best
are "competitive"; past it the share drops off fast (assumption on the curve)."""
EXPLORATION_SHARE = 0.01
"""The least share of traffic any stable endpoint keeps ("so routing can see when it
improves")."""


def _adjusted_value(endpoint: EndpointSpec) -> float:
    """Adjusted price (cache-adjusted, TTFT- and reliability-weighted) per unit of speed."""
    prompt = float(endpoint.prompt)
    if endpoint.cache_read_units is not None and endpoint.cache_read_units < endpoint.prompt_units:
        read = float(endpoint.input_cache_read or 0)
        prompt = prompt * (1 - ASSUMED_CACHE_SHARE) + read * ASSUMED_CACHE_SHARE
    price = max(prompt + float(endpoint.completion), 1e-9)
    reliability = max(min(endpoint.uptime_last_30m or 95.0, 100.0), 1.0) / 100
    ttft = 1 + endpoint.latency_ms / 10_000  # a 1 s TTFT costs 10 %
    speed = math.sqrt(max(float(endpoint.throughput), 1.0))  # faster carries a higher price
    return price * ttft / reliability / speed


def traffic_weights(stable: Sequence[EndpointSpec]) -> list[float]:
    """Each stable endpoint's share of default traffic, as the traffic-routing guide
    describes it: adjusted price and speed place an endpoint inside or past the
    competitive edge; inside, shares fall gently (the inverse square of the ratio to
    the best), past it steeply (eighth power), never below :data:`EXPLORATION_SHARE`."""
    if not stable:
        return []
    values = [_adjusted_value(e) for e in stable]
    best = min(values)
    raw = []
    for value in values:
        ratio = value / best
        raw.append(ratio**-2 if ratio <= COMPETITIVE_EDGE else COMPETITIVE_EDGE**6 * ratio**-8)
    total = sum(raw)
    floor = EXPLORATION_SHARE * total
    return [max(w, floor) for w in raw]


def _weighted_first(stable: list[EndpointSpec], rng: random.Random) -> int:
    weights = traffic_weights(stable)
    cumulative: list[float] = []
    total = 0.0
    for weight in weights:
        total += weight
        cumulative.append(total)
    return min(bisect.bisect_right(cumulative, rng.random() * total), len(stable) - 1)


class _DefaultRoute:
    """The default order of one model's endpoints, precomputed: stable endpoints by
    price with their cumulative traffic-share weights, then the unstable ones."""

    __slots__ = ("cumulative", "model", "orders", "stable", "total", "unstable")

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self.stable = sorted((e for e in model.endpoints if e.status >= 0), key=_price_key)
        self.unstable = sorted(
            (e for e in model.endpoints if e.status < 0),
            key=lambda e: (-e.status, *_price_key(e)),
        )
        self.cumulative: list[float] = []
        total = 0.0
        for weight in traffic_weights(self.stable):
            total += weight
            self.cumulative.append(total)
        self.total = total
        # One order per possible first endpoint, built once (shared: never mutated).
        stable, unstable = self.stable, self.unstable
        self.orders = [
            (stable[i], *stable[:i], *stable[i + 1 :], *unstable) for i in range(len(stable))
        ]

    def order(self, rng: random.Random) -> Sequence[EndpointSpec]:
        if not self.stable:
            return tuple(self.unstable)
        index = bisect.bisect_right(self.cumulative, rng.random() * self.total)
        return self.orders[min(index, len(self.orders) - 1)]


_DEFAULT_ROUTES: dict[int, _DefaultRoute] = {}


def _default_route(model: ModelSpec) -> _DefaultRoute:
    route = _DEFAULT_ROUTES.get(id(model))
    if route is None or route.model is not model:
        route = _DEFAULT_ROUTES[id(model)] = _DefaultRoute(model)
    return route


def _default_order(
    endpoints: list[EndpointSpec], rng: random.Random, unstable_tags: frozenset[str] | set[str]
) -> list[EndpointSpec]:
    stable = sorted(
        (e for e in endpoints if e.status >= 0 and e.tag not in unstable_tags), key=_price_key
    )
    unstable = sorted(
        (e for e in endpoints if e.status < 0 or e.tag in unstable_tags),
        key=lambda e: (-e.status if e.status < 0 else 0, *_price_key(e)),
    )
    if stable:
        first = stable.pop(_weighted_first(stable, rng))
        stable.insert(0, first)
    return stable + unstable


def _sorted(endpoints: list[EndpointSpec], sort: str) -> list[EndpointSpec]:
    # A sort disables load balancing and "the router will try providers in order"
    # (provider-selection guide): no 30-second breaker reorders them. An endpoint whose
    # listed status is degraded or down still goes last (an assumption: the status is
    # the listing's, not load balancing's).
    if sort == "price":
        return sorted(endpoints, key=lambda e: (e.status < 0, *_price_key(e)))
    if sort == "latency":
        return sorted(endpoints, key=lambda e: (e.status < 0, e.latency_ms, e.tag))
    # throughput, and exacto (which OpenRouter ranks on throughput and quality signals).
    return sorted(endpoints, key=lambda e: (e.status < 0, -e.throughput, e.tag))


def _filter(
    endpoints: list[EndpointSpec],
    prefs: Preferences,
    used_params: Collection[str],
    model: ModelSpec,
) -> list[EndpointSpec]:
    stages: list[tuple[str, str, list[EndpointSpec]]] = []
    current = endpoints
    if prefs.only is not None:
        only = prefs.only
        current = [e for e in current if _any_match(only, e)]
        stages.append(("allowed_providers", _NO_PROVIDERS, current))
    if prefs.ignore:
        ignore = prefs.ignore
        current = [e for e in current if not _any_match(ignore, e)]
        stages.append(("allowed_providers", _NO_PROVIDERS, current))
    if not prefs.allow_fallbacks and prefs.order:
        order = prefs.order
        current = [e for e in current if _any_match(order, e)]
        stages.append(("allowed_providers", _NO_PROVIDERS, current))
    if prefs.quantizations is not None:
        quants = prefs.quantizations
        current = [e for e in current if _quantization_ok(quants, e)]
        stages.append(
            ("quantization", "No endpoints found matching your quantization requirements.", current)
        )
    if (
        prefs.max_prompt is not None
        or prefs.max_completion is not None
        or prefs.max_request is not None
        or prefs.max_image is not None
    ):
        current = [
            e
            for e in current
            if (prefs.max_prompt is None or e.prompt <= prefs.max_prompt)
            and (prefs.max_completion is None or e.completion <= prefs.max_completion)
            and (prefs.max_request is None or e.request <= prefs.max_request)
            and (prefs.max_image is None or e.image <= prefs.max_image)
        ]
        stages.append(
            ("max_price", "No endpoints found matching your max_price requirements.", current)
        )
    if prefs.enforce_distillable_text:
        # The provider-selection guide: only models whose author allows distillation.
        current = current if model.distillable else []
        stages.append(
            (
                "distillable_text",
                "No endpoints found for a model whose author allows text distillation.",
                current,
            )
        )
    if prefs.require_parameters and used_params:
        current = [e for e in current if all(p in e.supported_parameters for p in used_params)]
        stages.append(
            (
                "require_parameters",
                "No endpoints found that can handle the requested parameters.",
                current,
            )
        )
    for excluded_by, message, remaining in stages:
        if not remaining:
            raise RoutingError(404, message, excluded_by=[excluded_by], model=model.id)
    return current


def plan_route(
    model: ModelSpec,
    prefs: Preferences | None,
    used_params: Collection[str],
    rng: random.Random,
    unstable_tags: frozenset[str] | set[str] = frozenset(),
    service_tier: str | None = None,
    *,
    admit: str | None = None,
) -> Sequence[EndpointSpec]:
    """The endpoints to try, in order (the first is the primary choice).

    ``admit`` is a tier whose endpoints compete with the standard ones (a variant's:
    ``:floor`` admits flex). Requests with ``tools`` and neither ``order`` nor
    ``sort`` are ranked by Auto Exacto (auto-exacto guide: tool-calling quality
    first; here the ``exacto`` sort) instead of the price-weighted draw; the SDK
    describes a sort as applying "if 'order' is not specified", so an ``order``
    (the Router's) is never re-ranked.

    Raises:
        RoutingError: 404 when the filters leave no endpoint, worded like OpenRouter.
    """
    if "tools" in used_params and (prefs is None or not (prefs.sort or prefs.order)):
        prefs = replace(prefs or Preferences(), sort="exacto")  # Auto Exacto
    ordered = _plan_route(model, prefs, used_params, rng, unstable_tags, service_tier, admit)
    if service_tier == "priority" and model.has_tiers:
        # Priority endpoints first, the rest as fallbacks (stable: each keeps its order).
        return sorted(ordered, key=lambda e: e.service_tier != "priority")
    return ordered


def _plan_route(
    model: ModelSpec,
    prefs: Preferences | None,
    used_params: Collection[str],
    rng: random.Random,
    unstable_tags: frozenset[str] | set[str],
    service_tier: str | None,
    admit: str | None,
) -> Sequence[EndpointSpec]:
    tiers = model.has_tiers
    if prefs is None and not unstable_tags and _SOFT_SET.isdisjoint(used_params) and not tiers:
        return _default_route(model).order(rng)  # the hot path: nothing to filter
    soft = [p for p in _SOFT_PARAMETERS if p in used_params]
    endpoints = (
        tier_candidates(model.endpoints, prefs, service_tier, model, admit)
        if tiers
        else list(model.endpoints)
    )
    if prefs is not None:
        endpoints = _filter(endpoints, prefs, used_params, model)
    if soft:
        # A soft filter prefers capable endpoints among those the preferences allow;
        # when none is capable the allowed ones serve (a tool-less endpoint answers in
        # text), so it never turns a valid ``only`` into a 404.
        capable = [e for e in endpoints if all(p in e.supported_parameters for p in soft)]
        endpoints = capable or endpoints
    if prefs is None:
        return _default_order(endpoints, rng, unstable_tags)
    ordered = (
        _sorted(endpoints, prefs.sort)
        if prefs.sort
        else _default_order(endpoints, rng, unstable_tags)
    )
    if prefs.min_throughput is not None or prefs.max_latency_s is not None:
        # Preferences, not filters: endpoints that miss them go to the back.
        def misses(e: EndpointSpec) -> bool:
            slow = prefs.min_throughput is not None and e.throughput < prefs.min_throughput
            late = prefs.max_latency_s is not None and e.latency_ms / 1000 > prefs.max_latency_s
            return slow or late

        ordered = [e for e in ordered if not misses(e)] + [e for e in ordered if misses(e)]
    if prefs.order:
        first: list[EndpointSpec] = []
        for item in prefs.order:
            first.extend(e for e in ordered if matches(item, e) and e not in first)
        if not prefs.allow_fallbacks:
            if not first:
                raise RoutingError(
                    404, _NO_PROVIDERS, excluded_by=["allowed_providers"], model=model.id
                )
            return first
        ordered = first + [e for e in ordered if e not in first]
    elif not prefs.allow_fallbacks:
        ordered = ordered[:1]
    return ordered
