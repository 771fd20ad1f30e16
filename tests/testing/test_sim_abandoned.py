"""A client that goes away: billed as a provider that does not cancel (``bill_abandoned``),
or for what was sent; either way with an exact charge record and a ``/generation``."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from _sim_client import chat_body

from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer


class Gate:
    """The simulator's sleep: generation waits until the test opens it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        await self.opened.wait()


async def _read(request: Any) -> None:
    async with request as response:
        await response.read()


async def _leave_early(sim: SimulatorServer, stream: bool) -> None:
    """Send a request, read at most its headers, and go away (as a killed client does)."""
    headers = {"Authorization": f"Bearer {DEFAULT_TEST_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        request = session.post(
            f"{sim.url}/chat/completions", json=chat_body(max_tokens=200, stream=stream)
        )
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_read(request), 0.1)
    for _ in range(2000):  # the server notices the closed connection a few turns later
        if sim.simulator.abandoned_pending or any(r.status == 499 for r in sim.requests):
            return
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_abandoned_generation_is_billed_in_full_when_it_ends(
    openrouter_sim_factory: Any, stream: bool
) -> None:
    gate = Gate()
    sim = await openrouter_sim_factory(
        speed=1000,
        sleep=gate,
        clock=lambda: 0.0,  # simulated time stands still until the gate opens
        bill_abandoned=True,
        completion_tokens=120,
        generation_404s=0,
    )
    await _leave_early(sim, stream)
    assert sim.simulator.usage == 0  # still generating: not billed yet
    assert sim.simulator.abandoned_pending == 1
    gate.opened.set()
    await sim.simulator.settle_abandoned()
    (record,) = sim.requests
    assert record.completion_tokens == 120  # the whole generation
    assert record.cost == sim.simulator.usage > 0
    generation = sim.simulator.generations[record.generation_id]
    assert generation.body()["tokens_completion"] == 120


async def test_without_the_option_a_stream_pays_for_what_was_sent(
    openrouter_sim_factory: Any,
) -> None:
    gate = Gate()
    sim = await openrouter_sim_factory(
        speed=1000, sleep=gate, clock=lambda: 0.0, completion_tokens=120
    )
    await _leave_early(sim, stream=True)
    (record,) = sim.requests
    assert record.completion_tokens == 0  # nothing was generated before it left
    assert sim.simulator.abandoned_pending == 0
    # The prompt was billed, and /generation says so (recovery can ask for it).
    assert record.cost == sim.simulator.usage > 0
    assert record.generation_id in sim.simulator.generations
