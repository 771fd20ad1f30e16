"""The Batch API route's test job, as a fixture for every job test that needs one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest_asyncio
from _batch_api_helpers import K3, MAX_TOKENS, FakeTime, Job

from provider_router import MemoryLedger, ProviderPolicy
from provider_router._http.session import HttpClient
from provider_router.catalog.fetch import Catalog
from provider_router.routing.batch_endpoints import batch_route
from provider_router.routing.ranking import Workload
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer


@pytest_asyncio.fixture
async def job(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], tmp_path: Path
) -> AsyncIterator[Job]:
    clock = FakeTime()
    sim = await openrouter_sim_factory(speed=1.0, clock=clock, credits=50)
    async with HttpClient(sim.url, DEFAULT_TEST_KEY) as http, Catalog(sim.url) as catalog:
        listing = await catalog.batch_endpoints(K3)
        route = batch_route(
            listing,
            ProviderPolicy(exclude_below="int4"),
            Workload(prompt_tokens=20, completion_tokens=MAX_TOKENS),
        )
        async with MemoryLedger(Decimal(10)) as ledger:
            yield Job(sim, tmp_path, ledger, clock, http, route)
