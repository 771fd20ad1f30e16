"""Which model a request asks for: routing variants, ``models`` fallbacks, unknown ids.

Routing variants (``:nitro`` by throughput, admitting priority-tier endpoints;
``:floor`` by price, admitting flex-tier ones; ``:exacto`` by tool-calling quality)
work on any model id and serve the base model; with several, the last wins, and a
body's ``provider.sort`` wins over a variant (assumptions). ``models`` is a fallback
list: the first model of ``model`` then ``models`` that the market has is served, and
billing follows it. An unknown model is a 400 ``"<id> is not a valid model ID"`` with
``model_not_found``; a request that names no model says so, never ``None``
(docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from provider_router.testing.chat import bodies
from provider_router.testing.market.listing import ModelSpec

__all__ = ["ROUTING_VARIANTS", "Requested", "resolve_model", "split_variants"]

ROUTING_VARIANTS = {"nitro": "throughput", "floor": "price", "exacto": "exacto"}
"""Variant suffix -> the ``provider.sort`` it stands for."""
_ADMITS = {"nitro": "priority", "floor": "flex"}
DOCS_URL = "https://openrouter.ai/docs/guides/routing/model-fallbacks"


@dataclass(frozen=True, slots=True)
class Requested:
    """The model a request is served by, and what its variant changes."""

    model: ModelSpec
    sort: str | None = None
    admits_tier: str | None = None


def split_variants(model_id: str) -> tuple[str, str | None]:
    """``(base id, last routing variant)``; other suffixes stay part of the id."""
    base, variant = model_id, None
    while ":" in base:
        head, _, suffix = base.rpartition(":")
        if suffix not in ROUTING_VARIANTS:
            break
        variant = variant or suffix  # the last suffix written wins
        base = head
    return base, variant


def _not_found(model_id: str) -> web.Response:
    body = bodies.error_body(
        400, f"{model_id} is not a valid model ID", {"error_type": "invalid_request"}
    )
    body["error"]["availability"] = {
        "code": "model_not_found",
        "retryable": False,
        "requested_models": [model_id],
        "docs_url": DOCS_URL,
    }
    return web.Response(body=bodies.dumps(body), status=400, content_type="application/json")


def _bad(message: str) -> web.Response:
    body = bodies.error_body(400, message, {"error_type": "invalid_request"})
    return web.Response(body=bodies.dumps(body), status=400, content_type="application/json")


def resolve_model(
    body: Mapping[str, Any], models: Mapping[str, ModelSpec]
) -> Requested | web.Response:
    """The model (and variant) a chat request is served by, or OpenRouter's 400."""
    model_id = body.get("model")
    spec = models.get(model_id) if isinstance(model_id, str) else None
    if spec is not None:  # the common case: a plain id
        return Requested(spec)
    fallbacks = body.get("models")
    if fallbacks is not None and (
        not isinstance(fallbacks, list) or not all(isinstance(m, str) and m for m in fallbacks)
    ):
        return _bad("models: expected an array of model IDs")
    candidates = ([model_id] if isinstance(model_id, str) else []) + list(fallbacks or [])
    if model_id is not None and not isinstance(model_id, str):
        return _bad("model: expected a string")
    if not candidates:
        return _bad("model: required (or models: a non-empty array of model IDs)")
    for candidate in candidates:
        base, variant = split_variants(candidate)
        spec = models.get(base)
        if spec is not None:
            return Requested(
                spec,
                ROUTING_VARIANTS[variant] if variant else None,
                _ADMITS.get(variant or ""),
            )
    return _not_found(candidates[0])
