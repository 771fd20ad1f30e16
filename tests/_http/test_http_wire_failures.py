"""``HttpClient.send()`` failures on the wire: the owned client and aiohttp's agree.

As tests/_http/test_http_wire.py, for answers that do not come whole: a refused
connection (the only "never sent"), a hang-up before or after the request was
read, a head or body cut short, a garbled head, a head or body that stalls past
the deadline. Each asserts the exception class, where it was raised (``send()``
or ``json()``), ``request_sent`` and the ``POST <url>: `` prefix; after each,
nothing is left registered in the client's deadlines (``exchange`` checks) and
the next send to a healthy answer works, on a new connection.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from _wire_server import (  # noqa: F401  (the clients, kind and wire fixtures)
    ANSWER,
    CHAT,
    CHUNKED,
    CLOSE,
    GEN,
    HOLD,
    JSON,
    OK,
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

CHUNKED_HEAD = head(headers=(JSON, CHUNKED, GEN))
CUT_HEAD = head(headers=(JSON, GEN), length=len(ANSWER))
STALL = 0.3  # the deadline of the stall cases: seconds

# case: (script for the first request, deadline, (exception, raised by, headers seen))
FAILURES: dict[str, tuple[Script, float, tuple[str, str, bool]]] = {
    "hang-up-after-request": ([CLOSE], 5, ("APIConnectionError", "send", False)),
    "cut-head": (
        [b"HTTP/1.1 200 OK\r\nContent-Ty", CLOSE],
        5,
        ("APIConnectionError", "send", False),
    ),
    "garbage-status-line": ([b"HELLO\r\n\r\n", HOLD], 5, ("APIConnectionError", "send", False)),
    "bad-status-code": (
        [b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", HOLD],
        5,
        ("APIConnectionError", "send", False),
    ),
    "bad-content-length": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", HOLD],
        5,
        ("APIConnectionError", "send", False),
    ),
    "negative-content-length": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n" + ANSWER, HOLD],
        5,
        ("APIConnectionError", "send", False),
    ),
    "cut-body": ([CUT_HEAD + ANSWER[:20], CLOSE], 5, ("APIConnectionError", "json", True)),
    "cut-chunk": (
        [CHUNKED_HEAD + chunk(ANSWER)[:30], CLOSE],
        5,
        ("APIConnectionError", "json", True),
    ),
    "cut-before-last-chunk": (
        [CHUNKED_HEAD + chunk(ANSWER), CLOSE],
        5,
        ("APIConnectionError", "json", True),
    ),
    "no-answer": ([HOLD], STALL, ("RequestTimeout", "send", False)),
    "head-stalls": (
        [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", HOLD],
        STALL,
        ("RequestTimeout", "send", False),
    ),
    "body-stalls": ([CUT_HEAD + ANSWER[:5], HOLD], STALL, ("RequestTimeout", "json", True)),
    "chunked-body-stalls": (
        [CHUNKED_HEAD + chunk(b"\n") + chunk(ANSWER[:9]), HOLD],
        STALL,
        ("RequestTimeout", "json", True),
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
async def test_a_failure_after_the_connection_opened(
    wire: Serve, clients: Clients, kind: str, case: str
) -> None:
    """May have been billed: request_sent stays True, whichever call raised."""
    script, seconds, (error, phase, headers) = FAILURES[case]
    server = await wire(script, [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    expected = Outcome(error=error, phase=phase, sent=True, message=f"POST {http.url(CHAT)}: ")
    if headers:
        expected = replace(expected, status=200, complete=False, headers=SEEN)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await exchange(http, seconds=seconds) == expected
    assert error != "RequestTimeout" or loop.time() >= started + seconds  # never early
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2]


async def test_a_refused_connection_is_never_sent(
    wire: Serve, clients: Clients, kind: str, unused_tcp_port: int
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}/api/v1"
    http = clients.connect(kind, url, limit=10)
    refused = Outcome(
        error="APIConnectionError",
        phase="send",
        sent=False,
        message=f"POST {url}/chat/completions: ",
    )
    assert await exchange(http) == refused  # provably free
    server = await wire([answer(ANSWER, GEN)], port=unused_tcp_port)
    assert await exchange(http) == OK  # the port answers now
    assert server.connections == 1


async def test_a_hang_up_on_accept_may_have_been_sent(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """The connection opened (the kernel accepted it): the request may have gone out."""
    server = await wire([answer(ANSWER, GEN)], hang_up_on_accept=True)
    http = clients.connect(kind, server.url, limit=10)
    hung_up = Outcome(
        error="APIConnectionError", phase="send", sent=True, message=f"POST {http.url(CHAT)}: "
    )
    assert await exchange(http) == hung_up
    server.hang_up_on_accept = False
    assert await exchange(http) == OK
    assert server.connections == 2


async def test_a_server_closing_right_after_a_whole_answer(
    wire: Serve, clients: Clients, kind: str
) -> None:
    """No ``Connection: close``, the server just hangs up after its answer: the next
    request may go out on that connection before the client saw the hang-up (aiohttp
    does so), and then fails as "may have been sent"; the one after gets a new one."""
    server = await wire([answer(ANSWER, GEN), CLOSE], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http) == OK
    reused = Outcome(
        error="APIConnectionError", phase="send", sent=True, message=f"POST {http.url(CHAT)}: "
    )
    assert await exchange(http) in (reused, OK)  # OK: it saw the hang-up in time
    assert await exchange(http) == OK
    assert server.connections == 2


# Not valid HTTP/1.1, but aiohttp reads them (llhttp is lenient), and the answer may
# have been paid for: both clients read them.
TOLERATED = {
    "space-before-colon": CUT_HEAD.replace(b"Content-Length:", b"Content-Length :") + ANSWER,
    "bare-lf": CUT_HEAD.replace(b"\r\n", b"\n") + ANSWER,
}


@pytest.mark.parametrize("case", list(TOLERATED))
async def test_a_malformed_head_aiohttp_reads(
    wire: Serve, clients: Clients, kind: str, case: str
) -> None:
    server = await wire([TOLERATED[case]])
    http = clients.connect(kind, server.url, limit=10)
    assert await exchange(http, seconds=STALL) == OK
    assert await exchange(http, seconds=STALL) == OK
    assert server.connections == 1


@pytest.mark.parametrize("stage", ["cut", "stalled"])
async def test_an_error_status_whose_body_does_not_come_whole(
    wire: Serve, clients: Clients, kind: str, stage: str
) -> None:
    """The status and headers decide the error (the body is what OpenRouter said, when
    it came): a 429 with Retry-After is a RateLimitError either way, at once or at the
    deadline."""
    part = head("429 Too Many Requests", (JSON, GEN, ("Retry-After", "3")), length=100) + b'{"err'
    server = await wire([part, CLOSE if stage == "cut" else HOLD], [answer(ANSWER, GEN)])
    http = clients.connect(kind, server.url, limit=10)
    limited = Outcome(
        status=429,
        headers=("application/json", "gen-wire-1", "gen-wire-1", "3", None),
        error="RateLimitError",
        phase="send",
        message="HTTP 429: Too Many Requests",
        retry_after=3.0,
    )
    assert await exchange(http, seconds=STALL) == limited
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2]
