"""Pytest fixtures for the local OpenRouter.

Enable with ``pytest_plugins = ["provider_router.testing.pytest_plugin"]`` in a
conftest. ``openrouter_sim`` is a running :class:`SimulatorServer` (the default market,
seed 0, $100 of credits, the key :data:`DEFAULT_TEST_KEY`, speed ``inf``: no waiting)
that tests change at runtime (``top_up``, ``add_fault``, ``set_down``);
``openrouter_sim_factory`` starts simulators with other settings
(``await factory(**kwargs)``), all stopped after the test; ``openrouter_api_key`` is
the key they accept. Settings at start-up can also come from a mark:
``@pytest.mark.openrouter_sim(faults=[...], credits=5, speed=1000)``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from provider_router.testing.server import DEFAULT_TEST_KEY, SimulatorServer

__all__ = ["openrouter_api_key", "openrouter_sim", "openrouter_sim_factory"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "openrouter_sim(**kwargs): settings for the openrouter_sim fixture"
    )


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("api_keys", [DEFAULT_TEST_KEY])
    kwargs.setdefault("speed", math.inf)
    return kwargs


@pytest.fixture
def openrouter_api_key() -> str:
    """The API key the simulator fixtures accept."""
    return DEFAULT_TEST_KEY


@pytest_asyncio.fixture
async def openrouter_sim(request: pytest.FixtureRequest) -> AsyncIterator[SimulatorServer]:
    """A running local OpenRouter (see the module docstring for its settings)."""
    marker = request.node.get_closest_marker("openrouter_sim")
    kwargs = _defaults(dict(marker.kwargs) if marker is not None else {})
    async with SimulatorServer(**kwargs) as sim:
        yield sim


@pytest_asyncio.fixture
async def openrouter_sim_factory() -> AsyncIterator[Callable[..., Awaitable[SimulatorServer]]]:
    """``await factory(**kwargs)`` starts another simulator; all stop after the test."""
    started: list[SimulatorServer] = []

    async def factory(**kwargs: Any) -> SimulatorServer:
        sim = SimulatorServer(**_defaults(kwargs))
        await sim.start()
        started.append(sim)
        return sim

    try:
        yield factory
    finally:
        for sim in reversed(started):
            await sim.stop()
