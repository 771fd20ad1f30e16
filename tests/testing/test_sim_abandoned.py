"""A client that goes away: billed as a provider that does not cancel (``bill_abandoned``),
or for what was sent; either way with an exact charge record and a ``/generation``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from _sim_client import chat_body
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from provider_router.testing.app import make_app
from provider_router.testing.chat.completions import chat_completions


class Gate:
    """The simulator's sleep: generation waits until the test opens it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        await self.opened.wait()


async def _read(request: Any) -> None:
    async with request as response:
        await response.read()


async def _leave_early(sim: SimulatorServer, stream: bool, **extra: Any) -> None:
    """Send a request, read at most its headers, and go away (as a killed client does)."""
    headers = {"Authorization": f"Bearer {DEFAULT_TEST_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        request = session.post(
            f"{sim.url}/chat/completions", json=chat_body(max_tokens=200, stream=stream, **extra)
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
        speed=1000, sleep=gate, clock=lambda: 0.0, completion_tokens=120, cancellation="all"
    )
    await _leave_early(sim, stream=True)
    (record,) = sim.requests
    assert record.completion_tokens == 0  # nothing was generated before it left
    assert sim.simulator.abandoned_pending == 0
    # The prompt was billed, and /generation says so (recovery can ask for it).
    assert record.cost == sim.simulator.usage > 0
    assert record.generation_id in sim.simulator.generations


class _ClosedTransport(asyncio.Transport):
    """The connection of a client killed after sending its request: already closing."""

    def is_closing(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


class _GoneProtocol(BaseProtocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.transport = _ClosedTransport()
        self.ssl_context = None
        self.peername = ("127.0.0.1", 1)
        self.sockname = ("127.0.0.1", 2)


async def test_a_stream_client_gone_before_its_headers_is_a_client_that_left(
    openrouter_sim_factory: Any,
) -> None:
    """Killed between sending its request and the headers (seen under kill -9): before,
    ``prepare`` raised out of the handler and aiohttp logged a server error with a
    traceback per request; now it is ``client_closed`` and billed like any client that
    left (the prompt, with a /generation record for recovery)."""
    sim = await openrouter_sim_factory(completion_tokens=120)
    loop = asyncio.get_running_loop()
    protocol = _GoneProtocol(loop)
    body = json.dumps(chat_body(max_tokens=200, stream=True)).encode()
    payload = StreamReader(protocol, 2**16, loop=loop)
    payload.feed_data(body)
    payload.feed_eof()
    request = make_mocked_request(
        "POST",
        "/api/v1/chat/completions",
        headers={
            "Authorization": f"Bearer {DEFAULT_TEST_KEY}",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        },
        app=make_app(sim.simulator),
        protocol=protocol,
        transport=protocol.transport,
        writer=StreamWriter(protocol, loop),
        payload=payload,
    )
    await chat_completions(request)  # raised ClientConnectionResetError before
    (record,) = sim.requests
    assert record.outcome == "client_closed"
    assert record.completion_tokens == 0
    assert record.cost == sim.simulator.usage > 0
    assert record.generation_id in sim.simulator.generations
