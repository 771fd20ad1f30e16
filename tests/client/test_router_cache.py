"""Prefix caching through the Router: multi-turn hits, cache reads and writes priced
exactly as the local OpenRouter bills them, reservations covering them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from _router_helpers import MakeRouter

from provider_router import MemoryLedger, ProviderPolicy
from provider_router.testing import SimulatorServer
from provider_router.testing.chat.synth import count_prompt_tokens

MARKET = """
models:
  - id: acme/chat
    endpoints:
      - provider: Chutes
        quantization: bf16
        pricing: {prompt: "1", completion: "2", input_cache_read: "0.1", input_cache_write: "1.25"}
        supports_implicit_caching: true
        cache_min_tokens: 32
"""
SYSTEM = {"role": "system", "content": "You are a patient tutor. " * 30}


def tokens(messages: list[dict[str, Any]]) -> int:
    return count_prompt_tokens(messages) - count_prompt_tokens([])


async def test_a_conversation_reads_its_earlier_turns_and_every_cost_is_exact(
    tmp_path: Path,
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
    make_router: MakeRouter,
) -> None:
    market = tmp_path / "market.yaml"
    market.write_text(MARKET)
    sim = await openrouter_sim_factory(market=market, completion_tokens=30)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(
        sim, model="acme/chat", ledger=ledger, policy=ProviderPolicy(exclude_below="int4")
    )
    conversation: list[dict[str, Any]] = [SYSTEM]
    results = []
    for turn in range(3):
        conversation.append({"role": "user", "content": f"Question {turn}: why?"})
        result = await router.chat(conversation, max_tokens=100)
        # The previous request's prompt (everything but the last answer and question).
        results.append((result, tokens(conversation[:-2])))
        conversation.append({"role": "assistant", "content": result.text})
    for index, (result, earlier) in enumerate(results):
        usage = result.usage
        assert usage is not None
        assert usage.cached_tokens == (0 if index == 0 else earlier)
        written = usage.prompt_tokens - count_prompt_tokens([]) - usage.cached_tokens
        assert usage.cache_write_tokens == written, "the rest of the prompt is written"
        assert result.cost == result.estimate, "our price of reads and writes is OpenRouter's"
        assert result.reserved is not None
        assert result.reserved >= result.cost
    state = await ledger.snapshot()
    assert state.spent == sum(r.cost for r, _ in results if r.cost is not None)
    assert state.spent == sim.simulator.usage
