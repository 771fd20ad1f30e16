"""What the simulated Batch API checks in a submit body, and how it answers one line.

:func:`parse_submit` turns a ``POST /batches`` body into a :class:`Submission` or an
error answer, applying the wire rules the sources give (docs/simulator.md, "Batches"):
``endpoint`` and ``model`` before ``requests`` (the body is stream-parsed), unique
``custom_id``s, the 5,000-request and 200 MB limits, one model per batch.
:func:`answer_line` draws one line's completion and prices it at the batch endpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from provider_router.testing.billing import Cost, compute_cost
from provider_router.testing.chat import bodies
from provider_router.testing.chat.synth import (
    Lengths,
    count_request_prompt,
    filler,
    shape_completion,
)
from provider_router.testing.draws import Draws
from provider_router.testing.market.listing import EndpointSpec, Market, ModelSpec

__all__ = [
    "BATCH_ENDPOINTS",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_REQUESTS",
    "LineAnswer",
    "SubmitError",
    "Submission",
    "answer_line",
    "batch_failure",
    "parse_submit",
    "worst_case_units",
]

MAX_BATCH_REQUESTS = 5_000
"""Requests per batch (the Batch API guide; other figures exist and conflict)."""
MAX_BATCH_BYTES = 200 * 1024 * 1024
"""Bytes per submit body (the guide's 200 MB)."""
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings")
"""What ``endpoint`` may name; the simulator serves the chat one only."""
_HEAD_FIELDS = ("endpoint", "model")
"""What must precede ``requests``: the 400 names only these, and the newest SDK sends
``completion_window`` and ``provider`` after ``requests`` (docs/simulator.md)."""
_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The strictest upstream rule the sources give (Anthropic; Together: <= 64), for all."""
_BATCH_SUFFIX = ":batch"


@dataclass(frozen=True, slots=True)
class SubmitError:
    """A refused submit: the HTTP status and OpenRouter's wording."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Submission:
    """A submit body that passed the synchronous checks."""

    model: ModelSpec
    model_slug: str
    """The ``model`` as sent (base or ``:batch`` slug), echoed in the batch object."""
    endpoint: EndpointSpec
    """The one batch endpoint that serves the whole batch."""
    requests: tuple[tuple[str, Mapping[str, Any]], ...]
    """(custom_id, body) in the order sent."""
    served_by: str | None = None
    """The provider that runs it when not the chosen endpoint's (``BatchFaults.served_by``)."""

    @property
    def provider(self) -> str:
        """The provider name the batch object and each line report."""
        return self.served_by or self.endpoint.provider_name


def _model_for(market: Market, slug: str) -> ModelSpec | None:
    base = slug[: -len(_BATCH_SUFFIX)] if slug.endswith(_BATCH_SUFFIX) else slug
    return market.models.get(base)


def _choose_endpoint(model: ModelSpec, slug: str, provider: object) -> EndpointSpec | SubmitError:
    """The cheapest eligible batch endpoint, within ``provider.only`` when given."""
    candidates = [e for e in model.batch_endpoints if not e.down]
    if not model.batch_endpoints:
        return SubmitError(400, f"Model '{slug}' does not have a :batch endpoint.")
    only: list[str] | None = None
    if provider is not None:
        if not isinstance(provider, Mapping):
            return SubmitError(400, "provider must be an object")
        raw = provider.get("only")
        if raw is not None:
            if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
                return SubmitError(400, "provider.only must be a list of provider slugs")
            only = [p.lower() for p in raw]
    if only is not None:
        candidates = [
            e
            for e in candidates
            if e.slug in only or e.tag in only or e.provider_name.lower() in only
        ]
        if not candidates:
            return SubmitError(
                404,
                f"Model '{slug}' does not have an eligible :batch endpoint matching "
                f"provider.only: {', '.join(only)}.",
            )
    if not candidates:
        return SubmitError(503, f"No :batch endpoint of '{slug}' is available right now.")
    return min(candidates, key=lambda e: (e.blended_price, e.tag))


def parse_submit(market: Market, raw: bytes) -> Submission | SubmitError:
    """Check a submit body as OpenRouter does before it answers 202."""
    if len(raw) > MAX_BATCH_BYTES:
        return SubmitError(413, f"Batch body exceeds {MAX_BATCH_BYTES} bytes.")
    try:
        data = json.loads(raw)
    except ValueError:
        return SubmitError(400, "Request body is not valid JSON.")
    if not isinstance(data, dict):
        return SubmitError(400, "Request body must be a JSON object.")
    keys = list(data)
    if (
        "endpoint" not in data
        or "model" not in data
        or (
            "requests" in data
            and any(k in data and keys.index(k) > keys.index("requests") for k in _HEAD_FIELDS)
        )
    ):
        return SubmitError(
            400,
            "endpoint and model are required and must appear before requests in the request body",
        )
    endpoint, slug = data["endpoint"], data["model"]
    if endpoint not in BATCH_ENDPOINTS:
        return SubmitError(400, f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}.")
    if endpoint != "/v1/chat/completions":
        return SubmitError(400, f"endpoint {endpoint} is not served by the local OpenRouter.")
    if not isinstance(slug, str) or not slug:
        return SubmitError(400, "model must be a non-empty string.")
    window = data.get("completion_window", "24h")
    if window != "24h":
        return SubmitError(400, 'completion_window must be "24h".')
    model = _model_for(market, slug)
    if model is None:
        return SubmitError(404, f"Model '{slug}' not found.")
    chosen = _choose_endpoint(model, slug, data.get("provider"))
    if isinstance(chosen, SubmitError):
        return chosen
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        return SubmitError(400, "requests must be a non-empty array.")
    if len(requests) > MAX_BATCH_REQUESTS:
        return SubmitError(
            413, f"A batch holds at most {MAX_BATCH_REQUESTS} requests, got {len(requests)}."
        )
    seen: set[str] = set()
    lines: list[tuple[str, Mapping[str, Any]]] = []
    for line, item in enumerate(requests, start=1):
        if not isinstance(item, dict) or not isinstance(item.get("body"), dict):
            return SubmitError(400, f"Request at line {line} must have an object body.")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            return SubmitError(
                422,
                f"Request at line {line} has an invalid custom_id: 1 to 64 characters of "
                "[A-Za-z0-9_-].",
            )
        if custom_id in seen:
            return SubmitError(422, f"Request at line {line} has a duplicate custom_id.")
        seen.add(custom_id)
        body = item["body"]
        if "model" in body and body["model"] not in (slug, model.id, f"{model.id}:batch"):
            return SubmitError(400, "Each batch request body model must match the top-level model.")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return SubmitError(400, f"Request at line {line} needs a non-empty messages array.")
        lines.append((custom_id, body))
    return Submission(model, slug, chosen, tuple(lines))


_RANGES: Final = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
"""OpenRouter's documented parameter ranges (``api-reference/parameters``)."""


def batch_failure(submission: Submission) -> str | None:
    """Why the whole batch fails after its 202 (None: it runs), as the sources list:
    one bad line (``stream``, ``max_tokens`` < 1, a parameter out of its range, a
    prompt plus ``max_tokens`` beyond the endpoint's context) fails every line."""
    for line, (_, body) in enumerate(submission.requests, start=1):
        why = _line_failure(submission.endpoint, body)
        if why is not None:
            return f"Request at line {line}: {why}."
    return None


def _line_failure(endpoint: EndpointSpec, body: Mapping[str, Any]) -> str | None:
    if body.get("stream") is True:
        return "stream: true is not supported in a batch"
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        return "max_tokens must be at least 1"
    for name, (low, high) in _RANGES.items():
        value = body.get(name)
        if isinstance(value, int | float) and not low <= value <= high:
            return f"{name} {value} is outside {low:g} to {high:g}"
    cap = endpoint.max_completion_tokens
    if isinstance(max_tokens, int) and cap is not None and max_tokens > cap:
        return f"max_tokens {max_tokens} is above the endpoint's {cap}"
    prompt, _ = count_request_prompt(body)
    context = endpoint.context_length
    if isinstance(max_tokens, int) and context is not None and prompt + max_tokens > context:
        return (
            f"the prompt ({prompt} tokens) and max_tokens ({max_tokens}) exceed the "
            f"context length ({context})"
        )
    return None


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def worst_case_units(submission: Submission) -> int:
    """The batch's estimated cost for the affordability check at submit: every line's
    prompt plus its ``max_tokens`` (else the endpoint's cap) at the batch prices."""
    endpoint = submission.endpoint
    total = 0
    for _, body in submission.requests:
        prompt, images = count_request_prompt(body)
        cap = _max_tokens(body) or endpoint.max_completion_tokens or endpoint.context_length
        total += compute_cost(endpoint, prompt, 0, cap, images=images).total
    return total


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """One line's result: its cost (zero for a failed line) and its result object."""

    cost: Cost | None
    prompt_tokens: int
    completion_tokens: int
    result: dict[str, Any]


def answer_line(
    submission: Submission,
    custom_id: str,
    body: Mapping[str, Any],
    rng: Draws,
    lengths: Lengths,
    created: int,
    fails: bool,
) -> LineAnswer:
    """Draw one line's completion (or its failure) at the batch endpoint's prices."""
    result_id = f"batch-req-{rng.alnum(20)}"
    if fails:
        error = {
            "type": "server_error",
            "message": "The upstream provider failed this request.",
            "param": None,
            "error_type": "provider_error",
        }
        failed = {"id": result_id, "custom_id": custom_id, "response": None, "error": error}
        return LineAnswer(None, 0, 0, failed)
    endpoint = submission.endpoint
    prompt, images = count_request_prompt(body)
    shape = shape_completion(body, lengths.draw(rng), _max_tokens(body))
    tokens = shape.completion_tokens
    cost = compute_cost(endpoint, prompt, 0, tokens, images=images)
    usage = bodies.usage_body(prompt, 0, tokens, shape.reasoning_tokens, cost)
    gen_id = f"gen-batch-{created}-{rng.alnum(20)}"
    reasoning = filler(0, shape.reasoning_tokens, reasoning=True) if shape.show_reasoning else None
    chat = bodies.chat_result(
        gen_id,
        created,
        submission.model.id,
        submission.provider,
        filler(0, shape.content_tokens),
        reasoning,
        shape.finish_reason,
        usage,
    )
    response: dict[str, Any] = {
        "status_code": 200,
        "request_id": f"req-{rng.alnum(16)}",
        "body": chat,
    }
    result: dict[str, Any] = {
        "id": result_id,
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }
    return LineAnswer(cost, prompt, tokens, result)
