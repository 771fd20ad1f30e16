"""``Router.set_policy``: a running router routes new requests under a new policy (what
``run --verify`` does when a provider fails a check mid-run); a request already
prepared keeps its plan."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import provider_router as pr
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

Factory = Callable[..., Awaitable[SimulatorServer]]
HI = [{"role": "user", "content": "hi"}]


async def test_new_requests_follow_the_new_policy(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(seed=2)
    policy = pr.ProviderPolicy(exclude_below="int4")
    async with pr.Router(
        "moonshotai/kimi-k2.5", policy=policy, base_url=sim.url, api_key=DEFAULT_TEST_KEY
    ) as router:
        first = await router.chat(HI, max_tokens=16)
        assert first.provider == "Chutes"
        await router.set_policy(
            pr.ProviderPolicy(exclude_below="int4", exclude_providers=["chutes"])
        )
        assert "Chutes" not in router.plan.allowed_providers
        second = await router.chat(HI, max_tokens=16)
        assert second.provider != "Chutes"
        assert not second.quarantined
    sent = [r for r in sim.requests if r.route == "chat"]
    assert "chutes" in sent[-1].routing["ignore"]


async def test_a_policy_that_allows_nothing_is_refused_and_the_plan_kept(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory(seed=2)
    async with pr.Router(
        "moonshotai/kimi-k2.5", base_url=sim.url, api_key=DEFAULT_TEST_KEY
    ) as router:
        plan, policy = router.plan, router.policy
        with pytest.raises(pr.ProviderRouterError):
            await router.set_policy(pr.ProviderPolicy(only=["nobody"]))
        assert router.plan is plan
        assert router.policy is policy
        assert (await router.chat(HI, max_tokens=16)).provider == "Chutes"
