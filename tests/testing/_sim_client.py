"""A thin raw-aiohttp client for the simulator tests (deliberately not our client)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from provider_router.testing import SimulatorServer

MODEL = "moonshotai/kimi-k2.5"


def chat_body(content: str = "Say hello.", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str
    json: Any = None
    events: list[Any] = field(default_factory=list)
    comments: int = 0
    done: bool = False


def parse_sse(text: str) -> tuple[list[Any], int, bool]:
    """(data payloads, keep-alive comments, whether [DONE] came) of an SSE body."""
    events: list[Any] = []
    comments = 0
    done = False
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if not line:
                continue
            if line.startswith(":"):
                comments += 1
            elif line.startswith("data: "):
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    done = True
                else:
                    events.append(json.loads(payload))
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
    return events, comments, done


class SimClient:
    def __init__(self, url: str, key: str | None) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self.session = aiohttp.ClientSession(headers=headers)

    async def close(self) -> None:
        await self.session.close()

    async def _reply(self, response: aiohttp.ClientResponse) -> Reply:
        text = await response.text()
        reply = Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, text)
        if response.content_type == "text/event-stream":
            reply.events, reply.comments, reply.done = parse_sse(text)
        else:
            reply.json = json.loads(text)
        return reply

    async def get(self, path: str, **params: str) -> Reply:
        async with self.session.get(self.url + path, params=params) as response:
            return await self._reply(response)

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Reply:
        async with self.session.post(self.url + path, json=body, headers=headers) as response:
            return await self._reply(response)

    async def call(self, method: str, path: str, body: Any = None, **params: str) -> Reply:
        """Any method (the management API's ``PATCH`` and ``DELETE`` among them)."""
        async with self.session.request(
            method, self.url + path, json=body, params=params
        ) as response:
            return await self._reply(response)

    async def chat(self, headers: dict[str, str] | None = None, **body: Any) -> Reply:
        return await self.post("/chat/completions", chat_body(**body), headers)


StartSim = Callable[..., Awaitable[tuple["SimulatorServer", SimClient]]]
"""The ``start_sim`` fixture: ``sim, client = await start_sim(**kwargs)``."""
