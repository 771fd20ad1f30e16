"""The serving attempt: generate, wait like the provider would, answer, charge.

Non-streaming answers are one JSON body, preceded by the whitespace OpenRouter sends
while it waits; streaming answers are SSE (``: OPENROUTER PROCESSING`` comments until
the first token, ``data:`` chunks, a finish chunk, a usage chunk, ``data: [DONE]``).
Delivery faults (``hang``, ``reset``, ``truncate``, ``drop_done``, ``no_usage_cost``,
``usage_cost``, ``error_200``, ``stream_error``) shape the answer, and each is charged
as a provider would charge it: an error finish and a hang cost nothing, a reset or a
truncated body in full. A client that leaves mid-stream pays the tokens sent so far
on a provider that cancels (``Simulator.cancels``); on any other, and for every
non-streaming request, the generation goes on and is billed in full when it would
have ended (``market/cancellation.py``, docs/simulator.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from provider_router.testing.billing import Cost, KeyState, compute_cost
from provider_router.testing.chat import bodies, logprobs, tools
from provider_router.testing.chat.encode import (
    ChunkFrame,
    chat_result_bytes,
    content_delta_json,
    filler_choices_json,
    filler_delta_json,
    usage_json,
)
from provider_router.testing.chat.sse import EventWriter
from provider_router.testing.chat.structured import OutputFormat, structured_pieces
from provider_router.testing.chat.synth import (
    CompletionShape,
    filler,
    shape_completion,
)
from provider_router.testing.chat.tools import PlannedCall, ToolRequest
from provider_router.testing.draws import Draws
from provider_router.testing.faults import Fault
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.market.degradation import request_salt
from provider_router.testing.market.listing import EndpointSpec, ModelSpec
from provider_router.testing.market.prefix_cache import CacheResult, prefix_chain
from provider_router.testing.simulator import Simulator, json_error

__all__ = ["Attempt", "serve"]

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"
WHITESPACE = b"\n         \n\n"
COMPLETION_TOKENS_HEADER = "X-Simulator-Completion-Tokens"
_NO_CACHE = CacheResult()
_MIDWAY_ERROR = {
    "code": 502,
    "message": "Provider disconnected unexpectedly",
    "metadata": {"error_type": "provider_unavailable"},
}


@dataclass(slots=True)
class Attempt:
    sim: Simulator
    request: web.Request
    record: RequestRecord
    key: KeyState
    body: dict[str, Any]
    model: ModelSpec
    endpoint: EndpointSpec
    prompt_tokens: int
    max_tokens: int | None
    rng: Draws
    fault: Fault | None
    tools: ToolRequest | None = None
    images: int = 0
    """Input images: each pays the endpoint's per-image fee."""
    choices: int = 1
    """``n``: completions generated (and billed) for the request."""
    output: OutputFormat | None = None
    """What ``response_format`` asks for (None: text)."""
    metadata: dict[str, Any] | None = None
    """``openrouter_metadata`` to add to the answer (asked for by header): a JSON
    answer's top level, a stream's final chunk."""
    sticky: tuple[str, str, object] | None = None
    """The conversation's sticky key (no ``session_id``): kept on this endpoint only
    once it reads from cache here (``_use_cache``)."""
    headers: dict[str, str] | None = None
    """More response headers for a stream (response caching's ``MISS``)."""
    tap: list[bytes] | None = None
    """Collects a stream's bytes as written (a response cache entry in the making)."""


@dataclass(slots=True)
class _Plan:
    gen_id: str
    created: int
    shape: CompletionShape
    cached_tokens: int
    ttft: float
    tokens_per_second: float
    calls: tuple[PlannedCall, ...] = ()
    cache_write_tokens: int = 0
    preamble: int = 0
    """Content tokens written before the tool calls (``auto`` only)."""
    salt: int = 0
    """Fixes how a degraded endpoint departs from the model for this request (else 0)."""
    structured: tuple[str, ...] = ()
    """The JSON answer's pieces (``response_format``), one token each; else empty."""
    top_logprobs: int | None = None
    """Alternatives per token of the answer's ``logprobs`` (None: ``logprobs: null``)."""


def _completion_total(attempt: Attempt) -> int:
    override = attempt.request.headers.get(COMPLETION_TOKENS_HEADER)
    if override is not None and override.isdigit() and int(override) > 0:
        return int(override)
    return attempt.sim.lengths.draw(attempt.rng)


def _use_cache(attempt: Attempt) -> CacheResult:
    """Read the longest cached prefix of the prompt on this endpoint, then cache the prompt.
    Written tokens are reported (and billed) only where the endpoint prices writes."""
    endpoint = attempt.endpoint
    if not endpoint.supports_implicit_caching or attempt.prompt_tokens < endpoint.cache_min_tokens:
        # Below the minimum no prefix of this prompt is read or stored (the longest is
        # the prompt without its reply priming): skip hashing the chain.
        return _NO_CACHE
    body = attempt.body
    chain = prefix_chain(body)
    result = attempt.sim.caches.serve(
        endpoint.tag,
        chain,
        attempt.sim.now(),
        min_tokens=endpoint.cache_min_tokens,
        ttl=endpoint.cache_ttl_seconds,
    )
    # Never more than the prompt: the prompt's count may include more than its messages.
    cached = min(result.cached_tokens, attempt.prompt_tokens)
    if cached and attempt.sticky is not None:
        # The guide: a conversation sticks "after a cache hit" (a session_id, always).
        attempt.sim.sticky.remember(attempt.sticky, endpoint, attempt.sim.now(), cache_hit=True)
    written = 0
    if endpoint.cache_write_units is not None:
        written = min(result.written_tokens, attempt.prompt_tokens - cached)
    return CacheResult(cached, written)


def _plan(attempt: Attempt) -> _Plan:
    rng = attempt.rng
    created = int(time.time())
    gen_id = f"gen-{created}-{rng.alnum(20)}"
    total = _completion_total(attempt)
    endpoint = attempt.endpoint
    ttft = endpoint.latency_ms / 1000 * math.exp(rng.gauss(0.0, 0.25))
    tps = endpoint.throughput * math.exp(rng.gauss(0.0, 0.15))
    # Drawn last, so a request without tools sees the same draws as before tools existed.
    calls: tuple[PlannedCall, ...] = ()
    preamble = 0
    request = attempt.tools
    if request is not None:
        request = tools.honoured(
            request, endpoint.supported_parameters, endpoint.tool_choice_flags()
        )
    if request is not None:
        calls = tools.plan_calls(request, attempt.body["messages"], attempt.model.id, rng)
        preamble = tools.preamble_tokens(request, calls, rng)
    salt = 0
    if endpoint.serves is not None:
        salt = request_salt(attempt.sim.seed, endpoint.tag, attempt.body["messages"])
        calls = endpoint.serves.calls(calls, salt)
    tool_tokens = preamble + sum(call.tokens for call in calls) if calls else None
    structured: tuple[str, ...] = ()
    if attempt.output is not None and not calls:
        structured = structured_pieces(attempt.output, endpoint.supported_parameters, rng)
    if structured:
        shape = shape_completion(attempt.body, total, attempt.max_tokens, len(structured))
        if shape.finish_reason == "tool_calls":
            shape = dataclasses.replace(shape, finish_reason="stop")
    else:
        shape = shape_completion(attempt.body, total, attempt.max_tokens, tool_tokens)
    cache = _use_cache(attempt)
    top_logprobs = None
    if "logprobs" in attempt.body and not calls and not structured:
        top_logprobs = logprobs.requested(attempt.body, endpoint.supported_parameters)
    return _Plan(
        gen_id,
        created,
        shape,
        cache.cached_tokens,
        ttft,
        tps,
        calls,
        cache.written_tokens,
        preamble,
        salt,
        structured,
        top_logprobs,
    )


def _charge(attempt: Attempt, plan: _Plan, completion_tokens: int, reasoning_tokens: int) -> Cost:
    # ``n`` choices are n completions of this length, each billed.
    completion_tokens *= attempt.choices
    reasoning_tokens *= attempt.choices
    cost = compute_cost(
        attempt.endpoint,
        attempt.prompt_tokens,
        plan.cached_tokens,
        completion_tokens,
        plan.cache_write_tokens,
        attempt.images,
    )
    factor = attempt.sim.overcharge
    if factor != 1:  # a server billing above its listed prices (tests of the client's sanity)
        cost = Cost(
            cost.prompt * factor,
            cost.completion * factor,
            cost.request * factor,
            cost.image * factor,
        )
    fault = attempt.fault
    if fault is not None and fault.kind == "usage_cost" and fault.confirm:
        cost = Cost(fault.confirmed_units(), 0, 0)  # it really billed what it reports
    attempt.sim.account.charge(attempt.key, cost.total)
    record = attempt.record
    record.cost_units = cost.total
    record.completion_tokens = completion_tokens
    record.reasoning_tokens = reasoning_tokens
    return cost


def _remember(
    attempt: Attempt,
    plan: _Plan,
    cost_units: int,
    completion: int,
    reasoning: int,
    finish: str,
    latency_s: float,
) -> None:
    """Store what ``GET /generation`` will return for this id."""
    endpoint = attempt.endpoint
    record = attempt.record
    record.generation_id = plan.gen_id
    record.tag = endpoint.tag
    record.provider = endpoint.provider_name
    record.prompt_tokens = attempt.prompt_tokens
    record.cached_tokens = plan.cached_tokens
    record.finish_reason = finish
    headers = attempt.request.headers
    generations = attempt.sim.generations
    if len(generations) >= attempt.sim.log_limit:
        # Bounded like the request log: the oldest record goes first.
        attempt.sim.generation_misses.pop(generations.pop_oldest(), None)
    generations.put(
        plan.gen_id,
        attempt.key.label,
        plan.created,
        attempt.model,
        record.stream,
        endpoint.provider_name,
        plan.ttft,
        latency_s,
        finish,
        attempt.prompt_tokens,
        completion,
        reasoning,
        plan.cached_tokens,
        cost_units,
        record.attempts,
        headers.get("User-Agent"),
        headers.get("HTTP-Referer"),
    )


_WRITTEN_BY_HAND = frozenset(("error_200", "reset", "truncate"))
_USAGE_REWRITTEN = frozenset(("no_usage_cost", "usage_cost"))
"""Kinds whose ``usage`` is not the template's (the answer is built as a dict)."""
"""JSON answers that wait or write themselves even at infinite speed."""


def serve(attempt: Attempt) -> web.StreamResponse | Awaitable[web.StreamResponse]:
    """Answer with the attempt's endpoint, shaped by its delivery fault if any: the
    answer itself when nothing waits (a JSON answer at infinite speed), else its
    awaitable (plain function: no coroutine for the answer made at once)."""
    fault = attempt.fault
    kind = None if fault is None else fault.kind
    if kind == "hang":
        assert fault is not None
        return _hang(attempt, fault)
    plan = _plan(attempt)
    if attempt.record.stream:
        return _stream(attempt, plan)
    sim = attempt.sim
    if sim.instant and kind not in _WRITTEN_BY_HAND:
        # Made at once: no client can leave before the generation is billed.
        return _json_body(attempt, plan, _json_data(attempt, plan, kind))
    if sim.bills_abandoned_json:
        return _json_billed_if_abandoned(attempt, plan)
    return _json(attempt, plan)


async def _json_billed_if_abandoned(attempt: Attempt, plan: _Plan) -> web.StreamResponse:
    started = attempt.sim.now()
    try:
        return await _json(attempt, plan)
    except asyncio.CancelledError:
        if attempt.record.generation_id is None:
            _finish_abandoned(attempt, plan, attempt.sim.now() - started)
        raise


def _finish_abandoned(attempt: Attempt, plan: _Plan, elapsed: float) -> None:
    """The client left after ``elapsed`` simulated seconds: finish and bill in the background."""
    shape = plan.shape
    duration = plan.ttft + shape.completion_tokens / plan.tokens_per_second
    attempt.record.outcome = "abandoned"

    async def finish() -> None:
        # Cancelled when the simulator stops: bill now, so the charge record stays whole.
        with contextlib.suppress(asyncio.CancelledError):
            await attempt.sim.wait(duration - elapsed)
        cost = _charge(attempt, plan, shape.completion_tokens, shape.reasoning_tokens)
        _remember(
            attempt,
            plan,
            cost.total,
            shape.completion_tokens,
            shape.reasoning_tokens,
            shape.finish_reason,
            duration,
        )

    attempt.sim.finish_abandoned(finish())


async def _hang(attempt: Attempt, fault: Fault) -> web.StreamResponse:
    sim = attempt.sim
    attempt.record.outcome = "hang"
    timeout = None if fault.hang_seconds is None else sim.real_seconds(fault.hang_seconds)
    try:
        await asyncio.wait_for(sim.stopping.wait(), timeout)
    except TimeoutError:
        return json_error(
            524, "Request timed out. Please try again later.", {"error_type": "timeout"}
        )
    _abort(attempt.request)
    return web.Response(status=503)


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _shown(attempt: Attempt) -> str | None:
    """The ``provider`` a body names: ``None`` (omitted) when the simulator is anonymous."""
    return None if attempt.sim.anonymous else attempt.endpoint.provider_name


def _text(attempt: Attempt, plan: _Plan, start: int, stop: int) -> str:
    """Content tokens ``start`` to ``stop`` as this endpoint writes them."""
    serves = attempt.endpoint.serves
    if serves is None:
        return filler(start, stop)
    return serves.text(start, stop, plan.salt)


def _content_text(attempt: Attempt, plan: _Plan, content_tokens: int) -> str | None:
    """``message.content``: the text, or with tool calls the words before them (else null)."""
    if plan.structured:
        return "".join(plan.structured[:content_tokens])
    if not plan.calls:
        return _text(attempt, plan, 0, content_tokens)
    return _text(attempt, plan, 0, min(plan.preamble, content_tokens)) or None


def _drop_cost(attempt: Attempt, usage: dict[str, Any]) -> None:
    """``no_usage_cost``: billed in full, but the answer's usage has no cost fields
    (a provider path without usage accounting); ``/generation`` still has it."""
    usage.pop("cost", None)
    usage.pop("cost_details", None)
    attempt.record.outcome = "no_usage_cost"


def _reasoning_text(attempt: Attempt, plan: _Plan, tokens: int) -> str | None:
    if not plan.shape.show_reasoning or plan.shape.reasoning_tokens == 0:
        return None
    return filler(0, tokens, reasoning=True)


async def _json(attempt: Attempt, plan: _Plan) -> web.StreamResponse:
    sim = attempt.sim
    shape = plan.shape
    fault = attempt.fault
    kind = fault.kind if fault is not None else None
    model_slug = attempt.model.canonical_slug
    duration = plan.ttft + shape.completion_tokens / plan.tokens_per_second
    if kind == "error_200":
        after = fault.after_tokens if fault and fault.after_tokens is not None else 0
        reasoning = min(after, shape.reasoning_tokens)
        content_tokens = min(max(after - reasoning, 0), shape.content_tokens)
        await sim.wait(plan.ttft + (reasoning + content_tokens) / plan.tokens_per_second)
        # The partial output is counted, as generated; zero-completion insurance
        # makes an error finish free, so the cost is 0 all the same (unless the fault
        # says it was billed: ``confirm``, an assumption for the client's tests).
        delivered = reasoning + content_tokens
        billed = Cost(fault.confirmed_units(), 0, 0) if fault and fault.confirm else Cost(0, 0, 0)
        if billed.total:
            sim.account.charge(attempt.key, billed.total)
            attempt.record.cost_units = billed.total
        usage = bodies.usage_body(
            attempt.prompt_tokens, plan.cached_tokens, delivered, reasoning, billed
        )
        payload = bodies.chat_result(
            plan.gen_id,
            plan.created,
            model_slug,
            _shown(attempt),
            _text(attempt, plan, 0, content_tokens),
            _reasoning_text(attempt, plan, reasoning),
            "error",
            usage,
            error=dict(_MIDWAY_ERROR),
            fingerprint=attempt.endpoint.system_fingerprint,
            omit_fingerprint=not attempt.endpoint.sends_system_fingerprint,
        )
        attempt.record.outcome = "error_200"
        _remember(attempt, plan, billed.total, delivered, reasoning, "error", duration)
        return _json_body(attempt, plan, bodies.dumps(payload))
    if not sim.instant:
        await sim.wait(duration)
    data = _json_data(attempt, plan, kind)
    if kind == "reset":
        # Like the real service: headers (with the generation id) and the
        # keep-alive whitespace are already out when the connection drops, so a
        # client can still reconcile the charge through /generation.
        attempt.record.outcome = "reset"
        response = web.StreamResponse(headers={"X-Generation-Id": plan.gen_id})
        response.content_type = "application/json"
        await response.prepare(attempt.request)
        await response.write(WHITESPACE)
        _abort(attempt.request)
        return response
    if kind == "truncate":
        attempt.record.outcome = "truncate"
        response = web.StreamResponse(headers={"X-Generation-Id": plan.gen_id})
        response.content_type = "application/json"
        response.content_length = len(data)
        await response.prepare(attempt.request)
        await response.write(data[: len(data) // 2])
        _abort(attempt.request)
        return response
    return _json_body(attempt, plan, data)


def _json_data(attempt: Attempt, plan: _Plan, kind: str | None) -> bytes:
    """The generation is over: charge it, remember it, and the answer's bytes."""
    shape = plan.shape
    cost = _charge(attempt, plan, shape.completion_tokens, shape.reasoning_tokens)
    tier = attempt.endpoint.service_tier
    if (
        kind not in _USAGE_REWRITTEN
        and not plan.calls
        and attempt.choices == 1
        and tier is None
        and not plan.structured
        and attempt.metadata is None
        and attempt.endpoint.serves is None
        and plan.top_logprobs is None
    ):
        data = _plain_answer(attempt, plan, cost)
    else:
        data = WHITESPACE + bodies.dumps(_answer(attempt, plan, cost, kind))
    _remember(
        attempt,
        plan,
        cost.total,
        attempt.record.completion_tokens,
        attempt.record.reasoning_tokens,
        shape.finish_reason,
        plan.ttft + shape.completion_tokens / plan.tokens_per_second,
    )
    return data


def _usage(attempt: Attempt, plan: _Plan, cost: Cost, kind: str | None) -> dict[str, Any]:
    """The ``usage`` object of an answer or a stream's last chunk (``no_usage_cost``: no cost)."""
    record = attempt.record
    usage = bodies.usage_body(
        attempt.prompt_tokens,
        plan.cached_tokens,
        record.completion_tokens,
        record.reasoning_tokens,
        cost,
        plan.cache_write_tokens,
    )
    if kind == "no_usage_cost":
        _drop_cost(attempt, usage)
    elif kind == "usage_cost":
        assert attempt.fault is not None  # the kind is the fault's
        usage["cost"] = attempt.fault.reported  # written as it is: a lie, or the truth
        usage.pop("cost_details", None)
        attempt.record.outcome = "usage_cost"
    return usage


def _answer(attempt: Attempt, plan: _Plan, cost: Cost, kind: str | None) -> dict[str, Any]:
    """The answer body as a dict: any shape (tool calls, ``n`` choices, no usage cost)."""
    shape = plan.shape
    usage = _usage(attempt, plan, cost, kind)
    payload = bodies.chat_result(
        plan.gen_id,
        plan.created,
        attempt.model.canonical_slug,
        _shown(attempt),
        _content_text(attempt, plan, shape.content_tokens),
        _reasoning_text(attempt, plan, shape.reasoning_tokens),
        shape.finish_reason,
        usage,
        tool_calls=(
            tools.message_calls(plan.calls, shape.content_tokens - plan.preamble) or None
            if plan.calls
            else None
        ),
        fingerprint=attempt.endpoint.system_fingerprint,
        omit_fingerprint=not attempt.endpoint.sends_system_fingerprint,
    )
    if plan.top_logprobs is not None:
        payload["choices"][0]["logprobs"] = _logprobs(attempt, plan, 0, shape.content_tokens)
    if attempt.metadata is not None:
        payload["openrouter_metadata"] = attempt.metadata
    if attempt.endpoint.service_tier is not None:
        # The tier that served, at the top level as OpenAI's format has it (service-tiers
        # guide); only tier endpoints say it: no capture of a standard one has the key.
        payload["service_tier"] = attempt.endpoint.service_tier
    if attempt.choices > 1:
        first = payload["choices"][0]
        payload["choices"] = [{**first, "index": i} for i in range(attempt.choices)]
    return payload


def _logprobs(attempt: Attempt, plan: _Plan, start: int, stop: int) -> dict[str, Any]:
    """The ``logprobs`` object of content tokens ``start`` to ``stop`` (ChatTokenLogprobs)."""
    assert plan.top_logprobs is not None
    entries = logprobs.content(
        start,
        stop,
        plan.top_logprobs,
        seed=attempt.sim.seed,
        serves=attempt.endpoint.serves,
        salt=plan.salt,
    )
    return {"content": entries, "refusal": None}


def _plain_answer(attempt: Attempt, plan: _Plan, cost: Cost) -> bytes:
    """The same bytes as ``WHITESPACE + dumps(_answer(...))`` for one choice without
    tool calls, from templates (the common answer; see
    :mod:`~provider_router.testing.chat.encode`)."""
    shape = plan.shape
    record = attempt.record
    usage = usage_json(
        attempt.prompt_tokens,
        plan.cached_tokens,
        record.completion_tokens,
        record.reasoning_tokens,
        cost,
        plan.cache_write_tokens,
    )
    reasoning = shape.reasoning_tokens if shape.show_reasoning else 0
    return chat_result_bytes(
        WHITESPACE,
        plan.gen_id,
        plan.created,
        attempt.model.canonical_slug,
        _shown(attempt),
        filler_choices_json(shape.content_tokens, reasoning, shape.finish_reason),
        usage,
        attempt.endpoint.system_fingerprint,
        not attempt.endpoint.sends_system_fingerprint,
    )


def _json_body(attempt: Attempt, plan: _Plan, data: bytes) -> web.Response:
    # The Content-Type among the headers, after the id: the same headers in the same
    # order as ``content_type="application/json"`` sets them, without that argument's
    # checks and second insertion.
    return web.Response(
        body=data, headers={"X-Generation-Id": plan.gen_id, "Content-Type": "application/json"}
    )


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + bodies.dumps(payload) + b"\n\n"


async def _stream(attempt: Attempt, plan: _Plan) -> web.StreamResponse:
    sim = attempt.sim
    shape = plan.shape
    fault = attempt.fault
    kind = fault.kind if fault is not None else None
    gen_id, created, model_slug, provider = (
        plan.gen_id,
        plan.created,
        attempt.model.canonical_slug,
        _shown(attempt),
    )
    fp = attempt.endpoint.system_fingerprint
    frame = ChunkFrame(gen_id, created, model_slug, provider, fp)
    total = shape.completion_tokens
    stop_at = total
    if kind in ("error_200", "stream_error", "reset", "truncate"):
        default = 0 if kind == "error_200" else total // 2
        stop_at = min(
            total, fault.after_tokens if fault and fault.after_tokens is not None else default
        )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Generation-Id": gen_id,
        }
    )
    if attempt.headers is not None:
        response.headers.update(attempt.headers)
    instant = sim.instant
    out = EventWriter(response, gather=instant, tap=attempt.tap)
    sent = 0
    charged = False
    try:
        # Inside the try: a client killed before its headers went out is a client that
        # went away (billed as below), not a server error with a traceback.
        await response.prepare(attempt.request)
        await out.write(KEEPALIVE)
        waited = 0.0
        while plan.ttft - waited > sim.keepalive_seconds:
            await sim.wait(sim.keepalive_seconds)
            waited += sim.keepalive_seconds
            await out.write(KEEPALIVE)
        await sim.wait(plan.ttft - waited)
        step = sim.stream_chunk_tokens
        tps = plan.tokens_per_second
        while sent < stop_at:
            n = min(step, stop_at - sent)
            if not instant:
                await sim.wait(n / tps)
            if sent < shape.reasoning_tokens:
                n = min(n, shape.reasoning_tokens - sent)
                start = sent
                sent += n
                if shape.show_reasoning:
                    text = filler(start, start + n, reasoning=True)
                    delta = {
                        "role": "assistant",
                        "content": "",
                        "reasoning": text,
                        "reasoning_details": bodies.reasoning_details(text),
                    }
                    await out.write(frame.sse(bodies.dumps(delta).decode()))
            elif plan.calls and sent - shape.reasoning_tokens >= plan.preamble:
                start = sent - shape.reasoning_tokens - plan.preamble
                sent += n
                for entry in tools.stream_deltas(plan.calls, start, start + n):
                    call_delta = {"content": None, "role": "assistant", "tool_calls": [entry]}
                    await out.write(
                        _sse(
                            bodies.chunk(
                                gen_id, created, model_slug, provider, call_delta, fingerprint=fp
                            )
                        )
                    )
            else:
                start = sent - shape.reasoning_tokens
                if plan.calls:  # the words before the calls, then the calls
                    n = min(n, plan.preamble - start)
                sent += n
                if n > 0 and plan.top_logprobs is not None:
                    text_delta = {
                        "role": "assistant",
                        "content": _text(attempt, plan, start, start + n),
                    }
                    chunk = bodies.chunk(
                        gen_id,
                        created,
                        model_slug,
                        provider,
                        text_delta,
                        fingerprint=fp,
                        logprobs=_logprobs(attempt, plan, start, start + n),
                    )
                    await out.write(_sse(chunk))
                elif n > 0 and plan.structured:
                    text = "".join(plan.structured[start : start + n])
                    await out.write(frame.sse(content_delta_json(text)))
                elif n > 0 and attempt.endpoint.serves is None:
                    await out.write(frame.sse(filler_delta_json(start, start + n)))
                elif n > 0:
                    text = content_delta_json(_text(attempt, plan, start, start + n))
                    await out.write(frame.sse(text))
        reasoning_sent = min(sent, shape.reasoning_tokens)
        duration = plan.ttft + sent / tps
        if kind in ("error_200", "stream_error"):
            attempt.record.outcome = kind
            # What was streamed is counted, free under zero-completion insurance
            # (unless the fault says it was billed: ``confirm``, an assumption).
            billed = fault.confirmed_units() if fault is not None and fault.confirm else 0
            usage = None
            if billed:
                attempt.sim.account.charge(attempt.key, billed)
                attempt.record.cost_units = billed
                usage = bodies.usage_body(
                    attempt.prompt_tokens, plan.cached_tokens, sent, reasoning_sent,
                    Cost(billed, 0, 0),
                )  # fmt: skip
            error_chunk = bodies.chunk(
                gen_id,
                created,
                model_slug,
                provider,
                {"role": "assistant", "content": ""},
                "error",
                usage=usage,
                error=dict(_MIDWAY_ERROR),
                fingerprint=fp,
            )
            await out.write(_sse(error_chunk))
            await out.flush()
            _remember(attempt, plan, billed, sent, reasoning_sent, "error", duration)
            await response.write_eof()
            return response
        cost = _charge(
            attempt,
            plan,
            total if kind in ("reset", "truncate") else sent,
            shape.reasoning_tokens if kind else reasoning_sent,
        )
        charged = True
        _remember(
            attempt,
            plan,
            cost.total,
            attempt.record.completion_tokens,
            attempt.record.reasoning_tokens,
            shape.finish_reason,
            duration,
        )
        await out.flush()
        if kind == "reset":
            attempt.record.outcome = "reset"
            _abort(attempt.request)
            return response
        if kind == "truncate":
            attempt.record.outcome = "truncate"
            await response.write_eof()
            return response
        usage = _usage(attempt, plan, cost, kind)
        final_delta = {"role": "assistant", "content": ""}
        finish = shape.finish_reason
        tail = _sse(
            bodies.chunk(gen_id, created, model_slug, provider, final_delta, finish, fingerprint=fp)
        )
        last = bodies.chunk(
            gen_id, created, model_slug, provider, final_delta, finish, usage=usage, fingerprint=fp
        )
        if attempt.metadata is not None:  # on the final chunk before [DONE] (the guide)
            last["openrouter_metadata"] = attempt.metadata
        tail += _sse(last)
        if kind == "drop_done":
            # The whole answer and its usage are out; the connection dies before [DONE].
            attempt.record.outcome = "drop_done"
            await out.write(tail)
            await out.flush()
            _abort(attempt.request)
            return response
        await out.write(tail + DONE)
        await out.flush()
        await response.write_eof()
        return response
    except (ConnectionResetError, asyncio.CancelledError) as exc:
        if not charged:
            if not sim.cancels(attempt.endpoint):
                _finish_abandoned(attempt, plan, plan.ttft + sent / plan.tokens_per_second)
            else:
                # The client went away: it pays for what was generated so far, and
                # /generation says so.
                reasoning = min(sent, shape.reasoning_tokens)
                cost = _charge(attempt, plan, sent, reasoning)
                _remember(
                    attempt,
                    plan,
                    cost.total,
                    sent,
                    reasoning,
                    shape.finish_reason,
                    plan.ttft + sent / plan.tokens_per_second,
                )
        if isinstance(exc, asyncio.CancelledError):
            raise
        attempt.record.outcome = "client_closed"  # nobody left to answer: not a server error
        return response
