"""``Router.set_policy``: a running router routes new requests under a new policy (what
``run --verify`` does when a provider fails a check mid-run); a request already
prepared keeps its plan."""

from __future__ import annotations

import asyncio
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


class _OutageCatalog(pr.Catalog):
    """The simulator's catalog, whose listing read once waits for ``outage``, then fails;
    reads after the first are answered from the first listing (no I/O: a refresh started
    meanwhile finishes within a turn of the event loop, unless something holds it)."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url, DEFAULT_TEST_KEY)
        self.outage: asyncio.Event | None = None
        self.reading = asyncio.Event()
        self._listing: pr.ModelEndpoints | None = None

    async def endpoints(self, model_id: str, *, refresh: bool = False) -> pr.ModelEndpoints:
        outage, self.outage = self.outage, None
        if outage is not None:
            self.reading.set()
            await outage.wait()
            raise pr.APIConnectionError("the listing could not be read")
        if self._listing is None:
            self._listing = await super().endpoints(model_id, refresh=refresh)
        return self._listing


async def test_a_refresh_while_set_policy_fails_never_leaves_policy_and_plan_disagreeing(
    openrouter_sim_factory: Factory,
) -> None:
    # set_policy's listing read fails after a plan refresh (the catalog's TTL) started:
    # the refresh must build from the policy left in force, never from the refused one
    # (which would exclude Chutes while the policy says it serves).
    sim = await openrouter_sim_factory(seed=2)
    async with (
        _OutageCatalog(sim.url) as catalog,
        pr.Router(
            "moonshotai/kimi-k2.5", endpoints=catalog, base_url=sim.url, api_key=DEFAULT_TEST_KEY
        ) as router,
    ):
        kept = router.policy
        assert "Chutes" in router.plan.allowed_providers
        catalog.outage = outage = asyncio.Event()
        refused = pr.ProviderPolicy(exclude_providers=["chutes"])
        change = asyncio.ensure_future(router.set_policy(refused))
        await catalog.reading.wait()
        refresh = asyncio.ensure_future(router._plans._refresh_plan())
        for _ in range(5):  # what a refresh nothing holds needs to finish
            await asyncio.sleep(0)
        outage.set()
        with pytest.raises(pr.APIConnectionError):
            await change
        await refresh
        assert router.policy is kept
        assert "Chutes" in router.plan.allowed_providers  # the plan is the policy's
        assert (await router.chat(HI, max_tokens=16)).provider == "Chutes"
