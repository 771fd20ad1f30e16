"""An attempt dropped before any response header is held at its worst case (#21, item 9).

docs/client.md said such an attempt is released; it may have been billed (the
body was sent) and no generation id can say what it cost, so its worst case is
held (``Router.unresolved``) and counted when the router closes.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

from _router_helpers import KIMI, MESSAGES

from provider_router import (
    AllAttemptsFailed,
    APIConnectionError,
    Catalog,
    MemoryLedger,
    ProviderPolicy,
    RetryPolicy,
    Router,
)
from provider_router.testing import DEFAULT_TEST_KEY

Factory = Any


async def _read_then_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)  # the whole request arrived: it may be billed
    writer.close()


async def test_a_drop_before_any_header_holds_the_worst_case(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory()
    async with Catalog(sim.url) as catalog:
        listing = await catalog.endpoints(KIMI)
    server = await asyncio.start_server(_read_then_hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ledger = MemoryLedger(Decimal(1))
    router = Router(
        KIMI,
        base_url=f"http://127.0.0.1:{port}/api/v1",
        api_key=DEFAULT_TEST_KEY,
        policy=ProviderPolicy(exclude_below="int4"),
        endpoints=listing,
        ledger=ledger,
        retry=RetryPolicy.never(),
    )
    try:
        async with router:
            try:
                await router.chat(MESSAGES, max_tokens=50, key="q1")
            except (APIConnectionError, AllAttemptsFailed):
                pass
            else:
                raise AssertionError("the dropped attempt returned")
            [held] = router.unresolved
            assert held.generation_id is None
            state = await ledger.snapshot()
            assert (state.open, state.reserved) == (1, held.amount)  # held, not released
        state = await ledger.snapshot()
        assert (state.open, state.spent) == (0, held.amount)  # counted at worst case
    finally:
        server.close()
        await server.wait_closed()
