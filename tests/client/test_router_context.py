"""A request that cannot fit: refused before sending when even a lower bound of its
prompt plus its completion cap exceeds every allowed context; otherwise OpenRouter's
400 is final, names the limit, and the reservation is released (nothing paid)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal

import pytest
from _router_helpers import MARKETS, MakeRouter

from provider_router import (
    BadRequestError,
    ContextLengthExceeded,
    MemoryLedger,
    ProviderPolicy,
)
from provider_router.testing import SimulatorServer


async def test_a_prompt_too_long_is_final_and_costs_nothing(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
    make_router: MakeRouter,
) -> None:
    sim = await openrouter_sim_factory(market=MARKETS / "context.yaml", completion_tokens=10)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, model="acme/ctx", ledger=ledger, policy=ProviderPolicy())
    too_long = [{"role": "user", "content": "abcd" * 5000}]
    with pytest.raises(BadRequestError) as caught:
        await router.chat(too_long, max_tokens=100)
    assert caught.value.context_limit == 4096
    assert caught.value.requested_tokens is not None
    assert caught.value.requested_tokens > 4096
    assert caught.value.error_type == "context_length_exceeded"
    assert len(sim.requests) == 1, "final: not retried"
    state = await ledger.snapshot()
    assert state.spent == 0
    assert state.reserved == 0
    assert sim.simulator.usage == 0
    # A prompt that cannot fit even at 32 bytes a token: refused before anything is sent.
    with pytest.raises(ContextLengthExceeded, match=r"largest context length .*4,096 tokens"):
        await router.chat([{"role": "user", "content": "abcd" * 40_000}], max_tokens=100)
    assert len(sim.requests) == 1
    # A completion cap that alone exceeds the context is OpenRouter's 400, final, unpaid.
    with pytest.raises(BadRequestError, match="maximum context length"):
        await router.chat([{"role": "user", "content": "hi"}], max_tokens=5000)
    assert len(sim.requests) == 2
    # What fits is served.
    result = await router.chat([{"role": "user", "content": "hello"}], max_tokens=100)
    assert result.cost == sim.simulator.usage


def test_the_limit_is_read_only_from_a_context_length_error() -> None:
    error = BadRequestError(400, "Invalid value for temperature", error_type="invalid_request")
    assert error.context_limit is None
    assert error.requested_tokens is None
