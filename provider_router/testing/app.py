"""The simulator's aiohttp application: every route but chat (``chat.py``), and :func:`make_app`.

:func:`make_app` binds a :class:`~provider_router.testing.simulator.Simulator` to an
``aiohttp.web.Application``; :data:`ROUTES` lists what it serves.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping

from aiohttp import web

from provider_router._money import to_units
from provider_router.testing import management
from provider_router.testing.batch_api import routes as batch_routes
from provider_router.testing.batch_api.lines import MAX_BATCH_BYTES
from provider_router.testing.billing import KeyState
from provider_router.testing.chat import bodies
from provider_router.testing.chat.completions import chat_completions
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.market.listing import ModelSpec
from provider_router.testing.market.variants import split_variants
from provider_router.testing.simulator import (
    FREE_MODEL_CREDIT_THRESHOLD,
    FREE_MODEL_DAILY_REQUESTS,
    JSON,
    SIM_KEY,
    Simulator,
    _finish,
    json_error,
    json_response,
)

__all__ = ["ROUTES", "Simulator", "make_app"]


MODELS_CACHE_HEADERS = {
    "Cache-Control": "public, max-age=300, stale-while-revalidate=3600, stale-if-error=3600"
}
"""What ``/models`` answers carry (API notes §1, captured headers)."""


async def models(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    record = sim.log.start("models")
    query = request.query
    body = sim.market.models_body
    if query.keys() & _MODEL_FILTERS:
        selected = _filtered_models(sim.market.models.values(), query)
        if isinstance(selected, web.Response):
            return _finish(sim, record, selected)
        body = selected
    response = web.Response(body=body, content_type=JSON, headers=MODELS_CACHE_HEADERS)
    return _finish(sim, record, response)


_MODEL_FILTERS = frozenset({"supported_parameters", "output_modalities", "offset", "limit"})


def _filtered_models(models: Iterable[ModelSpec], query: Mapping[str, str]) -> bytes | web.Response:
    """``/models`` with the description's filters: ``supported_parameters`` (all of a
    comma-separated list), ``output_modalities`` (default ``text``; ``all``), and
    ``offset``/``limit`` paging (limit at most 1000); a bad value is a 400."""
    unique = list({m.id: m for m in models}.values())
    listings = [m.listing() for m in unique]
    wanted = [p for p in query.get("supported_parameters", "").split(",") if p]
    if wanted:
        listings = [m for m in listings if set(wanted) <= set(m["supported_parameters"])]
    modalities = [p for p in query.get("output_modalities", "text").split(",") if p]
    if "all" not in modalities:
        listings = [
            m for m in listings if set(m["architecture"]["output_modalities"]) & set(modalities)
        ]
    try:
        offset = int(query.get("offset", "0"))
        limit = int(query.get("limit", "500"))
    except ValueError:
        return json_error(400, "offset and limit must be integers")
    if offset < 0 or not 1 <= limit <= 1000:
        return json_error(400, "offset must be ≥ 0 and limit between 1 and 1000")
    page = listings[offset : offset + limit]
    more = offset + limit < len(listings)
    next_link = f"/api/v1/models?offset={offset + limit}&limit={limit}" if more else None
    return json.dumps(
        {"data": page, "total_count": len(listings), "links": {"next": next_link}}
    ).encode()


async def providers(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    record = sim.log.start("providers")
    return _finish(sim, record, web.Response(body=sim.market.providers_body, content_type=JSON))


async def models_count(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    record = sim.log.start("models_count")
    body = sim.market.models_count_body
    return _finish(sim, record, web.Response(body=body, content_type=JSON))


def _per_model(
    request: web.Request, route: str, rendered: Mapping[str, bytes], missing: str
) -> web.StreamResponse:
    """A pre-rendered body for ``{author}/{slug}`` (id or canonical slug), else 404."""
    sim = request.app[SIM_KEY]
    record = sim.log.start(route)
    model_id = f"{request.match_info['author']}/{request.match_info['slug']}"
    record.model = model_id
    body = rendered.get(model_id)
    if body is None:
        # A routing variant (``:nitro``...) is not a catalog entry: its metadata is
        # the base model's (model-variants guide, "Routing variants").
        base, variant = split_variants(model_id)
        body = rendered.get(base) if variant else None
    if body is None:
        return _finish(sim, record, json_error(404, missing.format(model_id)))
    return _finish(sim, record, web.Response(body=body, content_type=JSON))


async def model(request: web.Request) -> web.StreamResponse:
    """``GET /model/{author}/{slug}``: one ``/models`` entry."""
    market = request.app[SIM_KEY].market
    return _per_model(request, "model", market.model_bodies, "Model {} not found")


async def endpoints(request: web.Request) -> web.StreamResponse:
    market = request.app[SIM_KEY].market
    if request.match_info["slug"].endswith(BATCH_SUFFIX):
        # The Batch API's own listing: `{slug}:batch` (an empty list: no batch endpoint).
        rendered = {f"{k}{BATCH_SUFFIX}": body for k, body in market.batch_endpoints_bodies.items()}
        return _per_model(request, "batch_endpoints", rendered, "No endpoints found for {}.")
    # Without a key the recent latency and throughput are null, as real listings show.
    bodies_ = (
        market.endpoints_bodies
        if "Authorization" in request.headers
        else market.anonymous_endpoints_bodies
    )
    return _per_model(request, "endpoints", bodies_, "No endpoints found for {}.")


BATCH_SUFFIX = ":batch"


AccountHandler = Callable[
    [Simulator, web.Request, RequestRecord, KeyState], Awaitable[web.Response]
]


def _account_route(
    route: str,
) -> Callable[[AccountHandler], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    """Wrap a route that needs a valid key: log it, answer 401 without one."""

    def wrap(handler: AccountHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def route_handler(request: web.Request) -> web.StreamResponse:
            sim = request.app[SIM_KEY]
            record = sim.log.start(route)
            key = sim.authenticate(request)
            if isinstance(key, web.Response):
                return _finish(sim, record, key)
            record.key_label = key.label
            return _finish(sim, record, await handler(sim, request, record, key))

        return route_handler

    return wrap


@_account_route("key")
async def key_info(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    usage = bodies.usd(key.usage)
    limit = None if key.limit is None else bodies.usd(key.limit)
    remaining = None if key.limit is None else bodies.usd(key.limit - key.usage)
    # The only budget layer the simulator has is the key's own limit (no guardrails,
    # no workspace budgets); it never resets, like a key limit without limit_reset.
    budgets = []
    if key.limit is not None:
        budgets.append(
            {
                "scope": "key_limit",
                "budget_id": None,
                "guardrail_id": None,
                "include_byok": False,
                "limit_usd": limit,
                "spend_usd": usage,
                "remaining_usd": remaining,
                "reset_interval": None,
                "resets_at": None,
            }
        )
    low, high = FREE_MODEL_DAILY_REQUESTS
    free_limit = high if sim.account.credits >= to_units(FREE_MODEL_CREDIT_THRESHOLD) else low
    data = {
        "label": key.label,
        **management.limit_and_usage(key),
        "is_free_tier": False,
        "is_management_key": key.management,
        "is_provisioning_key": key.management,
        "creator_user_id": bodies.USER_ID,
        "expires_at": management.key_object(key)["expires_at"],
        "rate_limit": {
            "requests": -1,
            "interval": "10s",
            "note": "This field is deprecated and safe to ignore.",
        },
        "allowed_data_regions": ["global"],
        "budgets": budgets,
        "effective_budget": budgets[0] if budgets else None,
        # The simulated market has no :free variants, so nothing counts against it.
        "free_model_daily_requests": {"limit": free_limit, "remaining": free_limit, "used": 0},
        "organization_id": None,
        "workspace_id": None,
    }
    return json_response({"data": data})


@_account_route("credits")
async def credits(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    data = {
        "total_credits": bodies.usd(sim.account.credits),
        "total_usage": bodies.usd(sim.account.usage),
    }
    return json_response({"data": data})


@_account_route("generation")
async def generation(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    gen_id = request.query.get("id", "")
    record.generation_id = gen_id or None
    if not gen_id:
        return json_error(400, "Missing required query parameter: id")
    data = sim.generations.get(gen_id)
    if data is not None and data.key_label != key.label:
        data = None
    if data is not None:
        misses = sim.generation_misses.get(gen_id, 0)
        if misses < sim.generation_404s:
            # The real record shows up a moment after the response; clients retry.
            sim.generation_misses[gen_id] = misses + 1
            data = None
    if data is None:
        return json_error(404, f"Generation {gen_id} not found")
    body = data.body()
    # The original generation of a response-cache hit (null otherwise).
    body["response_cache_source_id"] = sim.response_cache.source_of(gen_id)
    return json_response({"data": body})


async def not_found(request: web.Request) -> web.StreamResponse:
    """Any other path under ``/api/v1``: OpenRouter's JSON 404, saying it is not simulated.

    An SDK then raises its typed not-found error (not a parse error on text/plain),
    and the message says which routes are.
    """
    sim = request.app[SIM_KEY]
    record = sim.log.start("not_found")
    message = (
        f"{request.method} {request.path} is not served by the local OpenRouter "
        "(provider-router simulate --help lists the routes it serves)"
    )
    return _finish(sim, record, json_error(404, message))


ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/models", "the market's models (no key needed)"),
    ("GET", "/models/count", "how many models the market lists"),
    ("GET", "/model/{author}/{slug}", "one model, by id or canonical slug"),
    ("GET", "/models/{author}/{slug}/endpoints", "a model's provider endpoints"),
    ("GET", "/providers", "the providers of the market"),
    ("POST", "/chat/completions", "chat, JSON or SSE stream"),
    ("GET", "/generation", "a served generation by ?id= (lags a moment)"),
    ("GET", "/key", "the calling key's usage, limit and budgets"),
    ("GET", "/auth/key", "the same as /key (older path)"),
    ("GET", "/credits", "the account's credits and usage"),
    ("POST", "/batches", "submit a batch (202 validating; also under /api/beta)"),
    ("GET", "/batches", "the key's batches, newest first (limit, after, status, created_*)"),
    ("GET", "/batches/{batch_id}", "one batch; terminal ones with results (402: unpaid)"),
    ("GET", "/batches/{batch_id}/results", "a terminal batch's results, paginated"),
    ("DELETE", "/batches/{batch_id}", "delete a terminal batch (409 otherwise)"),
    ("POST", "/keys", "make a key (management key; 201, the key shown once)"),
    ("GET", "/keys", "the account's keys, newest first (management key)"),
    ("GET", "/keys/{hash}", "one key by hash (management key)"),
    ("PATCH", "/keys/{hash}", "change a key: name, disabled, limit (management key)"),
    ("DELETE", "/keys/{hash}", "delete a key (management key)"),
)
"""Every route served under ``/api/v1``: (method, path, what it answers).

``provider-router simulate --help`` prints this table; docs/simulator.md has the
fidelity of each."""


def make_app(sim: Simulator) -> web.Application:
    """An aiohttp application serving ``sim`` under ``/api/v1`` (the routes in :data:`ROUTES`)."""
    handlers: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
        "/models": models,
        "/models/count": models_count,
        "/model/{author}/{slug}": model,
        "/models/{author}/{slug}/endpoints": endpoints,
        "/providers": providers,
        "/chat/completions": chat_completions,
        "/generation": generation,
        "/key": key_info,
        "/auth/key": key_info,
        "/credits": credits,
    }
    batch_handlers = {
        ("POST", "/batches"): _account_route("batch_submit")(batch_routes.submit_batch),
        ("GET", "/batches"): _account_route("batch_list")(batch_routes.list_batches),
        ("GET", "/batches/{batch_id}"): _account_route("batch_get")(batch_routes.get_batch),
        ("GET", "/batches/{batch_id}/results"): _account_route("batch_results")(
            batch_routes.batch_results
        ),
        ("DELETE", "/batches/{batch_id}"): _account_route("batch_delete")(
            batch_routes.delete_batch
        ),
    }
    key_handlers = {
        ("POST", "/keys"): _account_route("keys_create")(management.create_key),
        ("GET", "/keys"): _account_route("keys_list")(management.list_keys),
        ("GET", "/keys/{hash}"): _account_route("keys_get")(management.get_key),
        ("PATCH", "/keys/{hash}"): _account_route("keys_update")(management.update_key),
        ("DELETE", "/keys/{hash}"): _account_route("keys_delete")(management.delete_key),
    }
    # A batch body may reach 200 MB (the Batch API's limit); chat bodies stay far smaller.
    app = web.Application(client_max_size=MAX_BATCH_BYTES + 1024 * 1024)
    app[SIM_KEY] = sim
    for method, path, _ in ROUTES:
        handler = (
            batch_handlers.get((method, path)) or key_handlers.get((method, path)) or handlers[path]
        )
        app.router.add_route(method, "/api/v1" + path, handler)
    for (method, path), handler in batch_handlers.items():
        app.router.add_route(method, "/api/beta" + path, handler)
    app.router.add_route("*", "/api/v1/{tail:.*}", not_found)
    return app
