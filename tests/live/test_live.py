"""The real OpenRouter and the local one, asked the same questions, answer alike.

Skipped unless ``OPENROUTER_LIVE=1`` and ``OPENROUTER_API_KEY`` are set (see
``conftest.py``). Each test spends at most a few cents: 1- to 5-token requests.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import pytest

from provider_router import ProviderPolicy
from provider_router._http.session import HttpClient
from provider_router.catalog.fetch import Catalog
from provider_router.checks.preflight import preflight
from provider_router.routing.ranking import Workload, rank
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

pytestmark = pytest.mark.live

MODEL = os.environ.get("OPENROUTER_LIVE_MODEL", "moonshotai/kimi-k2.5")
INT4 = ProviderPolicy(exclude_below="int4")


def keys(value: Any) -> set[str]:
    return set(value) if isinstance(value, dict) else set()


async def both(path: str, sim: SimulatorServer) -> tuple[Any, Any]:
    async with HttpClient() as real, HttpClient(sim.url, DEFAULT_TEST_KEY) as local:
        return await real.get_json(path), await local.get_json(path)


async def test_the_endpoints_listing_has_the_simulators_shape(
    openrouter_sim: SimulatorServer,
) -> None:
    real, local = await both(f"/models/{MODEL}/endpoints", openrouter_sim)
    assert keys(local["data"]) <= keys(real["data"]) | {"architecture"}
    real_endpoint, local_endpoint = real["data"]["endpoints"][0], local["data"]["endpoints"][0]
    assert keys(local_endpoint) <= keys(real_endpoint), keys(local_endpoint) - keys(real_endpoint)
    # The fields the newest SDK requires and real listings lacked (the field overlay):
    # when the real service starts sending them, the simulator should too.
    sdk_only = {"native_tools", "service_tier", "supports_diarization"}
    assert sdk_only & keys(real_endpoint) == sdk_only & keys(local_endpoint)
    async with Catalog() as catalog:
        listing = await catalog.endpoints(MODEL)  # every real endpoint parses
    assert listing.endpoints


async def test_key_and_credits_have_the_simulators_shape(openrouter_sim: SimulatorServer) -> None:
    real, local = await both("/key", openrouter_sim)
    assert {"limit", "limit_remaining", "usage"} <= keys(real["data"]) & keys(local["data"])


async def test_the_preflight_holds_on_the_real_service() -> None:
    report = await preflight(MODEL, INT4)
    assert report.ok, [(c.name, c.detail) for c in report.failures]


async def test_a_pinned_tiny_request_answers_alike(openrouter_sim: SimulatorServer) -> None:
    async with Catalog() as catalog:
        listing = await catalog.endpoints(MODEL)
    top = rank(
        INT4.evaluate(listing).allowed, workload=Workload(prompt_tokens=20, completion_tokens=5)
    )[0]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 5,
        "provider": {"only": [top.endpoint.tag], "allow_fallbacks": False},
    }
    async with HttpClient() as real, HttpClient(openrouter_sim.url, DEFAULT_TEST_KEY) as local:
        real_answer = await real.post_json("/chat/completions", body)
        local_answer = await local.post_json("/chat/completions", body)
    assert real_answer["provider"] == top.endpoint.provider_name
    assert keys(local_answer) <= keys(real_answer) | {"system_fingerprint"}
    assert {"prompt_tokens", "completion_tokens", "total_tokens", "cost"} <= keys(
        real_answer["usage"]
    )
    assert keys(local_answer["usage"]) <= keys(real_answer["usage"])
    usage = real_answer["usage"]
    expected = top.endpoint.pricing.cost(usage["prompt_tokens"], usage["completion_tokens"])
    # usage.cost is a JSON number: equal to the price arithmetic but for its float rounding.
    assert abs(expected - Decimal(repr(usage["cost"]))) <= Decimal("1e-10")
