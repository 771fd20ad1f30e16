"""A tiny OpenRouter metadata server on 127.0.0.1:0, for catalog and CLI tests.

Serves the captured fixtures and the bundled Kimi K2.5 listing over real
loopback HTTP, and answers scripted errors, so the catalog is tested through
its real aiohttp client. It runs in its own thread and event loop, so both
async tests and the synchronous CLI (which starts its own loop) can use it.
It is deliberately minimal: the full local OpenRouter lives in
``provider_router.testing``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

TESTS_DIR = Path(__file__).parent
FIXTURES = TESTS_DIR / "data" / "fixtures"
BUNDLED = TESTS_DIR.parent / "provider_router" / "data" / "kimi-k2.5.endpoints.json"

NOT_FOUND = b'{"error":{"code":404,"message":"Resource not found"}}'


@dataclass
class Canned:
    """One scripted answer."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def default_routes() -> dict[str, Canned]:
    """Paths (under ``/api/v1``) answered out of the box."""
    gemini = FIXTURES / "endpoints_google-gemini-2.5-pro-preview_2025-05-23_cline-nock.json"
    return {
        "/models/moonshotai/kimi-k2.5/endpoints": Canned(body=BUNDLED.read_bytes()),
        "/models/google/gemini-2.5-pro-preview/endpoints": Canned(body=gemini.read_bytes()),
        "/models": Canned(
            body=(
                FIXTURES / "models_list_subset_2026-08-04_llm-openrouter-cassette.json"
            ).read_bytes()
        ),
    }


@dataclass
class MetadataServer:
    """Handle on a running server: its URL, its routes (mutable) and what it saw."""

    base_url: str
    routes: dict[str, Canned]
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def hits(self, path: str) -> int:
        return sum(1 for seen, _ in self.requests if seen == path)


@contextmanager
def serve(routes: dict[str, Canned] | None = None) -> Iterator[MetadataServer]:
    """Run the server for the duration of the ``with`` block."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, object] = {}
    server = MetadataServer(base_url="", routes=default_routes() if routes is None else routes)

    async def handle(request: web.Request) -> web.Response:
        path = request.path.removeprefix("/api/v1")
        server.requests.append((path, dict(request.headers)))
        canned = server.routes.get(path, Canned(404, NOT_FOUND))
        return web.Response(
            status=canned.status,
            body=canned.body,
            headers={"Content-Type": "application/json", **canned.headers},
        )

    async def start() -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        app.router.add_route("POST", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        host, port = runner.addresses[0][:2]
        server.base_url = f"http://{host}:{port}/api/v1"

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="metadata-server", daemon=True)
    thread.start()
    ready.wait(timeout=10)
    try:
        yield server
    finally:
        runner = state["runner"]
        assert isinstance(runner, web.AppRunner)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
