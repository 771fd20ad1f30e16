"""Context length, enforced as OpenRouter does before any provider is paid.

A request fits an endpoint when its prompt tokens plus the completion it asks for are
within the endpoint's ``context_length`` (and the prompt within ``max_prompt_tokens``
when listed). When some candidate fits, only those are tried; when none does but
another endpoint of the model would, the answer is a 404 ``constraint_filtered``
excluded by ``context_length``; when no endpoint fits, a 400
``context_length_exceeded``, worded as OpenRouter words it. Nothing is billed. Routing
around too-small endpoints, and which answer comes when, are assumptions
(docs/simulator.md, fidelity table). An endpoint context compression can make room
on counts as one the request fits (:mod:`~provider_router.testing.market.compression`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from provider_router.testing.chat import bodies
from provider_router.testing.market.listing import EndpointSpec, ModelSpec

__all__ = ["fit_context"]

DOCS_URL = "https://openrouter.ai/docs/guides/routing/provider-selection"


def _fits(endpoint: EndpointSpec, prompt_tokens: int, completion: int) -> bool:
    if prompt_tokens + completion > endpoint.context_length:
        return False
    limit = endpoint.max_prompt_tokens
    return limit is None or prompt_tokens <= limit


def _exceeded(model: ModelSpec, prompt_tokens: int, completion: int) -> web.Response:
    largest = max(e.context_length for e in model.endpoints)
    message = (
        f"This endpoint's maximum context length is {largest} tokens. However, you "
        f"requested about {prompt_tokens + completion} tokens ({prompt_tokens} of text "
        f"input, {completion} in the output). Please reduce the length of either one, or "
        'use the "middle-out" transform to compress your prompt automatically.'
    )
    body = bodies.error_body(400, message, {"error_type": "context_length_exceeded"})
    return web.Response(body=bodies.dumps(body), status=400, content_type="application/json")


def _filtered(model: ModelSpec) -> web.Response:
    body = bodies.error_body(
        404,
        "No endpoints found that can handle the requested context length.",
        {"error_type": "not_found"},
    )
    body["error"]["availability"] = {
        "code": "constraint_filtered",
        "retryable": False,
        "requested_models": [model.id],
        "excluded_by": ["context_length"],
        "docs_url": DOCS_URL,
    }
    return web.Response(body=bodies.dumps(body), status=404, content_type="application/json")


def fit_context(
    model: ModelSpec,
    candidates: Sequence[EndpointSpec],
    prompt_tokens: int,
    max_tokens: int | None,
    smallest_context: int,
    room: Callable[[EndpointSpec], bool] | None = None,
) -> Sequence[EndpointSpec] | web.Response:
    """The candidates the request fits, or the error OpenRouter answers instead.

    ``smallest_context`` is the model's smallest ``context_length`` (and prompt
    limit): a request within it fits everywhere, and skips the walk. ``room`` says
    whether context compression can make the request fit an endpoint it does not.
    """
    completion = max_tokens or 0
    if prompt_tokens + completion <= smallest_context:
        return candidates

    def fits(endpoint: EndpointSpec) -> bool:
        if _fits(endpoint, prompt_tokens, completion):
            return True
        return room is not None and room(endpoint)

    fitting = [e for e in candidates if fits(e)]
    if fitting:
        return fitting if len(fitting) < len(candidates) else candidates
    if any(fits(e) for e in model.endpoints):
        return _filtered(model)
    return _exceeded(model, prompt_tokens, completion)


def smallest_context(model: ModelSpec) -> int:
    """The request size every endpoint of ``model`` takes."""
    smallest = min(e.context_length for e in model.endpoints)
    prompts = [e.max_prompt_tokens for e in model.endpoints if e.max_prompt_tokens is not None]
    return min([smallest, *prompts])
