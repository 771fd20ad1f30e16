"""Unknown is not free; a paid answer is never thrown away (issue #10, findings 2 and 3).

Each test drives a real Router over real sockets against the local OpenRouter and
compares the ledger with what the simulator really charged.
"""

from __future__ import annotations

import asyncio
import socket
from decimal import Decimal
from typing import Any

import pytest
from _blackhole import blackhole
from _router_helpers import KIMI, MESSAGES, MakeRouter, RecordingSleep

from provider_router import (
    APIConnectionError,
    LedgerWriteError,
    MemoryLedger,
    ProviderPolicy,
    ProviderUnavailableError,
    RequestTimeout,
    RetryPolicy,
    Router,
    Timeouts,
)
from provider_router.client._billing import LEDGER_RETRIES, provably_free
from provider_router.ledger import Reservation
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

ONCE = RetryPolicy(max_attempts=1)


class Gate:
    """An injected simulator sleep that waits until the test opens the gate."""

    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        await self.open.wait()


async def _charged_total(sim: SimulatorServer) -> Decimal:
    """What the simulator charged once the generations whose client left are billed."""
    for _ in range(2000):  # the server notices the closed connection a few loop turns later
        if sim.simulator.abandoned_pending or any(r.status == 499 for r in sim.requests):
            break
        await asyncio.sleep(0.001)
    await sim.simulator.settle_abandoned(now=True)
    return sim.simulator.usage


@pytest.mark.parametrize("stream", [False, True])
async def test_a_timeout_after_send_holds_the_worst_case_until_the_cost_is_known(
    openrouter_sim_factory: Any, make_router: MakeRouter, stream: bool
) -> None:
    gate = Gate()
    sim = await openrouter_sim_factory(
        speed=1000, sleep=gate, bill_abandoned=True, completion_tokens=40
    )
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(
        sim, ledger=ledger, retry=ONCE, timeouts=Timeouts(request=0.2, stream_deadline=0.2)
    )
    with pytest.raises(RequestTimeout):
        await router.chat(MESSAGES, max_tokens=100, stream=stream)
    await asyncio.gather(*router._billing._background)  # the /generation lookups gave up
    (held,) = router.unresolved
    state = await ledger.snapshot()
    assert state.released == 0
    assert state.reserved == held.amount > 0  # held at worst case, not released
    # The provider finished and billed it although the client left.
    charged = await _charged_total(sim)
    assert charged > 0
    assert state.spent + state.reserved >= charged
    if stream:
        # The id came with the first byte: OpenRouter can now say what it cost.
        assert held.generation_id is not None
        assert await router.reconcile() == 1
        state = await ledger.snapshot()
        assert (state.spent, state.reserved) == (charged, 0)
        assert router.unresolved == []
    else:
        # No id: it stays held (recovery or account reconciliation settles it later).
        assert held.generation_id is None
        assert await router.reconcile() == 0
        assert (await ledger.snapshot()).reserved == held.amount
        # Closing the router counts it at its worst case: nothing can ever say less.
        await router.close()
        state = await ledger.snapshot()
        assert (state.spent, state.reserved) == (held.amount, 0)
        assert state.spent >= charged


async def test_a_524_is_held_and_a_502_released(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger, retry=ONCE)
    for status, held in ((502, 0), (524, 1)):
        openrouter_sim.add_fault(
            {"kind": "provider_error", "status": status, "times": 1, "no_fallback": True}
        )
        with pytest.raises(ProviderUnavailableError):
            await router.chat(MESSAGES, max_tokens=100)
        assert len(router.unresolved) == held
    state = await ledger.snapshot()
    assert state.released == 1
    assert state.reserved == router.unresolved[0].amount


async def unreachable_router(
    sim: SimulatorServer, make_router: MakeRouter, port: int, **kwargs: Any
) -> Router:
    """An open Router whose base URL is 127.0.0.1:``port`` (endpoints from ``sim``), no retry."""
    first = await make_router(sim)
    endpoints = await first._plans.catalog.endpoints(KIMI)  # type: ignore[union-attr]
    router = Router(
        KIMI,
        retry=ONCE,
        endpoints=endpoints,
        api_key=DEFAULT_TEST_KEY,
        base_url=f"http://127.0.0.1:{port}/api/v1",
        **kwargs,
    )
    await router.open()
    return router


async def test_a_request_that_never_reached_openrouter_is_released(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    with socket.socket() as probe:  # a port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ledger = MemoryLedger(Decimal(1))
    router = await unreachable_router(openrouter_sim, make_router, port, ledger=ledger)
    with pytest.raises(APIConnectionError) as info:
        await router.chat(MESSAGES, max_tokens=100)
    assert info.value.request_sent is False
    state = await ledger.snapshot()
    assert (state.released, state.reserved, router.unresolved) == (1, 0, [])
    await router.close()


async def test_a_deadline_while_connecting_is_released_as_never_sent(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    ledger = MemoryLedger(Decimal(1))
    with blackhole() as port:  # SYNs unanswered: the deadline ends the connect
        router = await unreachable_router(
            openrouter_sim,
            make_router,
            port,
            ledger=ledger,
            timeouts=Timeouts(request=0.2, connect=30),
        )
        with pytest.raises(RequestTimeout) as info:
            await router.chat(MESSAGES, max_tokens=100)
        await router.close()
    assert info.value.request_sent is False
    state = await ledger.snapshot()
    assert (state.released, state.reserved, router.unresolved) == (1, 0, [])


@pytest.mark.parametrize(
    ("error", "sent", "free"),
    [
        (APIConnectionError("refused"), True, False),
        (RequestTimeout("slow"), True, False),
        (ValueError("a callback failed"), True, False),
        (ValueError("before sending"), False, True),
    ],
)
def test_only_provable_failures_are_free(error: Exception, sent: bool, free: bool) -> None:
    assert provably_free(error, sent) is free
    refused = APIConnectionError("refused")
    refused.request_sent = False
    assert provably_free(refused, True)


# --- a paid answer is never thrown away ---------------------------------------------


async def test_a_stream_cut_after_its_usage_is_a_result(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    openrouter_sim.add_fault({"kind": "drop_done", "times": 1})
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=100, stream=True)
    assert result.attempts == 1
    assert result.usage is not None
    assert result.finish_reason is not None
    assert len(openrouter_sim.requests) == 1  # not sent (and paid) twice
    state = await ledger.snapshot()
    assert (state.spent, state.reserved) == (openrouter_sim.simulator.usage, 0)
    assert result.cost == openrouter_sim.simulator.usage


class FlakyLedger(MemoryLedger):
    """A memory ledger whose settles and attaches fail the first ``fails`` times."""

    def __init__(self, limit: Decimal, fails: int) -> None:
        super().__init__(limit)
        self.fails = {"settle": fails, "attach": fails}

    def _maybe_fail(self, what: str) -> None:
        if self.fails[what] > 0:
            self.fails[what] -= 1
            raise OSError(f"disk I/O error during {what}")

    async def attach(self, reservation: Reservation, generation_id: str) -> None:
        self._maybe_fail("attach")
        await super().attach(reservation, generation_id)

    async def settle(self, reservation: Reservation, cost: Decimal, **kwargs: Any) -> None:
        self._maybe_fail("settle")
        await super().settle(reservation, cost, **kwargs)


async def test_a_failing_settle_is_retried_then_succeeds(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, recording_sleep: RecordingSleep
) -> None:
    ledger = FlakyLedger(Decimal(1), fails=2)
    router = await make_router(openrouter_sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=100, stream=True)
    assert result.attempts == 1
    assert recording_sleep.calls == list(LEDGER_RETRIES[:2]) * 2  # attach, then settle
    state = await ledger.snapshot()
    assert (state.spent, state.reserved) == (openrouter_sim.simulator.usage, 0)


async def test_a_settle_that_keeps_failing_keeps_the_answer(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, recording_sleep: RecordingSleep
) -> None:
    ledger = FlakyLedger(Decimal(1), fails=100)
    router = await make_router(openrouter_sim, ledger=ledger)
    with pytest.raises(LedgerWriteError) as info:
        await router.chat(MESSAGES, max_tokens=100, stream=True)
    result = info.value.result
    assert result.text
    assert result.cost == openrouter_sim.simulator.usage
    assert isinstance(info.value.__cause__, OSError)
    assert len(openrouter_sim.requests) == 1  # not retried: it was paid for
    assert len(recording_sleep.calls) == 2 * len(LEDGER_RETRIES)
    state = await ledger.snapshot()
    assert state.reserved > 0  # held at worst case for recovery, never released
    assert state.released == 0


@pytest.mark.parametrize(("provider", "cancels"), [("chutes", True), ("moonshotai", False)])
async def test_a_stream_left_is_reconciled_at_what_its_provider_bills(
    openrouter_sim_factory: Any, make_router: MakeRouter, provider: str, cancels: bool
) -> None:
    """OpenRouter's documented cancellation per provider (the simulator's default): a
    stream its client leaves costs the tokens sent on a provider that cancels, the whole
    generation on one that does not; either way the ledger ends at what was charged."""
    gate = Gate()
    sim = await openrouter_sim_factory(speed=1000, sleep=gate, completion_tokens=40)
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(
        sim,
        ledger=ledger,
        retry=ONCE,
        timeouts=Timeouts(stream_deadline=0.2),
        policy=ProviderPolicy(exclude_below="int4", only=[provider]),
    )
    with pytest.raises(RequestTimeout):
        await router.chat(MESSAGES, max_tokens=100, stream=True)
    await asyncio.gather(*router._billing._background)
    # Cancelled: billed at once, found by the background lookup. Not cancelled: still
    # generating, so /generation does not know it yet and it is held at worst case.
    assert len(router.unresolved) == (0 if cancels else 1)
    assert all(held.generation_id is not None for held in router.unresolved)
    charged = await _charged_total(sim)  # the generations still running, billed now
    (record,) = sim.requests
    assert record.tag == provider
    assert record.completion_tokens == (0 if cancels else 40)
    assert charged > 0
    assert await router.reconcile() == (0 if cancels else 1)
    state = await ledger.snapshot()
    assert (state.spent, state.reserved) == (charged, 0)
