"""Keep-alive races against a server that closes idle connections (issue #20).

Run: ``python -m bench keepalive [--workers W] [--requests N]``. On loopback: a server
closes every connection idle for 1 s and says so on each answer
(``Keep-Alive: timeout=1``); its close reaches the client 50 ms later, as one way's
latency over a network would delay it (on loopback it would arrive at once). ``W``
workers, each a client of its own, each sending ``N`` requests with a pause of 0.9–1.1 s
(seeded) between two, so its connection keeps meeting the server's close. Two
runs, the same pauses:

* ``header ignored``: the old rule (an idle connection reused for up to 15 s);
* ``by the server's word``: expiry a margin before the advertised timeout.

Reported: requests answered, and those that failed after being written
(``request_sent`` true: held as "may have been billed", each with a reservation).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import sys
from typing import Any

from provider_router import APIConnectionError
from provider_router._http.h1 import pool as pool_module
from provider_router._http.session import HttpClient

BODY = b'{"id":"gen-1"}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=1\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)
IDLE_CLOSE = 1.0
LATENCY = 0.05  # one way, simulated: the server's close reaches the client this late


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                async with asyncio.timeout(IDLE_CLOSE):  # the server's idle timer
                    head = await reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                # Closed now; the client learns it one way's latency later, as over a
                # network (on loopback the FIN would arrive at once). A request sent
                # meanwhile meets a closed connection.
                await asyncio.sleep(LATENCY)
                break
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(ANSWER)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _run(workers: int, requests: int, honour: bool, seed: int) -> dict[str, Any]:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    original = pool_module.keep_alive_seconds
    if not honour:
        pool_module.keep_alive_seconds = lambda header: pool_module.KEEPALIVE_SECONDS  # type: ignore[assignment]
    counts = {"ok": 0, "maybe billed": 0, "never sent": 0}
    try:

        async def worker(rng: random.Random) -> None:
            # A client of its own: its one connection idles exactly the pause (in a
            # shared pool the freshest idle connection is taken, which rarely aged).
            async with HttpClient(f"http://127.0.0.1:{port}", "sk-or-v1-bench") as http:
                for _ in range(requests):
                    try:
                        response = await http.send("/chat/completions", b"{}", request_timeout=10)
                        await response.json()
                        response.release()
                        counts["ok"] += 1
                    except APIConnectionError as exc:
                        counts["maybe billed" if exc.request_sent else "never sent"] += 1
                    await asyncio.sleep(rng.uniform(0.9, 1.1))

        await asyncio.gather(*(worker(random.Random(seed + i)) for i in range(workers)))
    finally:
        pool_module.keep_alive_seconds = original  # type: ignore[assignment]
        server.close()
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench keepalive")
    parser.add_argument("--workers", type=int, default=40)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    import uvloop

    print(f"machine: {platform.machine()} {platform.python_version()} (uvloop), loopback")
    print(
        f"{args.workers} workers × {args.requests} requests, 0.9–1.1 s apart; the server "
        f"closes connections idle for {IDLE_CLOSE:g} s (Keep-Alive: timeout=1)"
    )
    for honour, name in ((False, "header ignored"), (True, "by the server's word")):
        counts = uvloop.run(_run(args.workers, args.requests, honour, args.seed))
        print(f"  {name:<21} {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
