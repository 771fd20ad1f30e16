"""The JSON bodies OpenRouter sends, built as plain dicts (no models on the hot path).

Shapes follow captured responses (docs/simulator.md cites them): the top-level
``provider`` display name, ``usage.cost`` in USD with ``cost_details``,
``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``,
``native_finish_reason``, and error bodies ``{"error": {"code", "message",
"metadata"}, "user_id"}``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from provider_router._money import UNITS_PER_USD
from provider_router.testing.billing import Cost
from provider_router.testing.market.listing import EndpointSpec, ModelSpec

__all__ = ["Generation", "Generations", "chat_result", "chunk", "dumps", "error_body", "usage_body"]

# One encoder for every body: json.dumps(separators=...) would build a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"))
USER_ID = "user_simulator"


def dumps(obj: Any) -> bytes:
    """Compact JSON, as OpenRouter sends it."""
    return _ENCODER.encode(obj).encode()


def usd(units: int) -> float:
    """Picodollars as a JSON number. Exact in text: at most 15 significant digits here,
    and Python's float repr prints the shortest string that reads back the same."""
    return units / UNITS_PER_USD


def usage_body(
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    cost: Cost,
    cache_write_tokens: int = 0,
) -> dict[str, Any]:
    total = usd(cost.total)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "cost": total,
        "is_byok": False,
        "prompt_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": cache_write_tokens,
            "audio_tokens": 0,
            "video_tokens": 0,
        },
        # The parts add up to `cost`, as in every capture. The schema has no place
        # for a per-request fee, so it is counted with the prompt: it is charged
        # for the request whatever the output.
        "cost_details": {
            "upstream_inference_cost": total,
            "upstream_inference_prompt_cost": usd(cost.prompt + cost.request),
            "upstream_inference_completions_cost": usd(cost.completion),
        },
        "completion_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "image_tokens": 0,
            "audio_tokens": 0,
        },
    }


def reasoning_details(text: str) -> list[dict[str, Any]]:
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def chat_result(
    gen_id: str,
    created: int,
    model: str,
    provider: str | None,
    content: str | None,
    reasoning: str | None,
    finish_reason: str,
    usage: dict[str, Any],
    error: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    fingerprint: str | None = None,
    omit_fingerprint: bool = False,
) -> dict[str, Any]:
    """A JSON answer; ``omit_fingerprint``: without ``system_fingerprint`` at all (as
    Chutes', DeepInfra's, Fireworks' and Together's captured answers are)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "reasoning": reasoning,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning_details"] = reasoning_details(reasoning)
    choice: dict[str, Any] = {
        "logprobs": None,
        "finish_reason": finish_reason,
        "native_finish_reason": finish_reason,
        "index": 0,
        "message": message,
    }
    if error is not None:
        choice["error"] = error
    body: dict[str, Any] = {
        "id": gen_id,
        "provider": provider,
        "model": model,
        "object": "chat.completion",
        "created": created,
        "choices": [choice],
        "system_fingerprint": fingerprint,
        "usage": usage,
    }
    if provider is None:
        del body["provider"]
    if omit_fingerprint:
        del body["system_fingerprint"]
    return body


def chunk(
    gen_id: str,
    created: int,
    model: str,
    provider: str | None,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    fingerprint: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One SSE chunk; ``system_fingerprint`` only from providers that send one
    (Moonshot AI's chunks carry it, Chutes' and ModelRun's have none); ``logprobs``
    those of the chunk's own tokens (:mod:`~provider_router.testing.chat.logprobs`)."""
    body: dict[str, Any] = {
        "id": gen_id,
        "provider": provider,
        "model": model,
        "object": "chat.completion.chunk",
        "created": created,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "native_finish_reason": finish_reason,
                "logprobs": logprobs,
            }
        ],
    }
    if fingerprint is not None:
        body["system_fingerprint"] = fingerprint
    if usage is not None:
        body["usage"] = usage
    if error is not None:
        body["error"] = error
    if provider is None:
        del body["provider"]
    return body


def error_body(code: int, message: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        error["metadata"] = metadata
    return {"error": error, "user_id": USER_ID}


def provider_error_body(
    code: int, provider: str, raw: str, error_type: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An upstream failure relayed by OpenRouter: 'Provider returned error'."""
    metadata: dict[str, Any] = {"raw": raw, "provider_name": provider, "is_byok": False}
    metadata["error_type"] = error_type
    if extra:
        metadata.update(extra)
    return error_body(code, "Provider returned error", metadata)


def cache_discount(endpoint: EndpointSpec | None, cached_tokens: int) -> float | None:
    """What reading ``cached_tokens`` from cache saved against the prompt price (USD).

    None when nothing was read or the endpoint prices no cache reads (nothing saved:
    a read billed at the prompt price, as WandB's 2025 capture shows). Cache writes
    (a negative discount on Anthropic-style endpoints) are not included: the kept
    record does not hold the written tokens (an assumption, docs/simulator.md).
    """
    if endpoint is None or not cached_tokens or endpoint.cache_read_units is None:
        return None
    return usd(cached_tokens * (endpoint.prompt_units - endpoint.cache_read_units))


@dataclass(slots=True)
class Generation:
    """What ``GET /generation`` returns for one id; the body is built only when asked."""

    id: str
    key_label: str
    created: int
    model: ModelSpec
    streamed: bool
    provider: str
    ttft: float
    duration: float
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_units: int
    attempts: list[tuple[str, int]]
    user_agent: str | None
    referer: str | None

    def _served(self) -> EndpointSpec | None:
        served = next((tag for tag, status in reversed(self.attempts) if status == 200), None)
        return next((e for e in self.model.endpoints if e.tag == served), None)

    def body(self) -> dict[str, Any]:
        names = {e.tag: e.provider_name for e in self.model.endpoints}
        cost = usd(self.cost_units)
        served = self._served()
        return {
            "id": self.id,
            "upstream_id": f"chatcmpl-{self.id[-12:]}",
            "total_cost": cost,
            "cache_discount": cache_discount(served, self.cached_tokens),
            "upstream_inference_cost": cost,
            "created_at": datetime.fromtimestamp(self.created, UTC).isoformat(),
            "model": self.model.canonical_slug,
            "app_id": None,
            "streamed": self.streamed,
            "cancelled": False,
            "provider_name": self.provider,
            "latency": round(self.ttft * 1000, 1),
            "moderation_latency": None,
            "generation_time": round(self.duration * 1000, 1),
            "finish_reason": self.finish_reason,
            "native_finish_reason": self.finish_reason,
            "service_tier": served.service_tier if served is not None else None,
            "tokens_prompt": self.prompt_tokens,
            "tokens_completion": self.completion_tokens,
            "native_tokens_prompt": self.prompt_tokens,
            "native_tokens_completion": self.completion_tokens,
            "native_tokens_completion_images": 0,
            "native_tokens_reasoning": self.reasoning_tokens,
            "native_tokens_cached": self.cached_tokens,
            "num_media_prompt": None,
            "num_input_audio_prompt": None,
            "num_media_completion": 0,
            "num_search_results": None,
            "num_fetches": None,
            "web_search_engine": None,
            "origin": "",
            "usage": cost,
            "is_byok": False,
            "external_user": None,
            "api_type": "completions",
            "preset_id": None,
            "router": None,
            "provider_responses": [
                {"status": status, "endpoint_id": tag, "provider_name": names.get(tag, tag)}
                for tag, status in self.attempts
            ],
            "user_agent": self.user_agent,
            "http_referer": self.referer,
            "data_region": "global",
            "workspace_id": None,
        }


_ATTEMPTS_AT = 16
"""Where the attempts start in a kept record: (tag, status) pairs, flattened."""


class Generations(Mapping[str, Generation]):
    """The ``/generation`` records of the latest answers, by id, oldest first.

    Each is kept as one flat tuple of strings and numbers (:meth:`put`). CPython's
    collector stops tracking such a tuple the first time it sees it, so the records
    a run keeps (up to ``log_limit``, 100,000 by default) are never promoted to the
    oldest generation, whose every full collection traversed a dataclass per record
    (a full collection comes after so many promotions: fewer promoted objects per
    request, fewer and cheaper full collections). A :class:`Generation` is built
    when one is read.

    The ids are also kept in a queue, oldest first, so that forgetting the oldest is
    one step: ``next(iter(dict))`` walks every slot the earlier deletions left empty
    at the front of the dict (until it is resized), tens of microseconds per answer
    once ``log_limit`` records are kept.
    """

    def __init__(self, models: Mapping[str, ModelSpec]) -> None:
        self._models = models
        self._fields: dict[str, tuple[Any, ...]] = {}
        self._order: deque[str] = deque()

    def put(
        self,
        gen_id: str,
        key_label: str,
        created: int,
        model: ModelSpec,
        streamed: bool,
        provider: str,
        ttft: float,
        duration: float,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        reasoning_tokens: int,
        cached_tokens: int,
        cost_units: int,
        attempts: list[tuple[str, int]],
        user_agent: str | None,
        referer: str | None,
    ) -> None:
        """Remember (or replace, in its place) a record: :class:`Generation`'s fields."""
        fields: tuple[Any, ...] = (
            gen_id, key_label, created, model.id, streamed, provider, ttft, duration,
            finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens,
            cost_units, user_agent, referer,
        )  # fmt: skip
        for attempt in attempts:
            fields += attempt
        if gen_id not in self._fields:
            self._order.append(gen_id)
        self._fields[gen_id] = fields

    def pop_oldest(self) -> str:
        """Forget the oldest record; its id."""
        oldest = self._order.popleft()
        del self._fields[oldest]
        return oldest

    def __getitem__(self, gen_id: str) -> Generation:
        f = self._fields[gen_id]
        attempts = [(f[i], f[i + 1]) for i in range(_ATTEMPTS_AT, len(f), 2)]
        return Generation(
            f[0], f[1], f[2], self._models[f[3]], f[4], f[5], f[6], f[7], f[8], f[9], f[10],
            f[11], f[12], f[13], attempts, f[14], f[15],
        )  # fmt: skip

    def __contains__(self, gen_id: object) -> bool:
        return gen_id in self._fields

    def __len__(self) -> int:
        return len(self._fields)

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)
