"""The reservation covers everything a request can be billed for, or the field is refused.

Each test runs against the local OpenRouter, which bills what OpenRouter bills
(``max_completion_tokens``, tool definitions, images and their fees), so a
reservation that forgets a field shows up as a cost above it or as a budget overspent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter

from provider_router import (
    BudgetExhausted,
    ConfigurationError,
    Ledger,
    MemoryLedger,
    ProviderPolicy,
    Router,
    SQLiteLedger,
)
from provider_router.catalog._billable import completion_cap
from provider_router.testing import DEFAULT_TEST_KEY, Market, SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=4000)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Looks things up. " * 2000,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}


def sim_charges(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests), Decimal(0))


async def test_the_larger_completion_cap_is_reserved(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    result = await router.chat(MESSAGES, max_tokens=10, max_completion_tokens=4000)
    assert result.usage is not None
    assert result.usage.completion_tokens == 4000  # what the provider honoured
    assert result.cost is not None
    assert result.reserved is not None
    assert result.cost == openrouter_sim.requests[-1].cost
    assert result.cost <= result.reserved
    # and the other way round: the larger cap is still the one reserved
    request = router._build_request(
        MESSAGES, 4000, False, None, None, {"max_completion_tokens": 10}
    )
    # Reserved at the admitted endpoint's own ceilings.
    route = router.plan.route(result.endpoint or "")
    assert route.worst_case(request.prompt_tokens, request.cap, request.images) == result.reserved


async def test_max_completion_tokens_alone_satisfies_a_ledger(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    result = await router.chat(MESSAGES, max_completion_tokens=300)
    assert result.usage is not None
    assert result.usage.completion_tokens == 300
    assert result.cost is not None
    assert result.reserved is not None
    assert result.cost <= result.reserved


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_three_routers_sharing_a_budget_never_overspend_it(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, backend: str, tmp_path: Any
) -> None:
    # The finding: max_tokens=10 reserved, 4000 honoured; on a shared limit the
    # charges reached 1.7x the budget.
    limit = Decimal("0.05")
    ledgers: list[Ledger] = [
        MemoryLedger(limit)
        if backend == "memory"
        else SQLiteLedger(tmp_path / "shared.ledger", limit=limit)
        for _ in range(1 if backend == "memory" else 3)
    ]
    routers = [
        await make_router(openrouter_sim, ledger=ledgers[i % len(ledgers)], budget_wait=True)
        for i in range(3)
    ]

    async def one(i: int) -> str:
        try:
            await routers[i % 3].chat(
                MESSAGES, max_tokens=10, max_completion_tokens=4000, key=f"p{i}"
            )
        except BudgetExhausted:
            return "budget"
        return "ok"

    outcomes = await asyncio.gather(*(one(i) for i in range(30)))
    assert outcomes.count("ok") > 0
    assert outcomes.count("budget") > 0
    assert sim_charges(openrouter_sim) <= limit
    state = await ledgers[0].snapshot()
    assert state.spent == sim_charges(openrouter_sim)
    assert state.overrun == 0
    for ledger in ledgers:
        await ledger.close()


async def test_tool_definitions_are_reserved_as_prompt(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    plain = await router.chat(MESSAGES, max_tokens=10)
    result = await router.chat(MESSAGES, max_tokens=10, tools=TOOLS, tool_choice="auto")
    assert result.usage is not None
    assert plain.usage is not None
    assert result.usage.prompt_tokens > plain.usage.prompt_tokens + 5000  # billed as prompt
    assert result.cost is not None
    assert result.reserved is not None
    assert result.cost <= result.reserved
    # Router-wide default fields count too.
    defaults = await make_router(
        openrouter_sim, ledger=MemoryLedger(Decimal(1)), params={"tools": TOOLS}
    )
    again = await defaults.chat(MESSAGES, max_tokens=10)
    assert again.cost is not None
    assert again.reserved is not None
    assert again.cost <= again.reserved


async def test_images_are_reserved_with_their_tokens_and_per_image_fee(
    openrouter_sim_factory: Any, make_router: MakeRouter
) -> None:
    market = Market.default()
    model = market.models[KIMI]
    fees = {"chutes": Decimal("0.004"), "novita": Decimal("0.002")}
    endpoints = tuple(
        dataclasses.replace(e, image=fees.get(e.tag, Decimal(0))) for e in model.endpoints
    )
    priced = Market([dataclasses.replace(model, endpoints=endpoints)], market.providers)
    sim = await openrouter_sim_factory(market=priced, completion_tokens=10)
    router = await make_router(sim, ledger=MemoryLedger(Decimal(1)))
    assert router.plan.provider_object()["max_price"]["image"] == "0.004"
    content = [{"type": "text", "text": "What are these?"}, IMAGE, IMAGE, IMAGE]
    result = await router.chat([{"role": "user", "content": content}], max_tokens=10)
    record = sim.requests[-1]
    assert record.routing is not None
    assert record.routing["max_price"]["image"] == "0.004"
    assert result.cost == record.cost
    assert result.cost is not None
    assert result.reserved is not None
    assert result.cost <= result.reserved
    if record.tag in fees:
        assert result.cost > 3 * fees[record.tag]  # the fee was billed, and covered


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n": 2}, "'n'"),
        ({"models": ["openai/gpt-4o"]}, "'models'"),
        ({"route": "fallback"}, "'route'"),
        ({"plugins": [{"id": "web"}]}, "'plugins'"),
        ({"web_search_options": {"search_context_size": "high"}}, "'web_search_options'"),
        ({"service_tier": "priority"}, "'service_tier'"),
        ({"modalities": ["text", "image"]}, "'modalities'"),
        ({"prediction": {"type": "content", "content": "x"}}, "'prediction'"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "'audio'"),
        ({"tools": [{"type": "web_search"}]}, r"'tools\[0\]'"),
        ({"max_completion_tokens": 0}, "'max_completion_tokens'"),
        ({"max_completion_tokens": "100"}, "'max_completion_tokens'"),
    ],
)
async def test_fields_that_cannot_be_priced_are_refused_before_sending(
    openrouter_sim: SimulatorServer,
    make_router: MakeRouter,
    fields: dict[str, Any],
    named: str,
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    with pytest.raises(ConfigurationError, match=named):
        await router.chat(MESSAGES, max_tokens=10, **fields)
    with pytest.raises(ConfigurationError, match=named):
        Router(KIMI, base_url=openrouter_sim.url, api_key=DEFAULT_TEST_KEY, params=fields)
    assert openrouter_sim.requests == []
    state = await router.ledger.snapshot()  # type: ignore[union-attr]
    assert (state.spent, state.reserved, state.open) == (0, 0, 0)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;x"}},
        {"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}},
        "just a string",
    ],
)
async def test_content_parts_that_cannot_be_priced_are_refused(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, part: Any
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]
    with pytest.raises(ConfigurationError, match=r"messages\[0\]\.content\[1\]"):
        await router.chat(messages, max_tokens=10)
    assert openrouter_sim.requests == []


async def test_allowed_service_tiers_and_n_of_one_pass(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    for fields in ({"n": 1}, {"service_tier": "default"}, {"service_tier": "flex"}):
        result = await router.chat(MESSAGES, max_tokens=10, **fields)
        assert result.cost is not None


def test_the_online_variant_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=":online"):
        Router(KIMI + ":online", policy=ProviderPolicy(), api_key=DEFAULT_TEST_KEY)


@pytest.mark.parametrize(
    ("max_tokens", "fields", "cap"),
    [
        (10, {}, 10),
        (10, {"max_completion_tokens": 4000}, 4000),
        (4000, {"max_completion_tokens": 10}, 4000),
        (None, {"max_completion_tokens": 30}, 30),
        (None, {"max_tokens": 20}, 20),  # a Router-wide default
        (100, {"reasoning": {"max_tokens": 2000}}, 2000),  # a reasoning budget above the cap
        (100, {"reasoning": {"max_tokens": 50}}, 100),
        (100, {"reasoning": {"effort": "high"}}, 100),
        (None, {"reasoning": {"max_tokens": 50}}, None),  # no cap given: still required
    ],
)
def test_the_completion_cap_is_the_largest_given(
    max_tokens: int | None, fields: dict[str, Any], cap: int | None
) -> None:
    assert completion_cap(max_tokens, fields) == cap
