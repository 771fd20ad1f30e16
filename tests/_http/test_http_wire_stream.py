"""``HttpClient.post()`` streams on the wire: the owned client and an adopted aiohttp session agree.

As tests/_http/test_http_wire.py, for the streaming POST (``async with http.post(...)``
and ``PostResponse.events()``): the events' data in order whatever the framing
(chunked, close-delimited, Content-Length, gzip) and the pace (tiny writes,
multi-byte characters and CRLFs split), keep-alive comments skipped, the idle and
total timeouts, a stream cut short, error statuses, an early exit, and reuse of
the connection after a stream read to its end.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import replace

import pytest
from _wire_server import (  # noqa: F401  (the clients, kind and wire fixtures)
    CHAT,
    CHUNKED,
    CLOSE,
    GEN,
    HEADERS,
    HOLD,
    JSON,
    PAYLOAD,
    Clients,
    Outcome,
    Script,
    Serve,
    answer,
    bytewise,
    chunk,
    clients_fixture,
    failure,
    head,
    kind_fixture,
    wire_fixture,
)

from provider_router import APIError
from provider_router._http.session import HttpClient

STREAM = ("Content-Type", "text/event-stream")
DELTAS = [
    '{"choices":[{"delta":{"content":"h\u00e9"}}]}',
    '{"choices":[{"delta":{"content":"\u2615"}}]}',
]
USAGE = '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"cost":0.25}}'
EVENTS = (*DELTAS, USAGE, "[DONE]")
KEEPALIVE = b": OPENROUTER PROCESSING\n\n"


def event(data: str, *, crlf: bool = False) -> bytes:
    end = "\r\n" if crlf else "\n"
    return f"data: {data}{end}{end}".encode()


STREAM_HEAD = head(headers=(STREAM, CHUNKED, GEN))
BODY = KEEPALIVE + b"".join(event(data) for data in EVENTS)


def chunked_stream(pause: float = 0.01) -> Script:
    """A keep-alive, then each event in a chunk of its own, a pause between."""
    script: list[bytes | float | str] = [STREAM_HEAD, chunk(KEEPALIVE)]
    for data in EVENTS:
        script += [pause, chunk(event(data))]
    return [*script, b"0\r\n\r\n"]


async def stream(
    http: HttpClient,
    *,
    seconds: float = 5.0,
    idle: float | None = None,
    stop: int = 0,
    alone: bool = True,
) -> Outcome:
    """One ``post()`` read with ``events()`` (``stop``: leave after that many events);
    nothing left registered after it when it is ``alone`` in flight."""
    what = f"POST {http.url(CHAT)}"
    got: list[str] = []
    seen = Outcome()
    try:
        async with http.post(CHAT, PAYLOAD, request_timeout=seconds, idle_timeout=idle) as answer_:
            headers = tuple(answer_.headers.get(name) for name in HEADERS)
            seen = Outcome(status=answer_.status, headers=headers)
            async for data in answer_.events(idle_timeout=idle):
                got.append(data)
                if len(got) == stop:
                    break
    except APIError as exc:
        failed = failure(exc, "enter" if seen.status is None else "events", what)
        if seen.status is not None:
            failed = replace(failed, status=seen.status, headers=seen.headers)
        return replace(failed, value=tuple(got))
    finally:
        assert not alone or len(http._deadlines) == 0  # nothing left registered, whatever the end
    return replace(seen, value=tuple(got))


WHOLE = Outcome(status=200, headers=("text/event-stream", "gen-wire-1", "gen-wire-1", None, None))
STREAMED = replace(WHOLE, value=EVENTS)


def _gzipped() -> Script:
    """The stream gzip-compressed, flushed after each event (decoded piece by piece)."""
    packer = zlib.compressobj(wbits=31)
    pieces = [packer.compress(KEEPALIVE) + packer.flush(zlib.Z_SYNC_FLUSH)]
    for data in EVENTS:
        pieces.append(packer.compress(event(data)) + packer.flush(zlib.Z_SYNC_FLUSH))
    pieces[-1] += packer.flush()
    gz = head(headers=(STREAM, CHUNKED, GEN, ("Content-Encoding", "gzip")))
    return [gz, *(step for piece in pieces for step in (chunk(piece), 0.01)), b"0\r\n\r\n"]


FRAMINGS: dict[str, Script] = {
    "chunked": chunked_stream(),
    "tiny-writes": bytewise(STREAM_HEAD + chunk(BODY) + b"0\r\n\r\n"),
    "chunk-per-byte": [
        STREAM_HEAD,
        *(chunk(BODY[i : i + 1]) for i in range(len(BODY))),
        b"0\r\n\r\n",
    ],
    "crlf": [STREAM_HEAD, chunk(b"".join(event(data, crlf=True) for data in EVENTS)), b"0\r\n\r\n"],
    "content-length": [head(headers=(STREAM, GEN), length=len(BODY)) + BODY],
    "gzip": _gzipped(),
}


@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_a_stream_whatever_its_framing(
    wire: Serve, clients: Clients, kind: str, framing: str
) -> None:
    """Every event's data in order, keep-alives skipped; read to its end, the stream's
    connection is reused by the next one."""
    server = await wire(FRAMINGS[framing])
    http = clients.connect(kind, server.url, limit=10)
    assert await stream(http) == STREAMED
    assert await stream(http) == STREAMED
    assert [r.connection for r in server.requests] == [1, 1]


async def test_a_stream_delimited_by_the_close(wire: Serve, clients: Clients, kind: str) -> None:
    """No length, no chunks: the stream ends when the server hangs up (an event left
    open then is dropped, as the standard says); the connection is not reused."""
    raw = head(headers=(STREAM, GEN, ("Connection", "close"))) + BODY + b'data: {"half'
    server = await wire([raw, 0.02, CLOSE])
    http = clients.connect(kind, server.url, limit=10)
    assert await stream(http) == STREAMED
    assert await stream(http) == STREAMED
    assert [r.connection for r in server.requests] == [1, 2]


async def test_multi_line_data_joins_with_newlines(
    wire: Serve, clients: Clients, kind: str
) -> None:
    body = b"data: {\n" + b'data:  "a": 1\n' + b"data: }\n\n" + event("[DONE]")
    server = await wire([STREAM_HEAD, chunk(body), b"0\r\n\r\n"])
    http = clients.connect(kind, server.url, limit=10)
    assert await stream(http) == replace(WHOLE, value=('{\n "a": 1\n}', "[DONE]"))


async def test_leaving_a_stream_early_closes_its_connection(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire(chunked_stream(pause=0.02))
    http = clients.connect(kind, server.url, limit=1)
    assert await stream(http, stop=1) == replace(WHOLE, value=EVENTS[:1])
    assert await stream(http) == STREAMED
    assert [r.connection for r in server.requests] == [1, 2]


async def test_a_long_stream_read_slowly(wire: Serve, clients: Clients, kind: str) -> None:
    """2,000 events written at once, read while the caller takes its time between them
    (the reader falls behind; nothing is lost or reordered)."""
    many = tuple(f'{{"n":{n},"pad":"{"x" * 200}"}}' for n in range(2000))
    body = b"".join(event(data) for data in many)
    server = await wire([STREAM_HEAD, chunk(body[:100_000]), chunk(body[100_000:]), b"0\r\n\r\n"])
    http = clients.connect(kind, server.url, limit=10)
    got: list[str] = []
    async with http.post(CHAT, PAYLOAD, request_timeout=5) as response:
        async for data in response.events():
            got.append(data)
            if len(got) % 100 == 0:
                await asyncio.sleep(0.001)  # the caller's own work
    assert tuple(got) == many
    assert len(http._deadlines) == 0


STALL = 0.3  # seconds: the timeouts of the stall cases


def _what(http: HttpClient) -> str:
    return f"POST {http.url(CHAT)}: "


def _broken(http: HttpClient, error: str, events: tuple[str, ...]) -> Outcome:
    """A stream that failed after its head: ``events`` came first (may have been billed)."""
    return replace(WHOLE, value=events, error=error, phase="events", sent=True, message=_what(http))


def _trickle(step: bytes, every: float, count: int) -> Script:
    return [STREAM_HEAD, *(x for _ in range(count) for x in (chunk(step), every)), HOLD]


async def test_only_keep_alives_past_the_idle_timeout(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire(_trickle(KEEPALIVE, 0.05, 40))
    http = clients.connect(kind, server.url, limit=10)
    outcome = await stream(http, seconds=5, idle=STALL)
    assert outcome == _broken(http, "RequestTimeout", ())


async def test_silence_past_the_idle_timeout(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire([STREAM_HEAD, chunk(event(EVENTS[0])), HOLD])
    http = clients.connect(kind, server.url, limit=10)
    outcome = await stream(http, seconds=5, idle=STALL)
    assert outcome == _broken(http, "RequestTimeout", EVENTS[:1])


async def test_events_past_the_total_deadline(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire(_trickle(event(EVENTS[0]), 0.05, 40))
    http = clients.connect(kind, server.url, limit=10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome = await stream(http, seconds=STALL, idle=5)
    assert loop.time() >= started + STALL  # never early
    assert (outcome.error, outcome.phase, outcome.sent, outcome.message) == (
        "RequestTimeout",
        "events",
        True,
        _what(http),
    )
    assert set(outcome.value) == {EVENTS[0]}
    assert len(outcome.value) >= 3


@pytest.mark.parametrize("cut", ["mid-event", "between-events"])
async def test_a_stream_cut_short(wire: Serve, clients: Clients, kind: str, cut: str) -> None:
    """The chunked stream ends without its last chunk: the events before, then a
    connection error (may have been billed); an event cut in half is never yielded."""
    tail = event(EVENTS[1])[:9] if cut == "mid-event" else b""
    server = await wire([STREAM_HEAD, chunk(event(EVENTS[0]) + tail), 0.02, CLOSE])
    http = clients.connect(kind, server.url, limit=10)
    outcome = await stream(http)
    assert outcome == _broken(http, "APIConnectionError", EVENTS[:1])


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (
            answer(b'{"error":{"code":429,"message":"slow down"}}', status="429 Too Many"),
            "RateLimitError",
        ),
        (
            answer(b'{"error":{"code":402,"message":"no credits"}}', status="402 Payment Required"),
            "PaymentRequiredError",
        ),
        (
            head("502 Bad Gateway", (("Content-Type", "text/html"),), length=5) + b"oops!",
            "ProviderUnavailableError",
        ),
    ],
    ids=["429", "402", "502-html"],
)
async def test_a_stream_refused_with_an_error_status(
    wire: Serve, clients: Clients, kind: str, raw: bytes, error: str
) -> None:
    server = await wire([raw], chunked_stream())
    http = clients.connect(kind, server.url, limit=10)
    outcome = await stream(http)
    assert (outcome.error, outcome.phase, outcome.value) == (error, "enter", ())
    assert await stream(http) == STREAMED
    assert [r.connection for r in server.requests] == [1, 1]  # the error's body was read


async def test_a_stream_whose_head_never_comes(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire([b"HTTP/1.1 200 OK\r\n", HOLD], chunked_stream())
    http = clients.connect(kind, server.url, limit=10)
    outcome = await stream(http, seconds=STALL, idle=5)
    assert outcome == Outcome(
        error="RequestTimeout", phase="enter", sent=True, message=_what(http), value=()
    )
    assert await stream(http) == STREAMED


def _deflated() -> Script:
    packer = zlib.compressobj()  # zlib-wrapped deflate, as servers send "deflate"
    body = packer.compress(BODY) + packer.flush()
    return [head(headers=(STREAM, GEN, ("Content-Encoding", "deflate")), length=len(body)) + body]


BIG = "y" * 1_000_000


@pytest.mark.parametrize(
    "script",
    [
        _deflated(),
        [STREAM_HEAD, chunk(BODY), b"0\r\nX-Trailer: t\r\n\r\n"],
        [STREAM_HEAD, chunk(event(BIG)), chunk(event("[DONE]")), b"0\r\n\r\n"],
    ],
    ids=["deflate", "trailers", "1MB-event"],
)
async def test_more_stream_shapes(wire: Serve, clients: Clients, kind: str, script: Script) -> None:
    server = await wire(script)
    http = clients.connect(kind, server.url, limit=10)
    first = await stream(http)
    assert first.value in (EVENTS, (BIG, "[DONE]"))
    assert await stream(http) == first
    assert [r.connection for r in server.requests] == [1, 1]


async def test_a_half_event_trickling_past_the_idle_timeout(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """Bytes keep coming but never finish an event: no event within the idle timeout."""
    server = await wire([STREAM_HEAD, chunk(b"data: {"), *_trickle(b"x", 0.05, 40)[1:]])
    http = clients.connect(kind, server.url, limit=10)
    assert await stream(http, seconds=5, idle=STALL) == _broken(http, "RequestTimeout", ())


async def test_streams_at_once_share_at_most_limit_connections(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire(chunked_stream(pause=0.02))
    http = clients.connect(kind, server.url, limit=2)
    outcomes = await asyncio.gather(*(stream(http, alone=False) for _ in range(5)))
    assert outcomes == [STREAMED] * 5
    assert len(http._deadlines) == 0
    assert server.connections == 2


async def test_a_stream_cancelled_while_reading(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire([STREAM_HEAD, chunk(event(EVENTS[0])), HOLD], chunked_stream())
    http = clients.connect(kind, server.url, limit=1)
    reading = asyncio.ensure_future(stream(http))
    await server.until(lambda: len(server.requests) == 1)
    await asyncio.sleep(0.02)  # the first event is in, the rest never comes
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert len(http._deadlines) == 0
    assert await stream(http) == STREAMED
    assert [r.connection for r in server.requests] == [1, 2]


async def test_events_in_time_keep_the_idle_timeout_away(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """An event every 0.04 s for 0.4 s under a 0.15 s idle timeout: each event (and each
    read) restarts the wait, so the stream outlasts the idle timeout many times over."""
    script: list[bytes | float | str] = [STREAM_HEAD]
    for n in range(10):
        script += [chunk(event(f'{{"n":{n}}}')), 0.04]
    server = await wire([*script, chunk(event("[DONE]")), b"0\r\n\r\n"])
    http = clients.connect(kind, server.url, limit=10)
    expected = (*(f'{{"n":{n}}}' for n in range(10)), "[DONE]")
    assert await stream(http, seconds=5, idle=0.15) == replace(WHOLE, value=expected)
