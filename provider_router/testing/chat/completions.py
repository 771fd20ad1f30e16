"""``POST /api/v1/chat/completions``: validate, route, bill, fail or serve.

The order follows OpenRouter's: authenticate, validate the body, parse the
``provider`` object, apply platform rate limits, route, run the pre-flight credit
check (402), then try endpoints in route order, falling back past failures that
happen before any byte is sent. The serving attempt answers as JSON or SSE
(``delivery.py``); the account is charged what was generated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import zlib
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from provider_router._json import loads
from provider_router.testing.billing import KeyState
from provider_router.testing.chat import bodies, logprobs
from provider_router.testing.chat.cache import CACHE_HEADER, CacheLookup
from provider_router.testing.chat.delivery import Attempt, serve
from provider_router.testing.chat.replay import answer_hit, keep_answer
from provider_router.testing.chat.router_metadata import (
    METADATA_ON_ERRORS,
    router_metadata,
    wants_metadata,
)
from provider_router.testing.chat.structured import (
    OutputFormat,
    StructuredError,
    parse_response_format,
)
from provider_router.testing.chat.synth import count_request_prompt
from provider_router.testing.chat.tools import (
    ToolError,
    ToolRequest,
    check_tool_messages,
    parse_tool_request,
)
from provider_router.testing.draws import Draws
from provider_router.testing.faults import ATTEMPT_KINDS, Fault
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.market.compression import compress, compresses, compression_setting
from provider_router.testing.market.context import fit_context
from provider_router.testing.market.listing import EndpointSpec, ModelSpec
from provider_router.testing.market.provider_routing import (
    DOCS_URL,
    REQUEST_PARAMETERS,
    Preferences,
    RoutingError,
    parse_preferences,
    plan_route,
)
from provider_router.testing.market.sticky import stick, sticky_key
from provider_router.testing.market.variants import Requested, resolve_model
from provider_router.testing.simulator import SIM_KEY, Simulator, _finish, json_error

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["chat_completions"]

_REQUEST_PARAMETERS = frozenset(REQUEST_PARAMETERS)

_ERROR_TYPES = {
    429: "rate_limit_exceeded",
    500: "server",
    502: "provider_unavailable",
    503: "provider_unavailable",
    504: "timeout",
    524: "timeout",
    529: "provider_overloaded",
}
_RAW = {
    500: "Internal Server Error",
    502: "Bad Gateway: upstream connect error or disconnect/reset before headers",
    503: "Service Unavailable: no healthy upstream",
    504: "Gateway Timeout",
    524: "A timeout occurred",
    529: "Overloaded",
}


def retry_after_header(real_seconds: float) -> str:
    """Seconds to wait in real time: whole seconds, or a decimal below one second
    (a simulator at speed 1000 cannot ask for 0.017 s in whole seconds)."""
    if real_seconds >= 1:
        return str(math.ceil(real_seconds))
    return f"{real_seconds:.3f}".rstrip("0").rstrip(".") or "0"


def _bad_request(message: str) -> web.Response:
    return json_error(400, message, {"error_type": "invalid_request"})


def _routing_error(error: RoutingError) -> web.Response:
    metadata: dict[str, Any] = {
        "error_type": "not_found" if error.status == 404 else "invalid_request"
    }
    response = bodies.error_body(error.status, error.message, metadata)
    if error.status == 404:
        response["error"]["availability"] = {
            "code": "constraint_filtered",
            "retryable": False,
            "requested_models": [error.model],
            "excluded_by": list(error.excluded_by),
            "docs_url": DOCS_URL,
        }
    return web.Response(
        body=bodies.dumps(response), status=error.status, content_type="application/json"
    )


def _attempt_failure(
    sim: Simulator, fault: Fault | None, endpoint: EndpointSpec, model: ModelSpec
) -> tuple[web.Response, str]:
    """The error OpenRouter relays when an upstream fails before answering."""
    if fault is None:  # the endpoint is down
        status, kind = 503, "down"
    else:
        status, kind = fault.status or 502, fault.kind
    headers: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if status == 429:
        real = sim.real_seconds(fault.retry_after if fault else 1.0)
        header = retry_after_header(real)
        headers["Retry-After"] = header
        extra = {
            "retry_after_seconds": math.ceil(real),
            "retry_after_seconds_raw": round(real, 3),
            "headers": {"Retry-After": header},
        }
        raw = (
            f"{model.id} is temporarily rate-limited upstream. Please retry shortly, or add your "
            "own key to accumulate your rate limits: https://openrouter.ai/settings/integrations"
        )
    else:
        raw = (fault.message if fault and fault.message else None) or _RAW.get(
            status, "Upstream error"
        )
    body = bodies.provider_error_body(
        status, endpoint.provider_name, raw, _ERROR_TYPES.get(status, "provider_unavailable"), extra
    )
    response = web.Response(
        body=bodies.dumps(body), status=status, content_type="application/json", headers=headers
    )
    return response, kind


def _platform_limit(sim: Simulator, fault: Fault) -> web.Response:
    real = sim.real_seconds(fault.retry_after)
    header = retry_after_header(real)
    # Epoch milliseconds (the wall clock: a monotonic reading means nothing to a client);
    # the notes call the format unconfirmed, milliseconds is what clients parse.
    reset_ms = str(int((time.time() + real) * 1000))
    limit = str(fault.max_in_flight if fault.max_in_flight is not None else 1)
    rate_headers = {
        "X-RateLimit-Limit": limit,
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": reset_ms,
    }
    # The headers go on the answer only: no capture of a platform 429 copies them into
    # error.metadata (upstream 429s carry Retry-After there, see _attempt_failure).
    metadata = {"provider_name": None, "error_type": "rate_limit_exceeded"}
    return json_error(
        429,
        "Rate limit exceeded: requests-per-key.",
        metadata,
        headers={"Retry-After": header, **rate_headers},
    )


def _parse_max_tokens(body: dict[str, Any]) -> int | web.Response | None:
    """The completion cap honoured: ``max_completion_tokens`` over the deprecated
    ``max_tokens`` alias (each is validated when present)."""
    caps: list[int] = []
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return _bad_request(f"{name}: expected a positive integer, got {value!r}")
        caps.append(value)
    return caps[0] if caps else None


def _parse_choices(body: dict[str, Any]) -> int | web.Response:
    value = body.get("n", 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return _bad_request(f"n: expected a positive integer, got {value!r}")
    return value


Answer = web.StreamResponse | Awaitable[web.StreamResponse]
"""A response made at once, or the awaitable of one (an answer that waits or streams).

The usual answer at infinite speed (JSON, no fault) has nothing to wait for: it is
made by plain function calls, without a coroutine per layer (validation, attempts,
delivery); only what waits or writes is a coroutine."""


def _made(answer: Answer) -> TypeIs[web.StreamResponse]:
    """Whether ``answer`` is the response itself. ``web.StreamResponse`` is an ABC (a
    ``MutableMapping``), so ``isinstance`` on it is a Python-level ``__instancecheck__``
    (three times per answer): the exact type answers the usual case first."""
    return type(answer) is web.Response or isinstance(answer, web.StreamResponse)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    record = sim.log.start("chat")
    try:
        key = sim.authenticate(request, completions=True)
        if not isinstance(key, KeyState):  # a 401 (KeyState: no ABC check, unlike Response)
            response: web.StreamResponse = key
        else:
            record.key_label = key.label
            # All of the body has usually arrived: take it from the buffer (request.read()
            # costs two reads, a bytearray and a copy, and a coroutine).
            content = request.content
            raw = content.read_nowait() if content.is_eof() else await request.read()
            answer = _chat(sim, request, record, key, raw)
            response = answer if _made(answer) else await answer
    except asyncio.CancelledError:
        record.status, record.outcome = 499, "client_closed"
        sim.log.finish(record)
        raise
    return _finish(sim, record, response)


def _chat(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState, raw: bytes
) -> Answer:
    try:
        body = loads(raw)
    except ValueError:
        return _bad_request("Invalid JSON in request body")
    if not isinstance(body, dict):
        return _bad_request("Request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad_request("messages: expected a non-empty array of messages")
    model_id = body.get("model")
    record.model = model_id if isinstance(model_id, str) else None
    requested = resolve_model(body, sim.market.models)
    if not isinstance(requested, Requested):  # a 400 (Requested: a plain class, no ABC)
        return requested
    model = requested.model
    stream = body.get("stream") is True
    record.stream = stream
    record.routing = body.get("provider")
    max_tokens = _parse_max_tokens(body)
    # A 400 otherwise: checked by what it is not (isinstance on Response is an ABC check).
    if max_tokens is not None and not isinstance(max_tokens, int):
        return max_tokens
    record.max_tokens = max_tokens
    choices = _parse_choices(body)
    if not isinstance(choices, int):
        return choices
    if "logprobs" in body or "top_logprobs" in body:
        wrong = logprobs.check_request(body)
        if wrong is not None:
            return _bad_request(wrong)
        if body.get("logprobs") is True:
            record.logprobs = body.get("top_logprobs") or 0
    try:
        # Most requests carry neither field: skip the parser (it returns None for them).
        tool_request = (
            parse_tool_request(body) if "tools" in body or "tool_choice" in body else None
        )
        check_tool_messages(messages)
    except ToolError as exc:
        return _bad_request(str(exc))
    if tool_request is not None:
        record.tools = tuple(f.name for f in tool_request.functions)
        record.tool_choice = body.get("tool_choice")
    try:
        prefs = parse_preferences(body.get("provider"))
    except RoutingError as exc:
        return _routing_error(exc)
    if requested.sort is not None and (prefs is None or prefs.sort is None):
        prefs = dataclasses.replace(prefs or Preferences(), sort=requested.sort)
    output = None
    if "response_format" in body:
        try:
            output = parse_response_format(body)
        except StructuredError as exc:
            return _bad_request(str(exc))

    cache = None
    if CACHE_HEADER in request.headers:  # response caching: the few requests that opt in
        cache = sim.response_cache.lookup(
            request.headers, key.label, model.id, stream, body, sim.now()
        )
        if cache is not None and cache.hit is not None:
            return answer_hit(sim, record, key, model, stream, cache)

    rng = sim.rng_for(zlib.crc32(raw))
    if sim.faults.platform:
        key_flight = sim.key_in_flight.get(key.label, 0)
        fault = sim.faults.check_platform(key.label, model.id, stream, sim.now(), rng, key_flight)
        if fault is not None:
            record.outcome = "rate_limit"
            sim.log.counters["fault.rate_limit"] += 1
            return _platform_limit(sim, fault)

    used = _REQUEST_PARAMETERS.intersection(body)  # the parameters it uses (any order)
    if output is not None and output.kind == "json_schema":
        used = used | {"structured_outputs"}  # a schema wants endpoints that honour one
    try:
        unstable = sim.unstable_tags()
        tier = body.get("service_tier")
        candidates = plan_route(
            model,
            prefs,
            used,
            rng,
            unstable,
            tier if isinstance(tier, str) else None,
            admit=requested.admits_tier,
        )
    except RoutingError as exc:
        return _routing_error(exc)
    sticky = None
    if sim.sticky_model(model) and (prefs is None or not (prefs.order or prefs.sort)):
        sticky = sticky_key(key.label, model.id, body, request.headers.get("x-session-id"))
        if sticky is not None:
            candidates = stick(candidates, sim.sticky.lookup(sticky, sim.now()), unstable)

    prompt_tokens, images = count_request_prompt(body)
    squeeze = compression_setting(body) if "plugins" in body else None
    fitting = fit_context(
        model,
        candidates,
        prompt_tokens,
        max_tokens,
        sim.context_floor(model),
        room=lambda e: compresses(e, squeeze) and compress(body, e, max_tokens) is not None,
    )
    # Checked by what it is (isinstance on a Response is an ABC check).
    if not isinstance(fitting, tuple | list):  # 400 or 404: nothing is billed
        record.outcome = "context_length"
        return fitting  # type: ignore[return-value]
    candidates = fitting
    primary = candidates[0]
    max_out = (
        max_tokens
        or primary.max_completion_tokens
        or max(1, primary.context_length - prompt_tokens)
    ) * choices
    fixed = (
        prompt_tokens * primary.prompt_units + primary.request_units + images * primary.image_units
    )
    worst = fixed + max_out * primary.completion_units
    denied = sim.account.check(key, worst, max_out, fixed, primary.completion_units)
    if denied is not None:
        record.limit_source = denied.limit_source
        record.outcome = "payment_required"
        if denied.status == 403:  # the field's key cap: a bare body, no metadata
            return json_error(403, denied.message)
        metadata = {
            "provider_name": None,
            "limit_source": denied.limit_source,
            "error_type": "payment_required",
        }
        headers = None
        if denied.retry_after is not None:
            headers = {"Retry-After": retry_after_header(sim.real_seconds(denied.retry_after))}
        return json_error(402, denied.message, metadata, headers)

    sim.account.hold(key, worst)
    sim.key_in_flight[key.label] = sim.key_in_flight.get(key.label, 0) + 1
    tap: list[bytes] | None = [] if cache is not None and stream else None
    try:
        answer = _attempts(
            sim,
            request,
            record,
            key,
            body,
            model,
            candidates,
            prompt_tokens,
            max_tokens,
            rng,
            tool_request,
            images=images,
            choices=choices,
            sticky=sticky,
            output=output,
            cache=cache,
            tap=tap,
            squeeze=squeeze,
        )
    except BaseException:
        _release(sim, key, worst)
        raise
    if _made(answer):
        _release(sim, key, worst)
        return answer if cache is None else keep_answer(sim, record, cache, tap, answer)
    if cache is not None:
        answer = _kept_when_answered(answer, sim, record, cache, tap)
    return _held_until_answered(answer, sim, key, worst)


async def _kept_when_answered(
    answer: Awaitable[web.StreamResponse],
    sim: Simulator,
    record: RequestRecord,
    cache: CacheLookup,
    tap: list[bytes] | None,
) -> web.StreamResponse:
    return keep_answer(sim, record, cache, tap, await answer)


class _ServedPairs(dict[str, tuple[str, int]]):
    """``(tag, 200)`` per tag, one shared tuple each: the request log keeps one per
    answer, and a shared one is not a new object for the collector to count and walk."""

    def __missing__(self, tag: str) -> tuple[str, int]:
        self[tag] = pair = (tag, 200)
        return pair


_SERVED = _ServedPairs()


def _release(sim: Simulator, key: KeyState, worst: int) -> None:
    """The request is over: its key's in-flight count and its hold on the credits go."""
    sim.key_in_flight[key.label] -= 1
    sim.account.release(key, worst)


async def _held_until_answered(
    answer: Awaitable[web.StreamResponse], sim: Simulator, key: KeyState, worst: int
) -> web.StreamResponse:
    try:
        return await answer
    finally:
        _release(sim, key, worst)


async def _in_flight_until_answered(
    answer: Awaitable[web.StreamResponse], sim: Simulator, tag: str
) -> web.StreamResponse:
    try:
        return await answer
    finally:
        sim.in_flight[tag] -= 1


def _attempts(
    sim: Simulator,
    request: web.Request,
    record: RequestRecord,
    key: KeyState,
    body: dict[str, Any],
    model: ModelSpec,
    candidates: Sequence[EndpointSpec],
    prompt_tokens: int,
    max_tokens: int | None,
    rng: Draws,
    tool_request: ToolRequest | None,
    *,
    images: int = 0,
    choices: int = 1,
    sticky: tuple[str, str, object] | None = None,
    output: OutputFormat | None = None,
    cache: CacheLookup | None = None,
    tap: list[bytes] | None = None,
    squeeze: bool | None = None,
) -> Answer:
    failure: web.Response | None = None
    failure_kind = "error"
    stream = record.stream
    metadata = wants_metadata(request.headers)
    for endpoint in candidates:
        tag = endpoint.tag
        fault: Fault | None = None
        if sim.faults.attempt:
            in_flight = sim.in_flight.get(tag, 0)
            fault = sim.faults.check_attempt(
                tag, endpoint.slug, key.label, model.id, stream, sim.now(), rng, in_flight
            )
        down = sim.is_down(tag, endpoint.slug, endpoint.down) if sim.down else endpoint.down
        if down or (fault is not None and fault.kind in ATTEMPT_KINDS):
            failure, failure_kind = _attempt_failure(sim, fault, endpoint, model)
            record.attempts.append((tag, failure.status))
            sim.log.counters["fault." + failure_kind] += 1
            if failure_kind != "rate_limit":
                # A 429 is no outage: uptime leaves rate-limited requests out, and the
                # traffic-routing guide meets them with a traffic cap (the fallback here).
                sim.failed_at[tag] = sim.now()
            if fault is not None and fault.no_fallback:
                break
            continue
        refused = endpoint.refused_parameter(body) if endpoint.fixed_parameters else None
        if refused is not None:  # the vendor's fixed parameter: the next endpoint may take it
            failure, failure_kind = _refused_parameter(endpoint, refused), "refused_parameter"
            record.attempts.append((tag, 400))
            sim.log.counters["refused_parameter"] += 1
            continue
        record.attempts.append(_SERVED[tag])
        served_body, served_prompt = body, prompt_tokens
        pipeline: tuple[dict[str, Any], ...] = ()
        if not _fits(endpoint, prompt_tokens, max_tokens) and compresses(endpoint, squeeze):
            squeezed = compress(body, endpoint, max_tokens)
            if squeezed is not None:  # routing only kept the endpoint if it could
                served_body, served_prompt = squeezed.body, squeezed.prompt_tokens
                pipeline = (squeezed.stage,)
                record.compressed = True
                sim.log.counters["context_compression"] += 1
        serves = endpoint.serves
        if serves is not None:  # `after_requests`: honest until its onset (degradation.py)
            record.degraded = sim.onsets.degraded(tag, serves)
            if not record.degraded:
                endpoint, serves = sim.onsets.honest(tag, endpoint), None
        if sticky is not None:
            sim.sticky.remember(sticky, endpoint, sim.now())
        if fault is not None:
            sim.log.counters["fault." + fault.kind] += 1
        attempt = Attempt(
            sim,
            request,
            record,
            key,
            served_body,
            model,
            endpoint,
            served_prompt if serves is None else serves.prompt_tokens(served_prompt),
            max_tokens,
            rng,
            fault,
            tool_request,
            images=images,
            choices=choices,
            output=output,
        )
        if cache is not None:  # a stream's headers leave with its first byte
            attempt.headers, attempt.tap = cache.miss_headers(), tap
        if sticky is not None and not isinstance(sticky[2], str):
            attempt.sticky = sticky  # a conversation sticks once it reads from cache
        if metadata:
            attempt.metadata = router_metadata(
                body, model, candidates, endpoint, record.attempts, pipeline
            )
        sim.in_flight[tag] = sim.in_flight.get(tag, 0) + 1
        try:
            answer = serve(attempt)
        except BaseException:
            sim.in_flight[tag] -= 1
            raise
        if _made(answer):
            sim.in_flight[tag] -= 1
            return answer
        return _in_flight_until_answered(answer, sim, tag)
    assert failure is not None
    record.outcome = failure_kind
    if metadata and failure.status in METADATA_ON_ERRORS:
        trace = router_metadata(body, model, candidates, None, record.attempts)
        return _with_metadata(failure, trace)
    return failure


def _fits(endpoint: EndpointSpec, prompt_tokens: int, max_tokens: int | None) -> bool:
    if prompt_tokens + (max_tokens or 0) > endpoint.context_length:
        return False
    limit = endpoint.max_prompt_tokens
    return limit is None or prompt_tokens <= limit


def _refused_parameter(endpoint: EndpointSpec, message: str) -> web.Response:
    """The provider's 400 for a parameter its vendor fixed, relayed as OpenRouter relays
    an upstream error (the message as Moonshot's API words it)."""
    body = bodies.provider_error_body(400, endpoint.provider_name, message, "invalid_request")
    return web.Response(body=bodies.dumps(body), status=400, content_type="application/json")


def _with_metadata(failure: web.Response, metadata: dict[str, Any]) -> web.Response:
    """An upstream failure with ``openrouter_metadata`` beside its ``error``."""
    assert isinstance(failure.body, bytes)
    payload = loads(failure.body)
    payload["openrouter_metadata"] = metadata
    return web.Response(
        body=bodies.dumps(payload),
        status=failure.status,
        content_type="application/json",
        headers={k: v for k, v in failure.headers.items() if k.lower() == "retry-after"},
    )
