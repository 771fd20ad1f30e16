"""A scripted raw HTTP/1.1 server on loopback, and the two clients the wire tests hold equal.

``HttpClient.send()`` has two ways to the wire: the client's own (owning its
session: ``HttpClient(url, key)``) and an adopted aiohttp session
(``HttpClient(url, session=...)``). ``tests/test_http_wire*.py`` run every
scenario through both against this server and assert the same observable
outcome (:class:`Outcome`). The server reads each request whole (request line,
headers, ``Content-Length`` body), records it, and plays the test's script for
it: bytes written (each its own write), pauses, a hang-up, or silence until the
client leaves. It counts the connections it accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

import aiohttp
import pytest

from provider_router import APIError, APIStatusError
from provider_router._constants import USER_AGENT
from provider_router._http.session import DEFAULT_CONNECTION_LIMIT, HttpClient

KEY: Final = "sk-or-v1-wire-test-key"
BASE_PATH: Final = "/api/v1"
CHAT: Final = "/chat/completions"
PAYLOAD: Final = json.dumps(
    {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]}
).encode()
ANSWER: Final = (
    b'{"id":"gen-wire-1","provider":"Chutes","choices":[{"message":{"role":"assistant",'
    b'"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"cost":0.25}}'
)
KINDS: Final = ("owned", "aiohttp")

CLOSE: Final = "close"  # script step: hang up
HOLD: Final = "hold"  # script step: say nothing more until the client leaves

Step = bytes | float | str  # bytes: one write; float: a pause (0: one loop turn)
Script = Sequence[Step]


def parsed(body: bytes) -> Any:
    """What ``PostResponse.json()`` gives for ``body``: decimals kept digit for digit."""
    return json.loads(body, parse_float=Decimal)


def head(
    status: str = "200 OK",
    headers: Iterable[tuple[str, str]] = (("Content-Type", "application/json"),),
    *,
    length: int | None = None,
    version: str = "HTTP/1.1",
) -> bytes:
    """A status line and headers (``Content-Length: length`` when given), blank line included."""
    lines = [f"{version} {status}", *(f"{name}: {value}" for name, value in headers)]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(body: bytes = ANSWER, *headers: tuple[str, str], status: str = "200 OK") -> bytes:
    """A whole ``Content-Length`` answer (JSON content type, ``headers`` added)."""
    return head(status, (("Content-Type", "application/json"), *headers), length=len(body)) + body


def chunk(data: bytes, *, size: str | None = None, extension: str = "") -> bytes:
    """One chunk of a chunked body; ``size`` overrides the hex length's spelling."""
    return f"{size or format(len(data), 'x')}{extension}\r\n".encode() + data + b"\r\n"


def bytewise(data: bytes) -> list[Step]:
    """``data`` one byte a write, two loop turns between two (the client reads each apart)."""
    steps: list[Step] = []
    for i in range(len(data)):
        steps += [data[i : i + 1], 0.0, 0.0]
    return steps


@dataclass
class Request:
    """One request as it came over the wire."""

    connection: int  # which accepted connection (1, 2, ...) carried it
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass
class WireServer:
    """Plays ``scripts[i]`` for the (i+1)-th request; the last script for every later one."""

    scripts: tuple[Script, ...]
    hang_up_on_accept: bool = False
    idle_close: float | None = None  # seconds an idle connection is kept before closing it
    idle_closed: int = 0  # connections the server closed for idling (not the client)
    url: str = ""
    port: int = 0
    connections: int = 0  # accepted
    closed: int = 0  # closed again (by either side)
    requests: list[Request] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # asyncio would log it as an error
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        task = asyncio.current_task()
        if task is not None:
            self.tasks.append(task)
        try:
            while not self.hang_up_on_accept:
                try:
                    # The server's own idle timer (its pace, as a script's pauses are).
                    async with asyncio.timeout(self.idle_close):
                        request = await _read_request(reader, number)
                except TimeoutError:
                    self.idle_closed += 1
                    break
                if request is None:
                    break  # the client closed an idle connection
                self.requests.append(request)
                self.changed.set()
                script = self.scripts[min(len(self.requests), len(self.scripts)) - 1]
                if not await _play(script, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
        self.closed += 1
        self.changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds (checked after each request or closed connection)."""
        async with asyncio.timeout(5):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


async def _read_request(reader: asyncio.StreamReader, connection: int) -> Request | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    line, *lines = raw.decode("latin-1").split("\r\n")
    method, target, version = line.split(" ")
    headers = {}
    for text in lines:
        if text:
            name, _, value = text.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(connection, method, target, version, headers, body)


async def _play(script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Play one script; False when the connection is to end."""
    for step in script:
        if isinstance(step, bytes):
            writer.write(step)
            await writer.drain()
        elif isinstance(step, float):
            await asyncio.sleep(step)  # the peer's pace, not the test waiting
        elif step == CLOSE:
            return False
        elif step == HOLD:
            while await reader.read(65536):
                pass
            return False
    return True


Serve = Callable[..., Awaitable[WireServer]]


@pytest.fixture(name="wire")
async def wire_fixture() -> AsyncIterator[Serve]:
    """``await wire(*scripts, port=, tls=, hang_up_on_accept=, host=, idle_close=)``: a
    started server."""
    servers: list[asyncio.Server] = []
    raws: list[WireServer] = []

    async def start(
        *scripts: Script,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        hang_up_on_accept: bool = False,
        host: str = "127.0.0.1",
        idle_close: float | None = None,
    ) -> WireServer:
        raw = WireServer(scripts, hang_up_on_accept, idle_close)
        server = await asyncio.start_server(raw.handle, host, port, ssl=tls)
        servers.append(server)
        raws.append(raw)
        raw.port = server.sockets[0].getsockname()[1]
        authority = f"[{host}]:{raw.port}" if ":" in host else f"{host}:{raw.port}"
        raw.url = f"{'https' if tls else 'http'}://{authority}{BASE_PATH}"
        return raw

    yield start
    for server in servers:
        server.close()
    tasks = [task for raw in raws for task in raw.tasks]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for server in servers:
        await server.wait_closed()


class Clients:
    """Builds ``HttpClient``s of either kind; closes them (and the adopted sessions) after."""

    def __init__(self) -> None:
        self._made: list[tuple[HttpClient, aiohttp.ClientSession | None]] = []

    def connect(
        self,
        kind: str,
        url: str,
        *,
        limit: int = DEFAULT_CONNECTION_LIMIT,
        ca: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        user_agent: str = USER_AGENT,
        key: str = KEY,
    ) -> HttpClient:
        """``owned``: the client owns its session; ``aiohttp``: it adopts one carrying the key
        (and the same ``headers`` and ``user_agent``)."""
        session = None
        if kind == "owned":
            http = HttpClient(url, key, limit=limit, headers=headers, user_agent=user_agent)
        else:
            connector = aiohttp.TCPConnector(limit=limit, ssl=ca if ca is not None else True)
            sent = {
                "Authorization": f"Bearer {key}",
                "User-Agent": user_agent,
                "Accept": "application/json",
                **(headers or {}),
            }
            session = aiohttp.ClientSession(connector=connector, headers=sent)
            http = HttpClient(url, session=session)
        self._made.append((http, session))
        return http

    async def close(self, http: HttpClient) -> None:
        """Close ``http`` as its owner does: ``aclose()``, and the adopted session with it."""
        for made, session in self._made:
            if made is http:
                await http.aclose()
                if session is not None:
                    await session.close()

    async def aclose(self) -> None:
        for http, _ in self._made:
            await self.close(http)


@pytest.fixture(name="clients")
async def clients_fixture() -> AsyncIterator[Clients]:
    clients = Clients()
    yield clients
    await clients.aclose()


@pytest.fixture(name="kind", params=KINDS)
def kind_fixture(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


HEADERS: Final = ("content-type", "X-Generation-Id", "x-generation-id", "RETRY-AFTER", "x-absent")


@dataclass(frozen=True)
class Outcome:
    """What a caller of ``send()`` observes: equal for both clients, scenario by scenario."""

    status: int | None = None
    complete: bool | None = None  # at the return of send()
    headers: tuple[str | None, ...] = ()  # headers.get(name) for each of HEADERS
    value: Any = None  # json()
    error: str | None = None  # the exception's class name
    phase: str | None = None  # "send" or "json": which call raised it
    sent: bool | None = None  # APIConnectionError.request_sent
    message: str | None = None  # str(exc), "POST <url>: " alone when it starts so
    retry_after: float | None = None


JSON: Final = ("Content-Type", "application/json")
CHUNKED: Final = ("Transfer-Encoding", "chunked")
GEN: Final = ("X-Generation-Id", "gen-wire-1")
SEEN: Final = ("application/json", "gen-wire-1", "gen-wire-1", None, None)  # ANSWER's, by GEN
OK: Final = Outcome(status=200, complete=True, headers=SEEN, value=parsed(ANSWER))
"""The outcome of ``answer(ANSWER, GEN)``."""


def failure(exc: APIError, phase: str, what: str) -> Outcome:
    """The outcome of an error raised by ``phase``; ``what`` is its "POST <url>" prefix."""
    text = str(exc)
    prefix = f"{what}: "
    if isinstance(exc, APIStatusError):
        return Outcome(
            status=exc.status,
            headers=tuple(exc.headers.get(name.lower()) for name in HEADERS),
            error=type(exc).__name__,
            phase=phase,
            message=text,
            retry_after=exc.retry_after,
        )
    return Outcome(
        error=type(exc).__name__,
        phase=phase,
        sent=getattr(exc, "request_sent", None),
        message=prefix if text.startswith(prefix) else text,
    )


async def exchange(
    http: HttpClient, payload: bytes = PAYLOAD, *, seconds: float = 5.0, alone: bool = True
) -> Outcome:
    """One ``send()`` and ``json()``, released (closed on an error); nothing left registered
    (when it is ``alone`` in flight; else the caller checks once all ended)."""
    what = f"POST {http.url(CHAT)}"
    try:
        try:
            response = await http.send(CHAT, payload, request_timeout=seconds)
        except APIError as exc:
            return failure(exc, "send", what)
        seen = Outcome(
            status=response.status,
            complete=response.complete,
            headers=tuple(response.headers.get(name) for name in HEADERS),
        )
        try:
            value = await response.json()
        except APIError as exc:
            response.close()
            failed = failure(exc, "json", what)
            return replace(failed, status=seen.status, complete=seen.complete, headers=seen.headers)
        response.release()
        return replace(seen, value=value)
    finally:
        assert not alone or len(http._deadlines) == 0  # nothing left registered, whatever the end
