"""``Router(ssl=..., headers=...)`` and ``Catalog(ssl=..., headers=...)``, over real sockets:
a private CA trusted through an ``ssl.SSLContext``, attribution headers on every request,
and the headers the library sets itself refused by name (never by value)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _certificate import certificate_fixture  # noqa: F401  (the certificate fixture)
from _router_helpers import KIMI, MESSAGES, MakeRouter
from _wire_server import ANSWER, Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)

from provider_router import (
    APIConnectionError,
    Catalog,
    ConfigurationError,
    RetryPolicy,
    Router,
    Safeguards,
)
from provider_router._http.session import HttpClient
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from provider_router.testing.loopback import tls_contexts

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
GEMINI = "google/gemini-2.5-pro-preview"
ATTRIBUTION = {"HTTP-Referer": "https://example.org/eagle", "X-OpenRouter-Title": "EAGLE-3 data"}
SECRET = "sk-or-v1-0123456789abcdef-never-shown"


async def fixed_endpoints(sim: SimulatorServer, make_router: MakeRouter) -> Any:
    router = await make_router(sim)
    return await router._plans.catalog.endpoints(KIMI)  # type: ignore[union-attr]


async def test_a_router_sends_attribution_headers_over_a_private_ca(
    wire: Serve, certificate: Path, openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    served, trusted = tls_contexts(certificate)
    server = await wire([answer(ANSWER)], tls=served)
    url = f"https://127.0.0.1:{server.port}/api/v1"
    async with Router(
        KIMI,
        endpoints=await fixed_endpoints(openrouter_sim, make_router),
        api_key=DEFAULT_TEST_KEY,
        base_url=url,
        retry=RetryPolicy(max_attempts=1),
        ssl=trusted,
        headers=ATTRIBUTION,
        # The canned answer bills $0.25 on a hold of cents: taken as it is, not disputed.
        safeguards=Safeguards(cost_sanity_factor=10**12),
    ) as router:
        result = await router.chat(MESSAGES, max_tokens=16)
    assert result.text == "hi"
    (request,) = server.requests
    assert request.headers["http-referer"] == ATTRIBUTION["HTTP-Referer"]
    assert request.headers["x-openrouter-title"] == ATTRIBUTION["X-OpenRouter-Title"]
    assert request.headers["authorization"] == f"Bearer {DEFAULT_TEST_KEY}"  # ours, untouched


async def test_without_the_private_ca_the_handshake_fails_never_sent(
    wire: Serve, certificate: Path, openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    served, _ = tls_contexts(certificate)
    server = await wire([answer(ANSWER)], tls=served)
    async with Router(
        KIMI,
        endpoints=await fixed_endpoints(openrouter_sim, make_router),
        api_key=DEFAULT_TEST_KEY,
        base_url=f"https://127.0.0.1:{server.port}/api/v1",
        retry=RetryPolicy(max_attempts=1),
    ) as router:
        with pytest.raises(APIConnectionError) as caught:
            await router.chat(MESSAGES, max_tokens=16)
    assert caught.value.request_sent is False
    assert server.requests == []


async def test_a_catalog_of_its_own_takes_ssl_and_headers(wire: Serve, certificate: Path) -> None:
    served, trusted = tls_contexts(certificate)
    body = (
        FIXTURES / "endpoints_google-gemini-2.5-pro-preview_2025-05-23_cline-nock.json"
    ).read_bytes()
    server = await wire([answer(body)], tls=served)
    url = f"https://127.0.0.1:{server.port}/api/v1"
    async with Catalog(url, DEFAULT_TEST_KEY, ssl=trusted, headers=ATTRIBUTION) as catalog:
        listing = await catalog.endpoints(GEMINI)
    assert listing.endpoints
    (request,) = server.requests
    assert request.method == "GET"
    assert request.headers["x-openrouter-title"] == ATTRIBUTION["X-OpenRouter-Title"]


OWNED = [
    "Authorization",
    "authorization",
    "Host",
    "Content-Length",
    "Content-Type",
    "Transfer-Encoding",
    "Connection",
    "Proxy-Authorization",
    "Accept-Encoding",
]


@pytest.mark.parametrize("name", OWNED)
def test_a_header_the_library_sets_is_refused_by_name(name: str) -> None:
    builders = [
        lambda: Router(KIMI, headers={name: SECRET}),
        lambda: Catalog(headers={name: SECRET}),
        lambda: HttpClient("http://127.0.0.1:9", headers={name: SECRET}),
    ]
    for build in builders:
        with pytest.raises(ConfigurationError, match=name) as caught:
            build()
        assert SECRET not in str(caught.value)


def test_a_header_value_that_would_break_the_head_is_refused_unseen() -> None:
    with pytest.raises(ConfigurationError, match="X-OpenRouter-Title") as caught:
        Router(KIMI, headers={"X-OpenRouter-Title": f"{SECRET}\r\nX-Injected: 1"})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [" X-Title", "Host:evil", "X Title", "X-Title\t", "", "X-Title\r\nHost", "Tïtle"],
    ids=["leading-space", "colon", "inner-space", "tab", "empty", "line-break", "non-ascii"],
)
def test_a_name_that_is_not_a_header_name_is_refused(name: str) -> None:
    """A leading space makes the line a continuation of the one before (obs-fold) and a
    colon starts the value early: either would smuggle a header the library owns."""
    for build in (
        lambda: Router(KIMI, headers={name: "1"}),
        lambda: HttpClient("http://127.0.0.1:9", headers={name: "1"}),
    ):
        with pytest.raises(ConfigurationError, match="header"):
            build()


def test_a_name_with_a_value_pasted_in_is_refused_unseen() -> None:
    with pytest.raises(ConfigurationError, match="'Authorization' is followed by ':'") as caught:
        Router(KIMI, headers={f"Authorization: Bearer {SECRET}": ""})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("control", ["\x0b", "\x7f", "\x1b", "\0"])
def test_a_header_value_with_a_control_character_is_refused_unseen(control: str) -> None:
    with pytest.raises(ConfigurationError, match="X-OpenRouter-Title") as caught:
        Router(KIMI, headers={"X-OpenRouter-Title": f"{SECRET}{control}"})
    assert SECRET not in str(caught.value)


def test_a_tab_inside_a_header_value_is_allowed() -> None:
    http = HttpClient("http://127.0.0.1:9", headers={"X-OpenRouter-Title": "EAGLE\t3"})
    assert http._headers["X-OpenRouter-Title"] == "EAGLE\t3"


@pytest.mark.parametrize("bad", [False, "/etc/ssl/certs/ca.pem", object()])
def test_ssl_must_be_a_context(bad: Any) -> None:
    for build in (lambda: Router(KIMI, ssl=bad), lambda: Catalog(ssl=bad)):
        with pytest.raises(ConfigurationError, match=r"ssl must be an ssl\.SSLContext"):
            build()


def test_a_catalog_given_a_client_refuses_options_for_its_own() -> None:
    http = HttpClient("http://127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="give them to the HttpClient"):
        Catalog(http=http, headers=ATTRIBUTION)


def test_a_header_given_twice_in_another_case_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="given twice"):
        Router(KIMI, headers={"X-OpenRouter-Title": "a", "x-openrouter-title": "b"})


@pytest.mark.parametrize("name", ["User-Agent", "user-agent", "USER-AGENT"])
async def test_a_user_agent_given_replaces_ours_whatever_its_case(name: str) -> None:
    async with HttpClient("http://127.0.0.1:9", headers={name: "eagle-data/1.0"}) as http:
        head = http._lean().request_head("/chat/completions", "application/json").lower()
    assert head.count(b"user-agent:") == 1
    assert b"user-agent: eagle-data/1.0\r\n" in head
