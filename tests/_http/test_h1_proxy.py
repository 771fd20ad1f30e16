"""Proxies as users expect them, through a real tinyproxy on loopback: HTTPS_PROXY /
HTTP_PROXY / ALL_PROXY / NO_PROXY (and lower case) for completions (the lean pool) and
GETs (aiohttp), an HTTP origin by absolute URL and an HTTPS one through CONNECT; the
proxy's own log says what went through it, and its credentials are never shown."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _certificate import certificate_fixture  # noqa: F401  (the certificate fixture)
from _polling import until
from _proxy_server import StartProxy, tinyproxy_fixture  # noqa: F401  (the tinyproxy fixture)
from _raw_http import exchange
from _wire_server import CLOSE, HOLD, Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)
from yarl import URL

from provider_router import (
    APIConnectionError,
    APIStatusError,
    ConfigurationError,
    MemoryLedger,
    ProviderPolicy,
    RequestTimeout,
    Router,
)
from provider_router._http.h1.proxy import proxy_for
from provider_router._http.session import HttpClient
from provider_router.client._billing import provably_free
from provider_router.testing import DEFAULT_TEST_KEY
from provider_router.testing.loopback import answer_every_request, tls_contexts

CHAT = "/chat/completions"
ANSWER = {"id": "gen-1"}
BODY = json.dumps(ANSWER).encode()
PASSWORD = "pr0xy-s3cret-pw"


async def traffic(http: HttpClient, posts: int = 3) -> None:
    """``posts`` completions (the lean pool) and one GET (aiohttp), all answered."""
    for _ in range(posts):
        assert await exchange(http) == ANSWER
    assert await http.get_json("/models") == ANSWER


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
async def test_every_request_to_an_http_origin_goes_through_the_proxy(
    wire: Serve, tinyproxy: StartProxy, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    proxy = tinyproxy()
    server = await wire([answer(BODY)])
    monkeypatch.setenv(variable, proxy.url)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        await traffic(http)
    assert proxy.requests() == [f"POST {server.url}{CHAT}"] * 3 + [f"GET {server.url}/models"]
    assert len(server.requests) == 4
    assert all(r.target.startswith("/api/v1/") for r in server.requests)  # origin-form upstream


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
async def test_an_https_origin_is_reached_through_a_tunnel(
    wire: Serve,
    tinyproxy: StartProxy,
    certificate: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    proxy = tinyproxy()
    served, trusted = tls_contexts(certificate)
    server = await wire([answer(BODY)], tls=served)
    monkeypatch.setenv(variable, proxy.url)
    url = f"https://127.0.0.1:{server.port}/api/v1"
    async with HttpClient(url, DEFAULT_TEST_KEY, ssl=trusted) as http:
        await traffic(http)
    assert len(server.requests) == 4
    # One tunnel per connection (the lean pool's, aiohttp's): none went around the proxy.
    assert server.connections == 2
    assert proxy.requests() == [f"CONNECT 127.0.0.1:{server.port}"] * 2


async def test_tls_in_the_tunnel_names_the_origin_not_the_proxy(
    wire: Serve, tinyproxy: StartProxy, certificate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handshake's server name (SNI, and the name the certificate is checked against)
    is the origin's, ``localhost``, though the socket goes to the proxy at 127.0.0.1."""
    proxy = tinyproxy()
    served, trusted = tls_contexts(certificate)
    names: list[str | None] = []
    served.sni_callback = lambda _sock, name, _context: names.append(name)
    server = await wire([answer(BODY)], tls=served)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    url = f"https://localhost:{server.port}/api/v1"
    async with HttpClient(url, DEFAULT_TEST_KEY, ssl=trusted) as http:
        await traffic(http, posts=1)
    assert names == ["localhost", "localhost"]  # the lean pool's tunnel, aiohttp's
    assert proxy.requests() == [f"CONNECT localhost:{server.port}"] * 2


async def test_an_untrusted_origin_behind_a_tunnel_is_named_never_sent(
    wire: Serve, tinyproxy: StartProxy, certificate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The certificate check fails inside the tunnel: the error names the origin whose
    certificate it is (and the proxy it went through), not the proxy alone."""
    proxy = tinyproxy()
    served, _ = tls_contexts(certificate)
    server = await wire([answer(BODY)], tls=served)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    async with HttpClient(f"https://localhost:{server.port}/api/v1", DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
    assert caught.value.request_sent is False
    message = str(caught.value)
    assert f"localhost:{server.port}" in message
    assert f"proxy 127.0.0.1:{proxy.port}" in message
    assert "certificate verify failed" in message
    assert server.requests == []


@pytest.mark.parametrize("bypass", ["127.0.0.1", "localhost,127.0.0.1", "*"])
async def test_no_proxy_goes_direct(
    wire: Serve, tinyproxy: StartProxy, monkeypatch: pytest.MonkeyPatch, bypass: str
) -> None:
    proxy = tinyproxy()
    server = await wire([answer(BODY)])
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(variable, proxy.url)
    monkeypatch.setenv("no_proxy", bypass)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        await traffic(http)
    assert len(server.requests) == 4
    assert proxy.requests() == []


async def test_a_proxy_with_credentials_is_used_and_never_shown(
    wire: Serve,
    tinyproxy: StartProxy,
    certificate: Path,
    monkeypatch: pytest.MonkeyPatch,
    log_events: list[dict[str, Any]],
) -> None:
    proxy = tinyproxy(auth=("router", PASSWORD))
    served, trusted = tls_contexts(certificate)
    server = await wire([answer(BODY)], tls=served)
    monkeypatch.setenv("HTTPS_PROXY", f"http://router:{PASSWORD}@127.0.0.1:{proxy.port}")
    url = f"https://127.0.0.1:{server.port}/api/v1"
    async with HttpClient(url, DEFAULT_TEST_KEY, ssl=trusted) as http:
        await traffic(http, posts=1)
        shown = [repr(http), repr(http._pool), repr(http._proxy)]
    assert proxy.requests() == [f"CONNECT 127.0.0.1:{server.port}"] * 2
    # aiohttp alone would have sent the session's Authorization (the API key) to the proxy
    # as the CONNECT's Proxy-Authorization: the key travels with each GET instead.
    assert all("proxy-authorization" not in r.headers for r in server.requests)
    assert all(r.headers["authorization"] == f"Bearer {DEFAULT_TEST_KEY}" for r in server.requests)
    assert not any(PASSWORD in text for text in shown)
    assert PASSWORD not in repr(log_events)


async def test_a_proxy_with_credentials_serves_an_http_origin_posts_and_gets(
    wire: Serve, tinyproxy: StartProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tunnel: each request goes to the proxy itself and carries its credentials (a
    GET too: aiohttp sends ``proxy_headers`` only in a CONNECT, the GET came back 407)."""
    proxy = tinyproxy(auth=("router", PASSWORD))
    server = await wire([answer(BODY)])
    monkeypatch.setenv("HTTP_PROXY", f"http://router:{PASSWORD}@127.0.0.1:{proxy.port}")
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        await traffic(http, posts=1)
        shown = repr(http) + repr(http._pool) + repr(http._proxy)
    assert proxy.requests() == [f"POST {server.url}{CHAT}", f"GET {server.url}/models"]
    assert all(r.headers["authorization"] == f"Bearer {DEFAULT_TEST_KEY}" for r in server.requests)
    assert PASSWORD not in shown


@pytest.mark.parametrize("origin", ["http", "https"])
async def test_wrong_proxy_credentials_fail_without_showing_them(
    wire: Serve,
    tinyproxy: StartProxy,
    certificate: Path,
    monkeypatch: pytest.MonkeyPatch,
    origin: str,
) -> None:
    proxy = tinyproxy(auth=("router", "the-right-one"))
    served, trusted = tls_contexts(certificate)
    server = await wire([answer(BODY)], tls=served if origin == "https" else None)
    for variable in ("HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(variable, f"http://router:{PASSWORD}@127.0.0.1:{proxy.port}")
    url = f"{origin}://127.0.0.1:{server.port}/api/v1"
    async with HttpClient(url, DEFAULT_TEST_KEY, ssl=trusted) as http:
        with pytest.raises((APIConnectionError, APIStatusError)) as caught:
            await exchange(http)
    error = caught.value
    if origin == "https":
        # The proxy refused the tunnel: our request never left for the origin.
        assert isinstance(error, APIConnectionError)
        assert error.request_sent is False
        assert "401 Unauthorized" in str(error)  # tinyproxy's answer (RFC 9110 says 407)
    else:
        # The proxy answered the request itself: a status, as aiohttp reports it.
        assert isinstance(error, APIStatusError)
        assert error.status == 401
    assert PASSWORD not in str(error) + repr(error.__cause__) + repr(vars(error))
    assert server.requests == []


async def test_a_gets_connect_carries_neither_the_key_nor_the_callers_headers(
    wire: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp merges a session's default headers into the CONNECT it sends a proxy: a
    gateway key given as a header would have reached the proxy, as the API key would."""
    proxy = await wire([b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"])
    monkeypatch.setenv("HTTPS_PROXY", f"http://router:{PASSWORD}@127.0.0.1:{proxy.port}")
    headers = {"X-Gateway-Key": "gw-s3cret", "X-OpenRouter-Title": "EAGLE-3 data"}
    async with HttpClient("https://127.0.0.1:9/api/v1", DEFAULT_TEST_KEY, headers=headers) as http:
        with pytest.raises(APIConnectionError):
            await http.get_json("/models")
    (connect,) = proxy.requests
    assert connect.method == "CONNECT"
    assert connect.headers["proxy-authorization"].startswith("Basic ")
    assert not {"authorization", "x-gateway-key", "x-openrouter-title"} & set(connect.headers)


@pytest.mark.parametrize("status", ["502 Bad Gateway", "504 Gateway Timeout"])
async def test_a_plain_http_proxys_gateway_error_may_have_been_billed(
    wire: Serve, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """A proxy that lost its upstream, or gave up waiting for it, answers for the origin,
    which may have the request and bill it: not an error status OpenRouter does not charge
    for (the reservation would be released), but a failure after sending."""
    proxy = await wire([answer(b"<html>gateway</html>", status=status)])
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    async with HttpClient("http://127.0.0.1:9/api/v1", DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
    assert caught.value.request_sent is True
    assert not provably_free(caught.value, sent=True)
    assert status.split()[0] in str(caught.value)
    (request,) = proxy.requests
    assert request.target == f"http://127.0.0.1:9/api/v1{CHAT}"


async def test_a_plain_http_proxys_other_refusals_stay_statuses(
    wire: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await wire([answer(b"no", status="403 Forbidden")])
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    async with HttpClient("http://127.0.0.1:9/api/v1", DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIStatusError) as caught:
            await exchange(http)
    assert caught.value.status == 403


async def test_a_proxy_that_does_not_listen_was_never_sent(
    wire: Serve, monkeypatch: pytest.MonkeyPatch, unused_tcp_port: int
) -> None:
    server = await wire([answer(BODY)])
    monkeypatch.setenv("HTTP_PROXY", f"http://router:{PASSWORD}@127.0.0.1:{unused_tcp_port}")
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
    assert caught.value.request_sent is False
    assert f"127.0.0.1:{unused_tcp_port}" in str(caught.value)
    assert PASSWORD not in str(caught.value)
    assert server.requests == []


@pytest.mark.parametrize(
    "proxy_url",
    [f"socks5://router:{PASSWORD}@127.0.0.1:1080", f"https://router:{PASSWORD}@127.0.0.1:3129"],
)
def test_a_proxy_we_cannot_speak_to_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, proxy_url: str
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    with pytest.raises(
        ConfigurationError, match=r"127\.0\.0\.1:\d+.*only http:// proxies"
    ) as caught:
        HttpClient("https://openrouter.ai/api/v1", DEFAULT_TEST_KEY)
    assert PASSWORD not in str(caught.value)


async def test_a_router_run_goes_through_the_proxy(
    openrouter_sim: Any, tinyproxy: StartProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole library behind a proxy: the catalog's GETs, every completion and the
    generation lookups all appear in the proxy's own log."""
    proxy = tinyproxy()
    monkeypatch.setenv("http_proxy", proxy.url)
    ledger = MemoryLedger(Decimal(1))
    async with Router(
        "moonshotai/kimi-k2.5",
        policy=ProviderPolicy(exclude_below="int4"),
        ledger=ledger,
        api_key=DEFAULT_TEST_KEY,
        base_url=openrouter_sim.url,
    ) as router:
        for _ in range(3):
            result = await router.chat([{"role": "user", "content": "hi"}], max_tokens=16)
            assert result.text
    seen = proxy.requests()
    assert seen.count(f"POST {openrouter_sim.url}{CHAT}") == 3
    assert f"GET {openrouter_sim.url}/models/moonshotai/kimi-k2.5/endpoints" in seen
    assert all(line.split(" ", 1)[1].startswith(openrouter_sim.url) for line in seen)
    assert (await ledger.snapshot()).spent > 0


def test_a_tunnel_under_uvloop(tinyproxy: StartProxy, certificate: Path) -> None:
    """The CLI runs on uvloop: CONNECT, then TLS over the tunnel (its own start_tls)."""
    uvloop = pytest.importorskip("uvloop")
    proxy = tinyproxy()
    served, trusted = tls_contexts(certificate)

    async def run() -> None:
        answer = answer_every_request(BODY)
        live: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            live.add(task)
            try:
                await answer(reader, writer)
                await writer.wait_closed()  # the TLS close done before the loop closes
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                live.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]
        url = f"https://127.0.0.1:{port}/api/v1"
        async with server, HttpClient(url, DEFAULT_TEST_KEY, ssl=trusted) as http:
            assert await exchange(http) == ANSWER
            assert await exchange(http) == ANSWER
        # Under load the server's side of the tunnel may still be closing: uvloop then
        # finds an open transport when the loop closes (EBUSY). Wait for it.
        await until(lambda: not live)
        assert proxy.requests() == [f"CONNECT 127.0.0.1:{port}"]

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HTTPS_PROXY", proxy.url)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run())


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ([b"HTTP/1.1 403 Forbidden\r\nContent-Length: 5\r\n\r\nnope!"], "403 Forbidden"),
        ([b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 9000], "too long (over 8,190 bytes"),
        ([b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n", CLOSE], "too long"),
        ([b"HTTP/1.1 200 Conn", CLOSE], "closed the connection at CONNECT"),
        ([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], "refused a tunnel"),
        ([b"HTTP/1.1 200 Connection established\r\n\r\n", CLOSE], "Cannot connect"),
    ],
    ids=[
        "refused",
        "endless-reply",
        "long-reply-in-one-read",
        "cut-reply",
        "not-http",
        "closed-before-tls",
    ],
)
async def test_a_tunnel_that_does_not_open_was_never_sent(
    wire: Serve, monkeypatch: pytest.MonkeyPatch, reply: list[Any], said: str
) -> None:
    """A scripted raw server plays the proxy: whatever goes wrong before the tunnel
    carries TLS, the request was never sent, and the error says what the proxy did."""
    proxy = await wire(reply)
    monkeypatch.setenv("HTTPS_PROXY", f"http://router:{PASSWORD}@127.0.0.1:{proxy.port}")
    async with HttpClient("https://127.0.0.1:9/api/v1", DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
    assert caught.value.request_sent is False
    assert said in str(caught.value)
    assert PASSWORD not in str(caught.value)
    (connect,) = proxy.requests
    assert (connect.method, connect.target) == ("CONNECT", "127.0.0.1:9")
    assert connect.headers["proxy-authorization"].startswith("Basic ")
    assert "authorization" not in connect.headers  # the API key never goes to the proxy
    assert proxy.connections == 1


@pytest.mark.parametrize(
    ("url", "no_proxy", "direct"),
    [
        ("http://127.0.0.1:8000/api/v1", "127.0.0.0/8", True),  # CIDR: requests, httpx, curl
        ("http://10.1.2.3/api/v1", "localhost, 10.0.0.0/8", True),
        ("http://11.1.2.3/api/v1", "10.0.0.0/8", False),
        ("http://[fd00::7]:8000/api/v1", "fd00::/8", True),
        ("http://[::1]:8000/api/v1", "::1", True),
        ("http://localhost:8000/api/v1", "localhost:8000", True),  # host:port, as requests
        ("http://localhost:8000/api/v1", "localhost:9000", False),  # another port
        ("http://localhost:8000/api/v1", "localhost", True),  # a name matches every port
        ("https://api.corp:8443/v1", ".corp", True),
        ("https://openrouter.ai/api/v1", "notopenrouter.ai,10.0.0.0/8,bad/range", False),
        ("https://openrouter.ai/api/v1", "*", True),
    ],
)
def test_no_proxy_entries_match_as_requests_and_httpx_match_them(
    monkeypatch: pytest.MonkeyPatch, url: str, no_proxy: str, direct: bool
) -> None:
    for variable in ("HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(variable, "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert (proxy_for(URL(url)) is None) is direct


def test_an_ipv6_proxy_with_percent_encoded_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials are percent-decoded (as requests and curl decode them) and sent UTF-8;
    the proxy is named with its address in brackets, its credentials never."""
    monkeypatch.setenv("HTTPS_PROXY", "http://us%40er:p%3Ass%2F%C3%A9@[::1]:3128")
    proxy = proxy_for(URL("https://openrouter.ai/api/v1"))
    assert proxy is not None
    assert (proxy.host, proxy.port, proxy.authority) == ("::1", 3128, "[::1]:3128")
    token = base64.b64encode("us@er:p:ss/é".encode()).decode()
    assert proxy.headers() == {"Proxy-Authorization": f"Basic {token}"}
    assert repr(proxy) == "Proxy([::1]:3128, with credentials)"


async def test_a_proxy_silent_after_connect_ends_at_the_connect_timeout_never_sent(
    wire: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await wire([HOLD])  # reads the CONNECT, never answers it
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    async with HttpClient(
        "https://127.0.0.1:9/api/v1", DEFAULT_TEST_KEY, connect_timeout=0.3
    ) as http:
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http)
    assert caught.value.request_sent is False
    assert "no connection within" in str(caught.value)
    (connect,) = proxy.requests
    assert connect.method == "CONNECT"
