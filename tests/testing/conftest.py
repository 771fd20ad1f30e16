"""Fixtures for the simulator's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio
from _sim_client import SimClient, StartSim

from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer


@pytest_asyncio.fixture
async def start_sim(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
) -> AsyncIterator[StartSim]:
    """``sim, client = await start_sim(**kwargs)``: a simulator and a raw client for it."""
    clients: list[SimClient] = []

    async def start(
        key: str | None = DEFAULT_TEST_KEY, **kwargs: Any
    ) -> tuple[SimulatorServer, SimClient]:
        sim = await openrouter_sim_factory(**kwargs)
        client = SimClient(sim.url, key)
        clients.append(client)
        return sim, client

    try:
        yield start
    finally:
        for client in clients:
            await client.close()


@pytest_asyncio.fixture
async def client(openrouter_sim: SimulatorServer) -> AsyncIterator[SimClient]:
    """A raw client for the default ``openrouter_sim``."""
    session = SimClient(openrouter_sim.url, DEFAULT_TEST_KEY)
    try:
        yield session
    finally:
        await session.close()


@pytest_asyncio.fixture
async def openai_client(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> AsyncIterator[Any]:
    """The official ``openai`` SDK's async client on the default ``openrouter_sim``."""
    import openai

    async with openai.AsyncOpenAI(base_url=openrouter_sim.url, api_key=openrouter_api_key) as sdk:
        yield sdk
