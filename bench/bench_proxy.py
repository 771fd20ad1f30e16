"""Completions through a proxy: the lean pool's own CONNECT tunnel against aiohttp's (issue #20).

Run: ``python -m bench proxy [--requests N] [--in-flight K] [--rounds R]``. Needs
``tinyproxy`` and ``openssl``. On loopback only: a TLS server (a child process,
self-signed certificate) answers every POST with a small JSON body; a tinyproxy
started here tunnels to it (``CONNECT``). In this process, alternating rounds send
``N`` POSTs, ``K`` in flight, through:

* ``lean``: :class:`~provider_router._http.session.HttpClient` (``HTTPS_PROXY`` set: the lean
  pool opens its tunnels, TLS over them with ``loop.start_tls``), ``send()`` + ``json()``;
* ``aiohttp``: an ``aiohttp.ClientSession`` given the same proxy (``proxy=``), ``post()``
  + ``read()`` + ``json.loads``: what completions would cost had they moved to an
  aiohttp session whenever a proxy applies.

Reported: CPU of this process per request (µs, the median of the rounds), and the
ratio lean / aiohttp measured in the same run. The proxy and the server run in
processes of their own, so their CPU is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provider_router.testing.loopback import self_signed_certificate, tls_contexts

BODY = b'{"id":"gen-1","usage":{"cost":0.25}}'
KEY = "sk-or-v1-bench-proxy"


def _serve(cert: str, ready: Any) -> None:
    import uvloop

    from provider_router.testing.loopback import answer_every_request, tls_contexts

    async def main() -> None:
        served, _ = tls_contexts(Path(cert))
        server = await asyncio.start_server(
            answer_every_request(BODY), "127.0.0.1", 0, ssl=served, backlog=1024
        )
        ready.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(main())


def _tinyproxy(where: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    config = where / "tinyproxy.conf"
    config.write_text(
        f"Port {port}\nListen 127.0.0.1\nTimeout 60\nLogLevel Error\nMaxClients 400\n"
        f'LogFile "{where / "tinyproxy.log"}"\nAllow 127.0.0.1\nDisableViaHeader Yes\n'
    )
    process = subprocess.Popen(  # noqa: S603 - a fixed binary, our own config
        [shutil.which("tinyproxy") or "/usr/bin/tinyproxy", "-d", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.01)
    return process, port


async def _lean(url: str, trusted: ssl.SSLContext, requests: int, in_flight: int) -> float:
    from provider_router._http.session import HttpClient

    async with HttpClient(url, KEY, ssl=trusted, limit=in_flight) as http:

        async def one() -> None:
            response = await http.send("/chat/completions", b"{}", request_timeout=30)
            await response.json()
            response.release()

        await asyncio.gather(*(one() for _ in range(in_flight)))  # tunnels opened: warm
        started = time.process_time()
        for _ in range(requests // in_flight):
            await asyncio.gather(*(one() for _ in range(in_flight)))
        return (time.process_time() - started) / requests


async def _aiohttp(
    url: str, trusted: ssl.SSLContext, proxy: str, requests: int, in_flight: int
) -> float:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=in_flight, ssl=trusted)
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        target = f"{url}/chat/completions"

        async def one() -> None:
            async with session.post(
                target,
                data=b"{}",
                headers=headers,
                proxy=proxy,
                timeout=aiohttp.ClientTimeout(total=30),
            ) as r:
                json.loads(await r.read())

        await asyncio.gather(*(one() for _ in range(in_flight)))
        started = time.process_time()
        for _ in range(requests // in_flight):
            await asyncio.gather(*(one() for _ in range(in_flight)))
        return (time.process_time() - started) / requests


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench proxy")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if shutil.which("tinyproxy") is None and not Path("/usr/bin/tinyproxy").exists():
        print("needs tinyproxy (apt-get install tinyproxy)", file=sys.stderr)
        return 2
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        cert = self_signed_certificate(where, shutil.which("openssl") or "openssl")
        receiver, sender = mp.Pipe(duplex=False)
        server = mp.get_context("spawn").Process(target=_serve, args=(str(cert), sender))
        server.start()
        proxy, proxy_port = _tinyproxy(where)
        try:
            port = receiver.recv()
            url = f"https://127.0.0.1:{port}/api/v1"
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            os.environ["HTTPS_PROXY"] = proxy_url
            _, trusted = tls_contexts(cert)
            cpu: dict[str, list[float]] = {"lean": [], "aiohttp": []}
            for _ in range(args.rounds):
                cpu["lean"].append(uvloop.run(_lean(url, trusted, args.requests, args.in_flight)))
                cpu["aiohttp"].append(
                    uvloop.run(_aiohttp(url, trusted, proxy_url, args.requests, args.in_flight))
                )
        finally:
            proxy.terminate()
            proxy.wait(timeout=5)
            server.terminate()
            server.join(timeout=5)
    print(f"machine: {platform.machine()} {platform.python_version()} (uvloop), loopback")
    print(
        f"{args.requests} POSTs, {args.in_flight} in flight, through tinyproxy (CONNECT + TLS),"
        f" {args.rounds} rounds"
    )
    medians = {name: statistics.median(values) * 1e6 for name, values in cpu.items()}
    for name, median in medians.items():
        rounds = ", ".join(f"{v * 1e6:.0f}" for v in cpu[name])
        print(f"  {name:<8} {median:6.1f} µs CPU a request (rounds: {rounds})")
    print(f"  lean / aiohttp: {medians['lean'] / medians['aiohttp']:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
