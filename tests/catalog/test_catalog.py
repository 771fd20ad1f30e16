"""Catalog and the HTTP layer against a real local server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _metadata_server import BUNDLED, Canned, MetadataServer, serve

from provider_router import (
    APIConnectionError,
    AuthenticationError,
    Catalog,
    ConfigurationError,
    DataFileError,
    InvalidResponseError,
    NotFoundError,
    PaymentRequiredError,
    ProviderUnavailableError,
    Quantization,
    RateLimitError,
    RequestTimeout,
)
from provider_router._http.session import HttpClient, error_from_response

KIMI = "moonshotai/kimi-k2.5"
KIMI_PATH = "/models/moonshotai/kimi-k2.5/endpoints"
KEY = "sk-or-v1-" + "ab" * 32
FMT = "provider-router/catalog-snapshot@1"


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    with serve() as running:
        yield running


class FakeTimer:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_fetches_and_parses_the_endpoints_listing(server: MetadataServer) -> None:
    async with Catalog(base_url=server.base_url) as catalog:
        model = await catalog.endpoints(KIMI)
    assert model.id == KIMI
    assert len(model.endpoints) == 11
    fireworks = next(e for e in model.endpoints if e.tag == "fireworks")
    assert fireworks.quantization is Quantization.NVFP4
    _, headers = server.requests[0]
    assert headers["User-Agent"].startswith("provider-router/")
    assert "Authorization" not in headers  # metadata needs no key


async def test_base_url_and_key_come_from_the_environment(
    server: MetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENROUTER_BASE_URL", server.base_url + "/")
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    async with Catalog() as catalog:
        assert catalog.base_url == server.base_url
        await catalog.endpoints(KIMI)
    assert server.requests[0][1]["Authorization"] == f"Bearer {KEY}"


async def test_the_key_never_shows_in_reprs(server: MetadataServer) -> None:
    async with HttpClient(server.base_url, api_key=KEY) as http:
        assert KEY not in repr(http)
        assert "api_key=<set>" in repr(http)
        catalog = Catalog(http=http)
        assert KEY not in repr(catalog)


async def test_answers_are_cached_for_the_ttl_and_refresh_forgets_them(
    server: MetadataServer,
) -> None:
    timer = FakeTimer()
    async with Catalog(base_url=server.base_url, ttl=300, timer=timer) as catalog:
        first = await catalog.endpoints(KIMI)
        assert await catalog.endpoints(KIMI) is first
        assert server.hits(KIMI_PATH) == 1
        timer.now = 299
        await catalog.endpoints(KIMI)
        assert server.hits(KIMI_PATH) == 1
        timer.now = 301
        await catalog.endpoints(KIMI)
        assert server.hits(KIMI_PATH) == 2
        catalog.refresh()
        await catalog.endpoints(KIMI)
        await catalog.endpoints(KIMI, refresh=True)
        assert server.hits(KIMI_PATH) == 4


async def test_models_list(server: MetadataServer) -> None:
    async with Catalog(base_url=server.base_url) as catalog:
        models = await catalog.models()
        assert len(models) == 4
        assert await catalog.models() is models
    assert server.hits("/models") == 1


@pytest.mark.parametrize(
    ("canned", "error", "message"),
    [
        (
            Canned(404, b'{"error":{"code":404,"message":"Resource not found"}}'),
            NotFoundError,
            "HTTP 404: GET .*: Resource not found: no model",
        ),
        (
            Canned(401, b'{"error":{"code":401,"message":"No auth credentials found"}}'),
            AuthenticationError,
            "HTTP 401",
        ),
        (
            Canned(402, b'{"error":{"code":402,"message":"Insufficient credits"}}'),
            PaymentRequiredError,
            "Insufficient credits",
        ),
        (
            Canned(500, b"<html>oops</html>"),
            ProviderUnavailableError,
            "HTTP 500: <html>oops</html>",
        ),
        (Canned(503, b""), ProviderUnavailableError, "HTTP 503: Service Unavailable"),
        (
            Canned(408, b'{"error":{"code":408,"message":"timed out"}}'),
            RequestTimeout,
            "HTTP 408: timed out",
        ),
        (
            Canned(200, b"{not json"),
            InvalidResponseError,
            "expected an endpoints listing, got a body that is not JSON",
        ),
        (
            Canned(200, b""),
            InvalidResponseError,
            "expected an endpoints listing, got an empty body",
        ),
        (
            Canned(200, b'{"data": []}'),
            InvalidResponseError,
            "expected an endpoints listing .* whose 'data' is an array of 0 items",
        ),
        (
            Canned(200, b'{"data": {"id": "x/y", "endpoints": [{"name": 1}]}}'),
            InvalidResponseError,
            r"endpoints\.0\.provider_name: Field required",
        ),
    ],
)
async def test_failures_become_clear_errors(
    server: MetadataServer, canned: Canned, error: type[Exception], message: str
) -> None:
    server.routes[KIMI_PATH] = canned
    async with Catalog(base_url=server.base_url) as catalog:
        with pytest.raises(error, match=message):
            await catalog.endpoints(KIMI)


async def test_rate_limit_carries_retry_after_and_provider(server: MetadataServer) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Provider returned error",
            "metadata": {"provider_name": "Venice", "error_type": "rate_limit_exceeded"},
        }
    }
    server.routes[KIMI_PATH] = Canned(429, json.dumps(body).encode(), {"Retry-After": "17"})
    async with Catalog(base_url=server.base_url) as catalog:
        with pytest.raises(RateLimitError) as caught:
            await catalog.endpoints(KIMI)
    assert caught.value.retry_after == 17.0
    assert caught.value.provider_name == "Venice"
    assert caught.value.error_type == "rate_limit_exceeded"
    assert caught.value.headers["retry-after"] == "17"
    assert str(caught.value) == "HTTP 429 from Venice: Provider returned error"


@pytest.mark.parametrize(
    ("headers", "error", "expected"),
    [
        ({}, {"metadata": {"retry_after_seconds": 12, "retry_after_seconds_raw": 11.5}}, 11.5),
        ({}, {"metadata": {"headers": {"Retry-After": "9"}}}, 9.0),
        ({}, {"availability": {"code": "capacity_exhausted", "retry_after": 30}}, 30.0),
        ({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, {}, None),
        ({"Retry-After": "-3"}, {}, None),
    ],
)
def test_retry_after_sources(
    headers: dict[str, str], error: dict[str, object], expected: float | None
) -> None:
    exc = error_from_response(429, headers, json.dumps({"error": error}).encode())
    assert isinstance(exc, RateLimitError)
    assert exc.retry_after == expected


def test_error_type_on_the_error_itself_and_a_captured_429() -> None:
    exc = error_from_response(
        404, {}, b'{"error":{"error_type":"not_found","message":"No endpoints"}}'
    )
    assert isinstance(exc, NotFoundError)
    assert exc.error_type == "not_found"
    captured = Path(__file__).parents[1] / "data" / "fixtures"
    body = (
        captured / "error_429_kimi-k2-0905_gmicloud_upstream_rate_limited_2025-09.json"
    ).read_bytes()
    upstream = error_from_response(429, {}, body)
    assert upstream.provider_name == "GMICloud"


def test_an_echoed_key_is_redacted_from_messages() -> None:
    exc = error_from_response(401, {}, f'{{"error":{{"message":"bad key {KEY}"}}}}'.encode())
    assert KEY not in str(exc)
    assert "sk-or-***" in str(exc)


async def test_a_refused_connection_is_an_api_connection_error() -> None:
    with serve() as gone:
        url = gone.base_url  # the port is free again once the server stops
    async with Catalog(base_url=url) as catalog:
        with pytest.raises(APIConnectionError, match="connection failed") as caught:
            await catalog.endpoints(KIMI)
    assert caught.value.__cause__ is not None


async def test_a_slow_answer_is_a_request_timeout() -> None:
    writers: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(4096):  # read until the client gives up and hangs up
            pass

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        async with HttpClient(f"http://127.0.0.1:{port}", timeout=0.05) as slow:
            with pytest.raises(
                RequestTimeout, match=r"no complete answer within 0\.05 s"
            ) as caught:
                await slow.get_json("/models")
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.__cause__ is not None
    finally:
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        silent.close()
        await silent.wait_closed()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "ftp://example"}, "base URL must start with http"),
        ({"timeout": 0}, "timeouts must be > 0"),
        ({"limit": -1}, "connection limits must be ≥ 0"),
    ],
)
def test_bad_http_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        HttpClient(**kwargs)  # type: ignore[arg-type]


async def test_bad_model_ids_and_ttl_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="ttl must be > 0"):
        Catalog(ttl=0)
    async with Catalog(base_url="http://127.0.0.1:9") as catalog:
        for bad in ("kimi", "a/b/c", "/x"):
            with pytest.raises(ConfigurationError, match="model id must look like 'author/slug'"):
                await catalog.endpoints(bad)


# --- snapshots ------------------------------------------------------------------------


async def test_snapshot_round_trip_serves_offline(server: MetadataServer, tmp_path: Path) -> None:
    async with Catalog(base_url=server.base_url) as catalog:
        live = await catalog.endpoints(KIMI)
        await catalog.endpoints("google/gemini-2.5-pro-preview")
        await catalog.models()
        path = catalog.save_snapshot(tmp_path / "snap.json")
    saved = json.loads(path.read_text())
    assert saved["format"] == "provider-router/catalog-snapshot@1"
    assert saved["endpoints"][KIMI] == json.loads(BUNDLED.read_bytes())  # the wire body, unchanged
    requests_before = len(server.requests)
    offline = Catalog.load_snapshot(path)
    assert offline.offline
    assert await offline.endpoints(KIMI) == live
    assert len(await offline.models()) == 4
    assert len(server.requests) == requests_before  # never touched the network
    with pytest.raises(NotFoundError, match="has no listing for 'a/b'"):
        await offline.endpoints("a/b")
    # A snapshot of a snapshot holds the same data.
    again = Catalog.load_snapshot(offline.save_snapshot(tmp_path / "again.json"))
    assert await again.endpoints(KIMI) == live


async def test_a_plain_endpoints_response_loads_as_a_snapshot() -> None:
    catalog = Catalog.load_snapshot(BUNDLED)
    model = await catalog.endpoints(KIMI)
    assert model.endpoints[0].tag == "chutes"
    with pytest.raises(NotFoundError, match="has no models list"):
        await catalog.models()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"format": "provider-router/catalog-snapshot@1",\n "endpoints": [}',
            r"bad\.json:2: not valid JSON",
        ),
        ("[1, 2]", r"expected a catalog snapshot .* got an array of 2 items"),
        ('{"format": "other@9"}', r"got format 'other@9'"),
        ('{"data": {"id": "a/b"}}', r"expected an endpoints listing"),
        (
            '{"format": "provider-router/catalog-snapshot@1", "endpoints": []}',
            "'endpoints' must map",
        ),
        (
            json.dumps(
                {"format": FMT, "endpoints": {"a/b": {"data": {"id": "c/d", "endpoints": []}}}}
            ),
            r"endpoints\['a/b'\] holds the listing of 'c/d'",
        ),
        (
            f'{{"format": "{FMT}", "endpoints": {{}}, "models": {{"data": 3}}}}',
            "models: expected a models list",
        ),
    ],
)
def test_bad_snapshots_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataFileError, match=message) as caught:
        Catalog.load_snapshot(path)
    assert str(caught.value).startswith(str(path))


def test_missing_and_unwritable_snapshot_files(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="cannot read snapshot"):
        Catalog.load_snapshot(tmp_path / "missing.json")
    with pytest.raises(DataFileError, match="cannot write snapshot"):
        Catalog.load_snapshot(BUNDLED).save_snapshot(tmp_path / "no" / "such" / "dir.json")
