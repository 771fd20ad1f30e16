"""A streaming request answered 200 with something that is not an event stream.

Through a front server on loopback that passes every GET to the local OpenRouter and
answers the completion itself: a whole JSON chat completion (a server that ignored
``stream: true``) is the answer, paid and kept, never sent again; anything else (an
HTML page from a proxy, plain text) fails saying what it was, never as a connection
that could not reach OpenRouter. Either way the request was sent, so its money stays
held until OpenRouter's records say what it cost.
"""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from _router_helpers import MESSAGES, MakeRouter
from test_hostile_money import GENERATION, _front

from provider_router import APIConnectionError, InvalidResponseError, MemoryLedger, RetryPolicy
from provider_router.cli._event_phrases import describe_kind

COMPLETION = (
    b'{"id":"' + GENERATION.encode() + b'","provider":"Chutes","model":"moonshotai/kimi-k2.5",'
    b'"choices":[{"message":{"role":"assistant","content":"ola"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":2,"cost":0.00001}}'
)


def _answer(content_type: str, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\nX-Generation-Id: %b\r\n"
        b"Content-Length: %d\r\n\r\n%b"
    ) % (content_type.encode(), GENERATION.encode(), len(body), body)


async def _router(sim_factory: Any, make_router: MakeRouter, raw: bytes) -> Any:
    sim = await sim_factory()
    fronts = _front(sim.url, raw)
    url = await fronts.__anext__()
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(
        SimpleNamespace(url=url), ledger=ledger, retry=RetryPolicy(max_attempts=1)
    )
    return fronts, router, ledger


async def test_a_json_completion_to_a_streaming_request_is_the_answer(
    openrouter_sim_factory: Any, make_router: MakeRouter
) -> None:
    fronts, router, ledger = await _router(
        openrouter_sim_factory, make_router, _answer("application/json", COMPLETION)
    )
    try:
        result = await router.chat(MESSAGES, max_tokens=100, stream=True)
        assert result.text == "ola"
        assert result.finish_reason == "stop"
        assert result.generation_id == GENERATION
        assert result.cost == Decimal("0.00001")
        state = await ledger.snapshot()
        assert state.spent == Decimal("0.00001")
        assert state.reserved == 0
    finally:
        await fronts.aclose()


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [
        ("text/html; charset=utf-8", b"<html><body>Bad gateway</body></html>", "text/html"),
        ("text/plain", b"upstream connect error", "text/plain"),
        ("application/json", b'{"hello": "world"}', "application/json"),
    ],
)
async def test_a_200_that_is_not_a_stream_says_what_it_was(
    openrouter_sim_factory: Any,
    make_router: MakeRouter,
    content_type: str,
    body: bytes,
    said: str,
) -> None:
    fronts, router, ledger = await _router(
        openrouter_sim_factory, make_router, _answer(content_type, body)
    )
    try:
        with pytest.raises(InvalidResponseError) as caught:
            await router.chat(MESSAGES, max_tokens=100, stream=True)
        assert not isinstance(caught.value, APIConnectionError)
        message = str(caught.value)
        assert "streaming request" in message
        assert said in message
        assert "event stream" in message or "chat completion" in message
        # Sent, so maybe billed: held at its worst case, with the id that settles it.
        (held,) = router.unresolved
        assert held.generation_id == GENERATION
        assert (await ledger.snapshot()).released == 0
    finally:
        await fronts.aclose()
    sentence = describe_kind("route.failed", "InvalidResponseError", 3)
    assert "could not reach" not in sentence
    assert "not an event stream" in sentence
