"""Stream deadlines (issue #10): they scale with max_tokens; a stream cut while still
delivering tokens ends as it stands and is settled, not retried blind."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter

from provider_router import MemoryLedger, RequestTimeout, RetryPolicy, Router, Timeouts
from provider_router._constants import STREAM_DEADLINE_BASE, STREAM_DEADLINE_TOKENS_PER_SECOND
from provider_router.client.streaming import DEADLINE_FINISH
from provider_router.testing import SimulatorServer


async def test_the_default_stream_deadline_scales_with_max_tokens(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    short = router._build_request(MESSAGES, 100, True, None, None, {})
    long = router._build_request(MESSAGES, 8192, True, None, None, {})
    plain = router._build_request(MESSAGES, 8192, False, None, None, {})
    assert short.deadline == STREAM_DEADLINE_BASE + 100 / STREAM_DEADLINE_TOKENS_PER_SECOND
    assert long.deadline == STREAM_DEADLINE_BASE + 8192 / STREAM_DEADLINE_TOKENS_PER_SECOND
    assert long.deadline > 600  # the old fixed deadline cut 8k-token answers
    assert plain.deadline == router.timeouts.request
    fixed = await make_router(openrouter_sim, timeouts=Timeouts(stream_deadline=30))
    assert fixed._build_request(MESSAGES, 8192, True, None, None, {}).deadline == 30
    with pytest.raises(ValueError, match="stream_deadline"):
        Router(KIMI, timeouts=Timeouts(stream_deadline=0))


class UntilCharged:
    """A router sleep that returns once the simulator has billed the cut stream."""

    def __init__(self, sim: SimulatorServer) -> None:
        self.sim = sim
        self.calls = 0

    async def __call__(self, seconds: float) -> None:
        self.calls += 1
        for _ in range(2000):
            if any(r.status == 499 for r in self.sim.requests):
                return
            await asyncio.sleep(0.001)


async def test_a_stream_still_delivering_at_its_deadline_ends_as_it_stands(
    openrouter_sim_factory: Any, make_router: MakeRouter
) -> None:
    # 2,000 tokens at ~50 tokens/s take ~40 simulated seconds: 2 s of real time at
    # speed 20, far beyond the 0.3 s deadline, with tokens flowing when it passes.
    sim = await openrouter_sim_factory(speed=20, completion_tokens=2000)
    ledger = MemoryLedger(Decimal(1))
    sleep = UntilCharged(sim)
    router = await make_router(
        sim,
        ledger=ledger,
        timeouts=Timeouts(stream_deadline=0.3),
        sleep=sleep,
        retry=RetryPolicy(max_attempts=3),
    )
    result = await router.chat(MESSAGES, max_tokens=2000, stream=True)
    assert result.finish_reason == DEADLINE_FINISH
    assert result.attempts == 1  # not retried blind
    assert result.text or result.reasoning
    assert len(sim.requests) == 1
    # Settled at what OpenRouter says the cut stream cost: the tokens it delivered.
    state = await ledger.snapshot()
    assert state.reserved == 0
    assert result.cost == state.spent == sim.simulator.usage > 0


async def test_a_stream_silent_at_its_deadline_is_a_timeout(
    openrouter_sim_factory: Any, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(speed=20, completion_tokens=2000)
    sim.add_fault({"kind": "hang", "times": 1, "no_fallback": True})
    router = await make_router(
        sim, timeouts=Timeouts(stream_deadline=0.2), retry=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(RequestTimeout):
        await router.chat(MESSAGES, max_tokens=2000, stream=True)
