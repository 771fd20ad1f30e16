"""``HttpClient.send()``'s connections: the owned client's pool and aiohttp's agree.

As tests/_http/test_http_wire.py, for what happens to a connection between requests:
requests at once share at most ``limit`` connections; a request that waits for
one past its deadline may still have been sent as far as money goes; a response
released or closed before its body ended is never reused (its leftover bytes
would be the next answer); a whole one is, read or not, released or closed;
closing the client closes its connections and fails the requests in flight as
"may have been sent"; a cancel frees the connection's place; every spelling of
``Connection: close`` is honoured; TLS connects as aiohttp does.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
from _certificate import certificate_fixture  # noqa: F401  (the certificate fixture)
from _wire_server import (  # noqa: F401  (the clients, kind and wire fixtures)
    ANSWER,
    CHAT,
    CHUNKED,
    CLOSE,
    GEN,
    HOLD,
    JSON,
    OK,
    PAYLOAD,
    SEEN,
    Clients,
    Outcome,
    Script,
    Serve,
    answer,
    chunk,
    clients_fixture,
    exchange,
    head,
    kind_fixture,
    wire_fixture,
)

from provider_router import ConfigurationError

SLOW = [0.05, answer(ANSWER, GEN)]  # the answer after a pause: requests overlap meanwhile


# How servers spell "close": the field's value is a comma-separated, case-insensitive
# list, with optional whitespace (spaces or tabs) after the colon (RFC 9110 7.6.1, 5.6).
CLOSE_SPELLINGS = {
    "usual": b"Connection: close",
    "no-space": b"Connection:close",
    "two-spaces": b"Connection:  close",
    "tab": b"Connection:\tclose",
    "capitals": b"connection: CLOSE",
    "in-a-list": b"Connection: keep-alive, close",
}


def _closing(spelling: str) -> bytes:
    raw = answer(ANSWER, GEN)
    return raw.replace(b"\r\n\r\n", b"\r\n" + CLOSE_SPELLINGS[spelling] + b"\r\n\r\n", 1)


@pytest.mark.parametrize("spelling", list(CLOSE_SPELLINGS))
async def test_connection_close_in_the_answer_is_honoured(
    wire: Serve, clients: Clients, kind: str, spelling: str
) -> None:
    """The server says close but leaves the socket open: the client must not reuse it."""
    server = await wire([_closing(spelling)])
    http = clients.connect(kind, server.url, limit=10)
    for _ in range(3):
        assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2, 3]


@pytest.mark.parametrize("spelling", list(CLOSE_SPELLINGS))
async def test_connection_close_and_a_hang_up_fail_no_request(
    wire: Serve, clients: Clients, kind: str, spelling: str
) -> None:
    """The server says close and hangs up at once: a client that missed the close would
    send the next request into the dead connection (a failure that may have been billed)."""
    server = await wire([_closing(spelling), CLOSE])
    http = clients.connect(kind, server.url, limit=10)
    for _ in range(3):
        assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2, 3]


@pytest.mark.parametrize("limit", [1, 3, 0])
async def test_requests_at_once_share_at_most_limit_connections(
    wire: Serve, clients: Clients, kind: str, limit: int
) -> None:
    """``limit=0``: no limit, one connection for each request at once."""
    server = await wire(SLOW)
    http = clients.connect(kind, server.url, limit=limit)
    outcomes = await asyncio.gather(*(exchange(http, alone=False) for _ in range(7)))
    assert outcomes == [OK] * 7
    assert len(http._deadlines) == 0
    opened = limit or 7
    assert server.connections == opened
    assert sorted({r.connection for r in server.requests}) == list(range(1, opened + 1))


async def test_waiting_for_a_connection_past_the_deadline(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """The only connection is busy with a stalled answer: the second request times out
    waiting for it, never sent. The lean pool knows it wrote nothing (request_sent is
    False, #20); an adopted aiohttp session cannot say where its wait ended, so there it
    stays True (the side that never pays twice)."""
    server = await wire([HOLD], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=1)
    stalled = asyncio.ensure_future(exchange(http, seconds=0.4, alone=False))
    await server.until(lambda: len(server.requests) == 1)
    waiting = await exchange(http, seconds=0.1, alone=False)
    assert waiting == Outcome(
        error="RequestTimeout",
        phase="send",
        sent=kind == "aiohttp",
        message=f"POST {http.url(CHAT)}: ",
    )
    assert len(server.requests) == 1  # it never reached the server
    assert (await stalled).error == "RequestTimeout"
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2]


@pytest.mark.parametrize("end", ["release", "close"])
async def test_a_response_ended_before_its_body_is_never_reused(
    wire: Serve, clients: Clients, kind: str, end: str
) -> None:
    """The rest of the first body arrives after the response was ended: on a reused
    connection it would be read as the next answer."""
    first = [head(headers=(JSON, GEN), length=len(ANSWER)) + ANSWER[:10], 0.05, ANSWER[10:]]
    server = await wire(first, [answer(b'{"id":"gen-2"}', GEN)])
    http = clients.connect(kind, server.url, limit=1)
    response = await http.send(CHAT, PAYLOAD)
    assert not response.complete
    response.release() if end == "release" else response.close()
    assert len(http._deadlines) == 0
    second = await exchange(http)
    assert second.value == {"id": "gen-2"}
    assert [r.connection for r in server.requests] == [1, 2]


@pytest.mark.parametrize("end", ["release", "close"])
async def test_a_whole_response_ended_unread_keeps_its_connection(
    wire: Serve, clients: Clients, kind: str, end: str
) -> None:
    """A body that arrived whole gave its connection back already (as aiohttp does at
    the body's end): released or closed, unread, the next request reuses it."""
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=1)
    response = await http.send(CHAT, PAYLOAD)
    assert response.complete
    response.release() if end == "release" else response.close()
    assert len(http._deadlines) == 0
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 1]


async def test_closing_the_client_closes_its_connections(
    wire: Serve, clients: Clients, kind: str
) -> None:
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=3)
    assert await asyncio.gather(*(exchange(http, alone=False) for _ in range(3))) == [OK] * 3
    assert server.closed == 0  # kept alive, idle in the pool
    await clients.close(http)
    await server.until(lambda: server.closed == server.connections)
    with pytest.raises(ConfigurationError, match="closed"):
        await http.send(CHAT, PAYLOAD)


async def test_closing_the_client_fails_a_request_in_flight(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """Waiting for the head. (Waiting for the body, aiohttp's read waits on until the
    deadline, a RequestTimeout, where the lean path fails at once: both "may have been
    sent", not held equal.)"""
    server = await wire([HOLD])
    http = clients.connect(kind, server.url, limit=3)
    in_flight = asyncio.ensure_future(exchange(http))
    await server.until(lambda: len(server.requests) == 1)
    await clients.close(http)
    assert await in_flight == Outcome(
        error="APIConnectionError", phase="send", sent=True, message=f"POST {http.url(CHAT)}: "
    )
    await server.until(lambda: server.closed == 1)


async def test_a_cancel_while_waiting_for_a_connection(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """Queued behind the only connection, cancelled: it never reaches the server and
    takes no place; the next request gets the connection's place when it frees."""
    server = await wire([HOLD], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=1)
    stalled = asyncio.ensure_future(exchange(http, seconds=0.3, alone=False))
    await server.until(lambda: len(server.requests) == 1)
    queued = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=5))
    await asyncio.sleep(0.02)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert (await stalled).error == "RequestTimeout"
    assert len(http._deadlines) == 0
    assert await exchange(http, seconds=1) == OK
    assert [r.connection for r in server.requests] == [1, 2]


RATE_LIMITED = answer(b'{"error":{"code":429,"message":"slow down"}}', status="429 Too Many")
CUT = head(headers=(JSON, GEN), length=len(ANSWER)) + ANSWER[:20]
GIST = OK.value  # the whole answer's value
BURST: dict[str, tuple[Script, Outcome]] = {  # what is played, the gist of what comes
    "whole": ([answer(ANSWER, GEN)], Outcome(status=200, complete=True, value=GIST)),
    "late": ([0.01, answer(ANSWER, GEN)], Outcome(status=200, complete=True, value=GIST)),
    "429": ([RATE_LIMITED], Outcome(status=429, error="RateLimitError", phase="send")),
    "cut-body": (
        [CUT, CLOSE],
        Outcome(status=200, complete=False, error="APIConnectionError", phase="json", sent=True),
    ),
    "hang-up": ([CLOSE], Outcome(error="APIConnectionError", phase="send", sent=True)),
}


def _gist(outcome: Outcome) -> str:
    return repr(replace(outcome, headers=(), message=None, retry_after=None))


async def test_a_burst_of_mixed_answers(wire: Serve, clients: Clients, kind: str) -> None:
    """25 requests at once over 4 connections, each answered as BURST says in turn: every
    request gets its own answer or failure, whatever the connection it took."""
    cases = list(BURST) * 5
    server = await wire(*(BURST[case][0] for case in cases))
    http = clients.connect(kind, server.url, limit=4)
    outcomes = await asyncio.gather(*(exchange(http, alone=False) for _ in cases))
    assert len(http._deadlines) == 0
    assert sorted(map(_gist, outcomes)) == sorted(_gist(BURST[case][1]) for case in cases)
    assert 4 <= server.connections <= 4 + 10  # a new one after each cut or hang-up at most


async def test_a_cancel_while_waiting_for_the_head(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """A cancel from outside is a cancel; the connection, in an unknown state, is not
    reused, and its place under the limit is free again."""
    server = await wire([HOLD], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=1)
    sending = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=5))
    await server.until(lambda: len(server.requests) == 1)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert len(http._deadlines) == 0
    assert await exchange(http, seconds=1) == OK
    assert [r.connection for r in server.requests] == [1, 2]


async def test_a_cancel_while_reading_the_body(wire: Serve, clients: Clients, kind: str) -> None:
    first = [head(headers=(JSON, GEN), length=len(ANSWER)) + ANSWER[:10], HOLD]
    server = await wire(first, [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=1)
    response = await http.send(CHAT, PAYLOAD, request_timeout=5)
    reading = asyncio.ensure_future(response.json())
    await asyncio.sleep(0.02)  # waiting for the rest of the body
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    response.close()
    assert len(http._deadlines) == 0
    assert await exchange(http, seconds=1) == OK
    assert [r.connection for r in server.requests] == [1, 2]


async def test_send_post_and_get_on_one_client(wire: Serve, clients: Clients, kind: str) -> None:
    """send() beside post() and get_json() (which may keep connections of their own):
    each answers, and closing the client closes every connection."""
    server = await wire([answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    async with http.post(CHAT, PAYLOAD) as response:
        assert await response.json() == OK.value
    assert await http.get_json("/models") == OK.value
    assert await exchange(http) == OK
    assert [(r.method, r.target) for r in server.requests] == [
        ("POST", "/api/v1/chat/completions"),
        ("POST", "/api/v1/chat/completions"),
        ("GET", "/api/v1/models"),
        ("POST", "/api/v1/chat/completions"),
    ]
    await clients.close(http)
    await server.until(lambda: server.closed == server.connections)


async def test_an_ipv6_literal_base_url(wire: Serve, clients: Clients, kind: str) -> None:
    try:
        server = await wire([answer(ANSWER, GEN)], host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert server.connections == 1
    assert server.requests[0].headers["host"] == f"[::1]:{server.port}"


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
async def test_a_json_answer_over_tls(
    wire: Serve,
    clients: Clients,
    kind: str,
    certificate: Path,
    monkeypatch: pytest.MonkeyPatch,
    trusted: bool,
) -> None:
    """The owned client trusts what ``SSL_CERT_FILE`` names (ssl.create_default_context);
    the adopted session is given the same CA. Untrusted, the handshake fails before
    the request was written: never sent."""
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(certificate, certificate.with_name("key.pem"))
    big = json.dumps({"id": "gen-big", "content": "x" * 1_000_000}).encode()
    chunks = b"".join(chunk(big[i : i + 16384]) for i in range(0, len(big), 16384))
    chunked = head(headers=(JSON, CHUNKED, GEN)) + chunks + b"0\r\n\r\n"
    server = await wire([answer(ANSWER, GEN)], [answer(ANSWER, GEN)], [chunked], tls=served)
    ca = None
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # read when the pool starts
        ca = ssl.create_default_context(cafile=certificate) if kind == "aiohttp" else None
    url = f"https://localhost:{server.port}/api/v1"
    http = clients.connect(kind, url, limit=10, ca=ca)
    if not trusted:
        refused = Outcome(
            error="APIConnectionError", phase="send", sent=False, message=f"POST {http.url(CHAT)}: "
        )
        assert await exchange(http) == refused
        assert server.requests == []
        return
    assert await exchange(http) == OK
    assert await exchange(http) == OK
    assert (await exchange(http)).value == json.loads(big)  # 1 MB in many TLS records
    assert server.connections == 1
    assert server.requests[0].headers["host"] == f"localhost:{server.port}"
