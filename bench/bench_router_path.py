"""The Router's own per-request Python, piece by piece, without the network (#13).

Run: ``python -m bench router_path`` (``--n`` calls per timing, ``--repeat``).
Opens a ``Router`` + ``MemoryLedger`` on a local OpenRouter (one warm-up chat, one
real answer body captured), then times in a loop, cyclic GC off, best of
``--repeat``: building a request (body bytes, billable size, worst case),
decoding + reading an answer (``json.loads``, exact cost, ``parse_completion``),
reserve + settle on the memory ledger, the same plus the result object, the
limiter round trip and our price estimate, and the whole ``router.chat`` with the
HTTP exchange answered in-process (the session swapped for one that suspends
once for the headers, and once more in ``read()``, and returns a captured body).
``python -m bench perf`` measures the whole request (HTTP included) against bare
aiohttp; this one isolates the pieces that are ours, with far less noise, so a
change of a microsecond shows. Compare two trees by running it from each
(``PYTHONPATH=<tree>``) in the same minute.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from bench.bench_client import BASE_LATENCY, KEY, MAX_TOKENS, MESSAGES, MODEL, Sim, _uvloop


def _best(fn: Callable[[], Any], n: int, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


async def _abest(fn: Callable[[], Awaitable[Any]], n: int, repeat: int) -> float:
    await fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


async def _measure(url: str, n: int, repeat: int) -> dict[str, float]:
    import aiohttp

    from provider_router import MemoryLedger, ProviderPolicy, Router
    from provider_router._money import from_units, pin_exact_cost, to_units
    from provider_router.client._completion import parse_completion

    ledger = MemoryLedger(Decimal(10**6))
    async with (
        ledger,
        Router(
            MODEL,
            policy=ProviderPolicy(exclude_below="int4"),
            ledger=ledger,
            max_concurrency=500,
            base_url=url,
            api_key=KEY,
        ) as router,
    ):
        await router.chat(MESSAGES, max_tokens=MAX_TOKENS)

        def build() -> Any:
            return router._build_request(MESSAGES, MAX_TOKENS, False, None, None, {})

        request = build()
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/chat/completions", data=request.payload, headers=headers) as r,
        ):
            raw = await r.read()

        def read() -> Any:
            body = json.loads(raw)
            pin_exact_cost(body, raw)
            return parse_completion(body)

        completion = read()
        body = json.loads(raw)
        wire_cost = body["usage"]["cost"]  # the float json.loads gives

        def pin() -> None:
            body["usage"]["cost"] = wire_cost  # pinned again each time: the real work
            pin_exact_cost(body, raw)

        billing = router._billing

        async def reserve_settle() -> Any:
            reservation = await billing.reserve(request, False)
            return await billing.charge(request, completion, reservation)

        async def reserve_settle_result() -> Any:
            charged = await reserve_settle()
            return router._finish(request, charged, 0.1)

        async def limiter() -> None:
            ticket = await router.limiter.acquire()
            router.limiter.release(ticket, "success")

        ledger_only = router.ledger
        assert ledger_only is not None
        cost = completion.usage.cost if completion.usage is not None else Decimal(0)

        async def ledger_reserve_settle() -> None:
            # The ledger's own share of a request (the billing rows of wave 4).
            held = await ledger_only.reserve(request.worst_case, key="k")
            await ledger_only.settle(held, cost, estimate=cost, provider="p", generation_id="g")

        def units() -> int:
            # The request's three conversions (reserve, settle, estimate) and one back.
            to_units(request.worst_case, round_up=True)
            to_units(cost)
            from_units(to_units(cost))
            return 0

        whole = await _whole_chat(router, raw, dict(r.headers), request.payload, n, repeat)
        return {
            **whole,
            "build request": _best(build, n, repeat),
            "json.loads alone": _best(lambda: json.loads(raw), n, repeat),
            "json.loads + exact cost + parse": _best(read, n, repeat),
            "exact cost alone (pin_exact_cost)": _best(pin, n, repeat),
            "reserve + settle (memory)": await _abest(reserve_settle, n, repeat),
            "ledger alone: reserve + settle": await _abest(ledger_reserve_settle, n, repeat),
            "units: 3 to_units + from_units": _best(units, n, repeat),
            "reserve + settle + result": await _abest(reserve_settle_result, n, repeat),
            "limiter acquire + release": await _abest(limiter, n, repeat),
            "plan.estimate": _best(
                lambda: request.plan.estimate(completion.provider, 100, 64), n, repeat
            ),
        }


class _Content:
    """The body's stream, whole (what aiohttp holds once a small answer has arrived)."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def is_eof(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def read_nowait(self) -> bytes:
        return self._raw


class _CannedResponse:
    """What ``session.post`` returns, answering with one captured body."""

    status = 200

    def __init__(self, raw: bytes, headers: Any) -> None:
        self._raw = raw
        self.headers = headers
        self.content = _Content(raw)

    async def read(self) -> bytes:
        await asyncio.sleep(0)  # a real body read may suspend: pass through every layer
        return self._raw

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class _CannedSession:
    """An aiohttp session stand-in: every POST suspends once, then answers at once.

    It turns a ``bytes`` body into aiohttp's payload object, as aiohttp does, so a
    client that builds that object itself is not charged twice."""

    closed = False
    trace_configs: tuple[()] = ()

    def __init__(self, raw: bytes, headers: Any) -> None:
        self._response = _CannedResponse(raw, headers)

    async def post(self, url: Any, *, data: Any, **kwargs: Any) -> _CannedResponse:
        from aiohttp.payload import PAYLOAD_REGISTRY, Payload

        if not isinstance(data, Payload):
            data = PAYLOAD_REGISTRY.get(data, disposition=None)  # what aiohttp does with bytes
        await asyncio.sleep(0)  # the request's one real suspension (headers awaited)
        return self._response


async def _whole_chat(
    router: Any, raw: bytes, headers: dict[str, str], payload: bytes, n: int, repeat: int
) -> dict[str, float]:
    """``router.chat`` end to end with the HTTP exchange answered in-process.

    The session is replaced by one that suspends for the headers (as a real one
    does at least) and answers with a captured body, whole; its ``read()``
    suspends once more (a bare client calls it; the router takes a whole body
    from the buffer without it, as with aiohttp), so what is timed is the
    router's own Python plus its loop turns; "canned exchange alone" is the two
    suspensions, the body's payload object and the ``json.loads`` a bare client
    pays.
    """
    from multidict import CIMultiDict, CIMultiDictProxy

    http = router._http
    real = http._session
    canned = _CannedSession(raw, CIMultiDictProxy(CIMultiDict(headers)))
    ledger = router.ledger
    http._session = canned
    try:

        async def chat() -> None:
            await router.chat(MESSAGES, max_tokens=MAX_TOKENS)

        async def exchange_alone() -> None:
            response = await canned.post(None, data=payload)
            json.loads(await response.read())

        timed = {"chat(), memory ledger (HTTP canned)": await _abest(chat, n, repeat)}
        router.ledger = None
        timed["chat(), no ledger (HTTP canned)"] = await _abest(chat, n, repeat)
        timed["canned exchange alone (json.loads)"] = await _abest(exchange_alone, n, repeat)
        return timed
    finally:
        router.ledger = ledger
        http._session = real


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench router_path", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the best is kept")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sim = Sim(BASE_LATENCY / 0.01)
    _uvloop()  # the loop the clients run on (bench perf, bench client)
    gc.disable()
    try:
        results = asyncio.run(_measure(sim.url, args.n, args.repeat))
    finally:
        gc.enable()
        sim.stop()
    for label, micros in results.items():
        print(f"{label:36s} {micros:7.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
