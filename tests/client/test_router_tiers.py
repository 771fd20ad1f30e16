"""Service tiers through the Router: standard endpoints only by default; with
``allow_flex`` the flex endpoint competes on its price, is named by its tag, and the
reservation still covers the provider's standard price (billing follows the tier served)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal

from _router_helpers import MARKETS, MakeRouter

from provider_router import MemoryLedger, ProviderPolicy
from provider_router.testing import SimulatorServer

M = Decimal(1_000_000)
HELLO = [{"role": "user", "content": "hello"}]


async def test_flex_only_when_allowed_and_reserved_at_the_standard_price(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
    make_router: MakeRouter,
) -> None:
    sim = await openrouter_sim_factory(market=MARKETS / "tiered.yaml", completion_tokens=10)
    standard = await make_router(sim, model="acme/tiered", policy=ProviderPolicy())
    assert set(standard.plan.order) == {"google-vertex", "chutes"}
    assert standard.plan.max_completion_price == Decimal(5) / M, "priority ($8) not allowed"

    ledger = MemoryLedger(Decimal(1))
    flex_only = ProviderPolicy(allow_flex=True, service_tiers=["flex"])
    router = await make_router(sim, model="acme/tiered", policy=flex_only, ledger=ledger)
    assert router.plan.order == ("google-vertex/flex",)
    # Served on flex, billed at flex; the ceiling is the standard tier's, which a provider
    # may serve a flex request on.
    assert router.plan.max_prompt_price == Decimal(1) / M
    assert router.plan.max_completion_price == Decimal(4) / M
    result = await router.chat(HELLO, max_tokens=50)
    assert sim.requests[-1].attempts[-1][0] == "google-vertex/flex"
    assert result.usage is not None
    assert result.cost == (result.usage.prompt_tokens * Decimal("0.5") / M + 10 * Decimal(2) / M)
    assert result.reserved is not None
    assert result.reserved >= result.usage.prompt_tokens * Decimal(1) / M + 50 * Decimal(4) / M

    both = await make_router(sim, model="acme/tiered", policy=ProviderPolicy(allow_flex=True))
    assert both.plan.order[0] == "google-vertex/flex", "cheapest first"
    assert set(both.plan.order) == {"google-vertex/flex", "google-vertex", "chutes"}
