"""Connecting to a name whose first address blackholes (issue #20, "Must hold").

Run: ``python -m bench connect [--rounds N]``. On loopback only: the name's first
address is a listener whose accept queue is full (Linux drops the SYNs it cannot
queue, as a route that blackholes packets does), the second a server that answers.
Each round opens a new connection and sends one POST; reported is the time from the
request to its answer, median and worst of the rounds, for:

* ``lean``: the lean pool (addresses raced by aiohappyeyeballs, RFC 8305);
* ``aiohttp``: an aiohttp session given the same two addresses (its own racing);
* ``sequential``: the lean pool's old rule (one address after the other), with a
  connect timeout of 3 s: what every new connection cost before.

Must hold: ``lean`` within 0.5 s of the second address answering (the second
attempt starts 0.25 s after the first).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from provider_router import APIError
from provider_router._http.h1 import pool as pool_module
from provider_router._http.session import HttpClient
from provider_router.testing.loopback import answer_every_request, blackhole

BODY = b'{"id":"gen-1"}'
KEY = "sk-or-v1-bench-connect"


class _TwoAddresses(AbstractResolver):
    """aiohttp's resolver interface, answering the blackhole first, then the server."""

    def __init__(self, ports: tuple[int, int]) -> None:
        self.ports = ports

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host, host="127.0.0.1", port=p, family=socket.AF_INET, proto=6, flags=0
            )
            for p in self.ports
        ]

    async def close(self) -> None:
        return None


async def _lean_round(ports: tuple[int, int], connect_timeout: float) -> float:
    async with HttpClient(
        f"http://localhost:{ports[1]}", KEY, connect_timeout=connect_timeout
    ) as http:
        pool = http._lean()
        resolver = pool._resolver
        assert resolver is not None
        resolver._addresses = [(socket.AF_INET, 6, ("127.0.0.1", p)) for p in ports]
        resolver._expires = asyncio.get_running_loop().time() + 60
        started = time.perf_counter()
        try:
            response = await http.send("/chat/completions", b"{}", request_timeout=10)
            await response.json()
            response.release()
        except APIError as exc:  # a failed round is reported as its time, and why
            print(f"  (a round failed: {type(exc).__name__})")
        return time.perf_counter() - started


async def _aiohttp_round(ports: tuple[int, int]) -> float:
    connector = aiohttp.TCPConnector(resolver=_TwoAddresses(ports), use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        async with session.post(f"http://localhost:{ports[1]}/chat/completions", data=b"{}") as r:
            await r.read()
        return time.perf_counter() - started


async def _measure(rounds: int) -> dict[str, list[float]]:
    server = await asyncio.start_server(answer_every_request(BODY), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    results: dict[str, list[float]] = {"lean": [], "aiohttp": [], "sequential": []}
    with blackhole() as blackholed:
        ports = (blackholed, port)
        runs: dict[str, Callable[[], Awaitable[float]]] = {
            "lean": lambda: _lean_round(ports, 3.0),
            "aiohttp": lambda: _aiohttp_round(ports),
        }
        try:
            for _ in range(rounds):
                for name, run in runs.items():
                    results[name].append(await run())
            delay = pool_module.HAPPY_EYEBALLS_DELAY
            pool_module.HAPPY_EYEBALLS_DELAY = None  # type: ignore[misc]  # the old rule
            try:
                results["sequential"].append(await _lean_round(ports, 3.0))
            finally:
                pool_module.HAPPY_EYEBALLS_DELAY = delay  # type: ignore[misc]
        finally:
            server.close()
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench connect")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import uvloop

    results: dict[str, Any] = uvloop.run(_measure(args.rounds))
    print(f"machine: {platform.machine()} {platform.python_version()} (uvloop); loopback")
    print("first address blackholed, second answering; one new connection a round")
    for name, times in results.items():
        print(
            f"  {name:<11} median {statistics.median(times):.3f} s, "
            f"worst {max(times):.3f} s ({len(times)} rounds)"
        )
    lean_worst = max(results["lean"])
    verdict = "holds" if lean_worst < 0.5 else "FAILS"
    print(f"must hold (lean within 0.5 s): {verdict}")
    return 0 if lean_worst < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
