"""The pytest fixture starts a working simulator."""

from __future__ import annotations

import aiohttp

from provider_router.testing import SimulatorServer


async def test_fixture_serves_a_completion(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    headers = {"Authorization": f"Bearer {openrouter_api_key}"}
    body = {
        "model": "moonshotai/kimi-k2.5",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
    }
    url = openrouter_sim.url + "/chat/completions"
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(url, json=body) as response,
    ):
        assert response.status == 200
        data = await response.json()
    assert data["usage"]["completion_tokens"] <= 50
    assert openrouter_sim.requests[0].provider == data["provider"]
