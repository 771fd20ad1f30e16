"""The local OpenRouter's mid-run switch: ``serves: {after_requests: K}`` serves the
model's own answers to the first K requests an endpoint serves, degraded ones after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from _markets import degraded_market

import provider_router as pr
from provider_router.testing import SimulatorServer
from provider_router.testing.market.degradation import _SWAPS, Onsets, Serves
from provider_router.testing.server import DEFAULT_TEST_KEY

Factory = Callable[..., Awaitable[SimulatorServer]]


def _swapped(text: str) -> int:
    return sum(text.count(word) for word in _SWAPS)


async def test_an_endpoint_turns_degraded_after_its_first_k_requests(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    market = degraded_market(tmp_path, {"chutes": {"agreement": 0.5, "after_requests": 4}})
    sim = await openrouter_sim_factory(market=market, seed=5)
    policy = pr.ProviderPolicy(only=["chutes"])
    async with pr.Router(
        "moonshotai/kimi-k2.5", policy=policy, base_url=sim.url, api_key=DEFAULT_TEST_KEY
    ) as router:
        texts = []
        for n in range(7):  # one at a time: the onset counts arrivals
            messages = [{"role": "user", "content": f"question {n}"}]
            result = await router.chat(messages, max_tokens=64, temperature=0, seed=1)
            texts.append(result.text)
    chats = [r for r in sim.requests if r.route == "chat"]
    assert [r.degraded for r in chats] == [False] * 4 + [True] * 3
    assert [_swapped(t) > 0 for t in texts] == [False] * 4 + [True] * 3


def test_onsets_count_per_endpoint() -> None:
    onsets = Onsets()
    late = Serves(agreement=0.7, after_requests=2)
    assert [onsets.degraded("a", late) for _ in range(4)] == [False, False, True, True]
    assert [onsets.degraded("b", late) for _ in range(3)] == [False, False, True]
    assert onsets.degraded("c", Serves(agreement=0.7)) is True  # 0: from the first
    assert onsets.degraded("d", None) is False


@pytest.mark.parametrize("value", [-1, 2.5, "soon"])
def test_a_bad_after_requests_is_named(tmp_path: Path, value: object) -> None:
    path = degraded_market(tmp_path, {"novita": {"after_requests": value}})  # type: ignore[dict-item]
    with pytest.raises(pr.DataFileError, match=r"serves.*after_requests"):
        SimulatorServer(market=path)
