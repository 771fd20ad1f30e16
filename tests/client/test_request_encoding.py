"""The request body encoded from precomputed parts, and the ledger writes per request."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter, route_first

from provider_router import ConfigurationError, MemoryLedger, Reservation, Router
from provider_router.client._request import RequestEncoder
from provider_router.testing import SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=20)


def _body(router: Router, stream: bool = False, **params: Any) -> dict[str, Any]:
    """The body of a request's first attempt: prepared, admitted and routed."""
    request = router._build_request(MESSAGES, 64, stream, None, None, params)
    route_first(router, request)
    decoded: dict[str, Any] = json.loads(request.payload)
    return decoded


async def test_body_is_the_same_json_as_a_dict_built_per_call(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, params={"temperature": 0.5, "top_p": 0.9})
    provider = dict(router.plan.route("chutes").object)  # the best endpoint, alone
    assert _body(router) == {
        "model": KIMI,
        "messages": MESSAGES,
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 64,
        "provider": provider,
    }
    # A call's own fields override the router's defaults; stream is the router's.
    assert _body(router, True, temperature=0.1, seed=3) == {
        "model": KIMI,
        "messages": MESSAGES,
        "temperature": 0.1,
        "top_p": 0.9,
        "seed": 3,
        "max_tokens": 64,
        "stream": True,
        "provider": provider,
    }
    # The shared defaults were not changed by the override.
    assert _body(router)["temperature"] == 0.5


async def test_demotion_changes_the_encoded_provider_object(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    first = _body(router)["provider"]["only"]
    for _ in range(5):
        router.health.record_failure("Chutes")
    assert router.health.is_demoted("Chutes")
    routed = _body(router)["provider"]
    assert first == ["chutes"]
    assert routed["only"] == ["novita"]  # the best endpoint not demoted
    assert routed["allow_fallbacks"] is False


def test_encoder_handles_no_fields_besides_messages() -> None:
    encoder = RequestEncoder("a/b", {})
    body = encoder.encode([{"role": "user", "content": "é"}], None, False, {}, b'{"only":[]}')
    assert json.loads(body) == {
        "model": "a/b",
        "messages": [{"role": "user", "content": "é"}],
        "provider": {"only": []},
    }
    assert body.isascii()  # non-ASCII text is escaped, as json.dumps does by default


@pytest.mark.parametrize("name", ["model", "provider", "messages", "stream"])
def test_router_defaults_cannot_set_what_the_router_sets(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Router(KIMI, params={name: "x"}, base_url="http://127.0.0.1:9")


class CountingLedger(MemoryLedger):
    """A MemoryLedger that counts attach calls."""

    def __init__(self, limit: Decimal) -> None:
        super().__init__(limit)
        self.attached: list[str] = []

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        self.attached.append(generation_id)
        await super().attach(reservation, generation_id)


async def test_a_complete_body_settles_with_its_id_without_a_separate_attach(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    ledger = CountingLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=50)
    assert ledger.attached == []
    assert result.generation_id == openrouter_sim.requests[-1].generation_id
    assert (await ledger.snapshot()).settled == 1
    # A stream names its id before its body ends: that one is attached at once.
    streamed = await router.chat(MESSAGES, max_tokens=50, stream=True)
    assert ledger.attached == [streamed.generation_id]
