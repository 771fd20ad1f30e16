"""``HttpClient.send()`` on the wire: the owned client and an adopted aiohttp session agree.

Every scenario runs through both clients (ids ``owned``: ``HttpClient(url, key)``;
``aiohttp``: ``HttpClient(url, session=aiohttp.ClientSession(...))``) against the
same scripted raw server (tests/_wire_server.py) and asserts one expected
:class:`Outcome`: status, ``complete`` when send() returns, ``json()``, headers
looked up in any case, the exception class, ``request_sent``, the message's
``POST <url>: `` prefix, and which connection carried each request. The owned
client is the lean HTTP/1.1 client (``_http/h1/``; docs/client.md, "Connections"); aiohttp's is
the reference it must match. Failures are in tests/_http/test_http_wire_failures.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from dataclasses import replace

import pytest
from _wire_server import (  # noqa: F401  (the clients, kind and wire fixtures)
    ANSWER,
    CHAT,
    CHUNKED,
    CLOSE,
    GEN,
    HEADERS,
    JSON,
    OK,
    PAYLOAD,
    Clients,
    Outcome,
    Script,
    Serve,
    answer,
    bytewise,
    chunk,
    clients_fixture,
    exchange,
    head,
    kind_fixture,
    parsed,
    wire_fixture,
)

from provider_router import APIError, APIStatusError
from provider_router._constants import USER_AGENT
from provider_router._http.session import HttpClient


def seen(*values: str | None, **fields: object) -> Outcome:
    """An answer's outcome: ``values`` are ``headers.get`` of HEADERS (missing ones None)."""
    padded = (*values, *(None,) * (len(HEADERS) - len(values)))
    return Outcome(headers=padded, **fields)  # type: ignore[arg-type]


def ok(**changes: object) -> Outcome:
    """The JSON answer's outcome, with ``changes``."""
    return replace(OK, **changes)  # type: ignore[arg-type]


def _chunked(*parts: bytes, trailers: bytes = b"") -> bytes:
    return head(headers=(JSON, CHUNKED, GEN)) + b"".join(parts) + b"0\r\n" + trailers + b"\r\n"


def _odd_chunks() -> bytes:
    """ANSWER in chunks with extensions, upper- and lower-case hex, then trailers."""
    a, b, c = ANSWER[:26], ANSWER[26:69], ANSWER[69:]  # 0x1A and 0x2b bytes
    return _chunked(
        chunk(a, size="1A", extension=";a=b"),
        chunk(b, size="2b", extension=';name="v x";flag'),
        chunk(c),
        trailers=b"X-Trailer: t\r\nX-Other: u\r\n",
    )


async def test_a_content_length_answer(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 1]


async def test_an_answer_in_tiny_writes(wire: Serve, clients: Clients, kind: str) -> None:
    """The head a byte at a time (names in odd case, values with and without spaces
    around them), a pause, then the body a byte at a time."""
    raw_head = (
        b"HTTP/1.1 200 OK\r\ncontent-TYPE:application/json\r\nX-GENERATION-ID:   gen-wire-1  "
        b"\r\nRetry-After:3\r\nContent-Length: " + str(len(ANSWER)).encode() + b"\r\n\r\n"
    )
    server = await wire([*bytewise(raw_head), 0.02, *bytewise(ANSWER)])
    http = clients.connect(kind, server.url, limit=10)
    expected = ok(
        complete=False, headers=("application/json", "gen-wire-1", "gen-wire-1", "3", None)
    )
    assert await exchange(http) == expected
    assert await exchange(http) == expected
    assert server.connections == 1


@pytest.mark.parametrize("pace", ["one-write", "tiny-writes", "late-end"])
async def test_a_chunked_answer(wire: Serve, clients: Clients, kind: str, pace: str) -> None:
    """Extensions, upper- and lower-case hex sizes and trailers: the value whole, the
    connection reused (the trailers were read to their end). ``late-end``: the last
    chunk, its trailers and the final CRLF come apart."""
    whole = _odd_chunks()
    split = whole.index(b"\r\n\r\n") + 4
    last = whole.index(b"0\r\nX-Trailer")
    script: Script = {
        "one-write": [whole],
        "tiny-writes": [whole[:split], 0.02, *bytewise(whole[split:])],
        "late-end": [whole[: last + 3], 0.02, whole[last + 3 : -2], 0.02, whole[-2:]],
    }[pace]
    server = await wire(script)
    http = clients.connect(kind, server.url, limit=10)
    expected = ok(complete=pace == "one-write")
    assert await exchange(http) == expected
    assert await exchange(http) == expected
    assert [r.connection for r in server.requests] == [1, 1]


async def test_a_chunked_answer_that_starts_with_whitespace(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """OpenRouter sends whitespace while the model works: not complete at first, then JSON."""
    server = await wire(
        [
            head(headers=(JSON, CHUNKED, GEN)),
            chunk(b"\n"),
            0.02,
            chunk(b"\n \n"),
            0.02,
            chunk(ANSWER) + b"0\r\n\r\n",
        ]
    )
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == ok(complete=False)
    assert await exchange(http) == ok(complete=False)
    assert server.connections == 1


@pytest.mark.parametrize(
    "raw_head",
    [
        head(version="HTTP/1.0", headers=(JSON, GEN)),
        head(headers=(JSON, GEN, ("Connection", "close"))),
    ],
    ids=["http-1.0", "connection-close"],
)
async def test_a_body_delimited_by_the_close(
    wire: Serve, clients: Clients, kind: str, raw_head: bytes
) -> None:
    """No Content-Length: the body is everything until the server hangs up."""
    server = await wire([raw_head + ANSWER, 0.02, CLOSE])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == ok(complete=False)
    assert await exchange(http) == ok(complete=False)
    assert [r.connection for r in server.requests] == [1, 2]  # never reused


async def test_sequential_sends_share_one_connection(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    for _ in range(5):
        assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1] * 5
    assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_reused(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire([answer(ANSWER, GEN), 0.02, CLOSE], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    await server.until(lambda: server.closed == 1)
    await asyncio.sleep(0.02)  # the client's loop sees the FIN
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2, 2]


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
INTERIM: dict[str, Script] = {
    "100-apart": [CONTINUE, 0.02, answer(ANSWER, GEN)],
    "100-together": [CONTINUE + answer(ANSWER, GEN)],
    "103-early-hints": [HINTS, 0.02, answer(ANSWER, GEN)],
}


@pytest.mark.parametrize("case", list(INTERIM))
async def test_an_interim_answer_is_skipped(
    wire: Serve, clients: Clients, kind: str, case: str
) -> None:
    server = await wire(INTERIM[case])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert server.connections == 1


LENIENT: dict[str, bytes] = {
    "no-reason": b"HTTP/1.1 200\r\n",
    "empty-reason": b"HTTP/1.1 200 \r\n",
    "odd-reason": b"HTTP/1.1 200 Fine By Me\r\n",
}


@pytest.mark.parametrize("case", [*LENIENT, "chunked-in-capitals"])
async def test_a_head_spelled_unusually(
    wire: Serve, clients: Clients, kind: str, case: str
) -> None:
    """A status line without (or with an odd) reason phrase, a Transfer-Encoding value in
    capitals: all valid HTTP/1.1."""
    if case in LENIENT:
        raw = LENIENT[case] + answer(ANSWER, GEN).split(b"\r\n", 1)[1]
    else:
        raw = head(headers=(JSON, GEN, ("transfer-encoding", "Chunked"))) + chunk(ANSWER)
        raw += b"0\r\n\r\n"
    server = await wire([raw])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert server.connections == 1


@pytest.mark.parametrize(
    "raw",
    [head("204 No Content", (GEN,)), head(headers=(JSON, GEN), length=0)],
    ids=["204", "200-empty"],
)
async def test_an_answer_without_a_body(
    wire: Serve, clients: Clients, kind: str, raw: bytes
) -> None:
    """json() says the body is empty; the connection is reused."""
    server = await wire([raw])
    http = clients.connect(kind, server.url, limit=10)
    url = http.url(CHAT)
    empty = seen(
        "application/json" if b"200" in raw else None,
        "gen-wire-1",
        "gen-wire-1",
        status=204 if b"204" in raw else 200,
        complete=True,
        error="InvalidResponseError",
        phase="json",
        message=f"POST {url}: ",
    )
    assert await exchange(http) == empty
    assert await exchange(http) == empty
    assert server.connections == 1


def _error(code: int, message: str, **metadata: str) -> bytes:
    """OpenRouter's error body."""
    error = {"code": code, "message": message, **({"metadata": metadata} if metadata else {})}
    return json.dumps({"error": error}).encode()


RATE_LIMITED = _error(429, "Rate limit exceeded", provider_name="Chutes")
NO_CREDITS = _error(402, "Insufficient credits", limit_source="openrouter_credits")
OVERLOADED = _error(503, "Provider overloaded")

STATUS_ERRORS = {
    "429": (
        answer(RATE_LIMITED, GEN, ("Retry-After", "7"), status="429 Too Many Requests"),
        seen(
            "application/json",
            "gen-wire-1",
            "gen-wire-1",
            "7",
            status=429,
            error="RateLimitError",
            phase="send",
            message="HTTP 429 from Chutes: Rate limit exceeded",
            retry_after=7.0,
        ),
    ),
    "402": (
        answer(NO_CREDITS, status="402 Payment Required"),
        seen(
            "application/json",
            status=402,
            error="PaymentRequiredError",
            phase="send",
            message="HTTP 402: Insufficient credits",
        ),
    ),
    "500-not-json": (
        head("500 Internal Server Error", (("Content-Type", "text/plain"), GEN), length=17)
        + b"upstream exploded",
        seen(
            "text/plain",
            "gen-wire-1",
            "gen-wire-1",
            status=500,
            error="ProviderUnavailableError",
            phase="send",
            message="HTTP 500: upstream exploded",
        ),
    ),
    "503-chunked": (
        head("503 Service Unavailable", (JSON, CHUNKED))
        + chunk(OVERLOADED[:10], extension=";x=1")
        + chunk(OVERLOADED[10:])
        + b"0\r\n\r\n",
        seen(
            "application/json",
            status=503,
            error="ProviderUnavailableError",
            phase="send",
            message="HTTP 503: Provider overloaded",
        ),
    ),
}


@pytest.mark.parametrize("case", list(STATUS_ERRORS))
async def test_an_error_status(wire: Serve, clients: Clients, kind: str, case: str) -> None:
    """The mapped error with OpenRouter's body parsed; the read body frees the connection."""
    raw, expected = STATUS_ERRORS[case]
    server = await wire([raw], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == expected
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 1]


async def test_a_408_is_a_timeout_that_was_sent(wire: Serve, clients: Clients, kind: str) -> None:
    server = await wire([answer(b'{"error":{"code":408,"message":"slow"}}', status="408 Timeout")])
    http = clients.connect(kind, server.url, limit=10)
    expected = Outcome(
        error="RequestTimeout", phase="send", sent=True, message=f"POST {http.url(CHAT)}: "
    )
    assert await exchange(http) == expected


@pytest.mark.parametrize("size", [0, len(PAYLOAD), 1_000_000], ids=["empty", "small", "1MB"])
async def test_the_request_goes_out_as_written(
    wire: Serve, clients: Clients, kind: str, size: int
) -> None:
    payload = (
        PAYLOAD if size == len(PAYLOAD) else b"[" + b" " * max(size - 2, 0) + b"]" if size else b""
    )
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http, payload) == OK
    (request,) = server.requests
    assert (request.method, request.target, request.version) == (
        "POST",
        "/api/v1/chat/completions",
        "HTTP/1.1",
    )
    assert request.headers["host"] == f"127.0.0.1:{server.port}"
    assert request.headers["authorization"] == "Bearer sk-or-v1-wire-test-key"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["content-length"] == str(len(payload))
    assert request.headers["user-agent"] == USER_AGENT
    assert "transfer-encoding" not in request.headers
    assert request.body == payload


async def test_the_clients_own_headers_go_out_as_given(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """OpenRouter's attribution headers and a custom User-Agent, beside the fixed ones."""
    server = await wire([answer(ANSWER, GEN)])
    attribution = {"HTTP-Referer": "https://example.org/app", "X-Title": "Wire test"}
    http = clients.connect(kind, server.url, headers=attribution, user_agent="wire/1.0")
    assert await exchange(http) == OK
    (request,) = server.requests
    assert request.headers["http-referer"] == "https://example.org/app"
    assert request.headers["x-title"] == "Wire test"
    assert request.headers["user-agent"] == "wire/1.0"
    assert request.headers["authorization"] == "Bearer sk-or-v1-wire-test-key"
    assert request.headers["content-length"] == str(len(PAYLOAD))


async def test_a_non_ascii_header_value_goes_out_as_utf8(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """An app title with an accent and an emoji: UTF-8 bytes on the wire, as aiohttp
    writes them (the server here reads header bytes as latin-1)."""
    server = await wire([answer(ANSWER, GEN)])
    title = "Caf\u00e9 \u2615"
    http = clients.connect(kind, server.url, headers={"X-Title": title})
    assert await exchange(http) == OK
    assert server.requests[0].headers["x-title"] == title.encode().decode("latin-1")


@pytest.mark.parametrize("where", ["key", "header", "user-agent"])
@pytest.mark.parametrize("brk", ["\r\n", "\n"], ids=["crlf", "lf"])
async def test_a_line_break_in_a_header_value_is_refused_before_sending(
    wire: Serve, clients: Clients, kind: str, where: str, brk: str
) -> None:
    """A key or header value with a line break in it (two keys pasted into one variable)
    would write a header line of its own: refused (a ValueError: aiohttp's, or our
    ConfigurationError), nothing sent."""
    server = await wire([answer(ANSWER, GEN)])
    evil = f"sk-or-v1-first{brk}X-Injected: 1"
    given = {"key": {"key": evil}, "header": {"headers": {"X-Title": evil}}}
    # aiohttp's ValueError or our ConfigurationError, when the client is built or sends:
    with pytest.raises(ValueError):  # noqa: PT011, PT012
        http = clients.connect(kind, server.url, **given.get(where, {"user_agent": evil}))
        response = await http.send(CHAT, PAYLOAD)
        response.close()
    assert server.requests == []


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_large_body_arrives_intact(
    wire: Serve, clients: Clients, kind: str, framing: str
) -> None:
    text = "".join(chr(0x41 + i % 26) for i in range(5_000_000))
    body = json.dumps({"id": "gen-big", "choices": [{"message": {"content": text}}]}).encode()
    if framing == "chunked":
        raw = _chunked(*(chunk(body[i : i + 65536]) for i in range(0, len(body), 65536)))
    else:
        raw = answer(body, GEN)
    server = await wire([raw])
    http = clients.connect(kind, server.url, limit=10)
    outcome = await exchange(http)
    assert outcome.status == 200
    assert outcome.value == {"id": "gen-big", "choices": [{"message": {"content": text}}]}
    assert await exchange(http) == outcome
    assert server.connections == 1


# JSON with CRLF inside, cut into 7-byte chunks: some split a CRLF of the data.
PRETTY = json.dumps(json.loads(ANSWER), indent=1).replace("\n", "\r\n").encode()

WITNESSED: dict[str, list[Script]] = {
    "content-length": [[answer(ANSWER, GEN, ("x-Odd-CASE", "  v  w "), ("X-Empty", ""))]],
    "tiny-writes": [bytewise(answer(ANSWER, GEN))],
    "chunked": [[_odd_chunks()]],
    "gzip": [[answer(gzip.compress(ANSWER), GEN, ("Content-Encoding", "gzip"))]],
    "deflate": [[answer(zlib.compress(ANSWER), GEN, ("Content-Encoding", "deflate"))]],
    "big-head": [[answer(ANSWER, GEN, *((f"X-Filler-{i}", "v" * 60) for i in range(100)))]],
    "close-delimited": [[head(version="HTTP/1.0", headers=(JSON, GEN)) + ANSWER, 0.02, CLOSE]],
    "100-continue": [[b"HTTP/1.1 100 Continue\r\n\r\n", 0.02, answer(ANSWER, GEN)]],
    "204": [[head("204 No Content", (GEN, ("Content-Type", "text/plain")))]],
    "429-then-200": [[STATUS_ERRORS["429"][0]], [answer(ANSWER, GEN)]],
    "500-chunked-then-200": [[STATUS_ERRORS["503-chunked"][0]], [answer(ANSWER, GEN)]],
    "201": [[answer(ANSWER, GEN, status="201 Created")]],
    "html-200": [
        [head(headers=(("Content-Type", "text/html"),), length=19) + b"<html>oops</html>\r\n"]
    ],
    "crlf-in-chunks": [
        bytewise(_chunked(*(chunk(PRETTY[i : i + 7]) for i in range(0, len(PRETTY), 7))))
    ],
    "last-chunk-extension": [[_odd_chunks().replace(b"\r\n0\r\nX-T", b"\r\n0;end=1\r\nX-T")]],
}


async def _witness(http: HttpClient) -> tuple[object, ...]:
    """Status, ``complete``, every header (names lower-cased), the value or the error."""
    try:
        response = await http.send(CHAT, PAYLOAD)
    except APIStatusError as exc:
        return type(exc).__name__, exc.status, exc.headers, exc.body, exc.retry_after
    headers = {name.lower(): value for name, value in response.headers.items()}
    seen = (response.status, response.complete, headers)
    try:
        value = await response.json()
    except APIError as exc:
        response.close()
        return (*seen, type(exc).__name__)
    response.release()
    return (*seen, value)


@pytest.mark.parametrize("case", list(WITNESSED))
async def test_the_owned_client_sees_what_aiohttp_sees(
    wire: Serve, clients: Clients, case: str
) -> None:
    """Held against each other, beyond the expected outcomes above: all headers, the
    requests as the server read them (aiohttp's Accept-Encoding aside: the owned
    client need not offer compression), which connection carried each."""
    answers, connections, requests = {}, {}, {}
    for kind in ("aiohttp", "owned"):
        server = await wire(*WITNESSED[case])
        http = clients.connect(kind, server.url, limit=10)
        answers[kind] = [await _witness(http) for _ in range(3)]
        connections[kind] = [r.connection for r in server.requests]
        requests[kind] = []
        for r in server.requests:
            r.headers.pop("accept-encoding", None)
            r.headers["host"] = r.headers["host"].replace(str(server.port), "PORT")
            requests[kind].append((r.method, r.target, r.version, r.body, r.headers))
    assert answers["owned"] == answers["aiohttp"]
    assert connections["owned"] == connections["aiohttp"]
    for owned, reference in zip(requests["owned"], requests["aiohttp"], strict=True):
        assert owned == reference
