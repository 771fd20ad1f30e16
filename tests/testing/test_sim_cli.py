"""``provider-router simulate``."""

from __future__ import annotations

import asyncio
import io

import aiohttp
import pytest

from provider_router.cli import build_parser, main
from provider_router.cli.simulate import serve
from provider_router.testing import SimulatorServer
from provider_router.testing.app import ROUTES


async def test_simulate_serves_until_stopped_and_says_it_accepts_any_key() -> None:
    argv = ["simulate", "--port", "0", "--speed", "inf", "--credits", "5", "--seed", "3"]
    args = build_parser().parse_args(argv)
    out = io.StringIO()
    stop = asyncio.Event()
    started = asyncio.Event()
    urls: list[str] = []

    def on_ready(sim: SimulatorServer) -> None:
        urls.append(sim.url)
        started.set()

    task = asyncio.create_task(serve(args, stop, out=out, on_ready=on_ready))
    await started.wait()
    headers = {"Authorization": "Bearer anything-goes"}
    body = {
        "model": "moonshotai/kimi-k2.5",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(urls[0] + "/chat/completions", json=body) as response,
    ):
        assert response.status == 200
    stop.set()
    assert await task == 0
    text = out.getvalue()
    assert urls[0] in text
    assert "ANY non-empty API key" in text
    assert "credits: $5" in text


async def test_simulate_with_keys_does_not_print_them() -> None:
    args = build_parser().parse_args(["simulate", "--port", "0", "--api-key", "sk-secret-1"])
    out = io.StringIO()
    stop = asyncio.Event()
    stop.set()
    assert await serve(args, stop, out=out) == 0
    assert "accepting 1 API key" in out.getvalue()
    assert "sk-secret-1" not in out.getvalue()


def test_simulate_reports_a_bad_market_file(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--port", "0", "--market", "/nonexistent/market.yaml"]) == 1
    assert "/nonexistent/market.yaml: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--speed", "0"], ["--speed", "fast"], ["--credits", "lots"]])
def test_simulate_rejects_bad_options(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", *argv])


def test_simulate_help_lists_every_route_it_serves(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    for method, path, _ in ROUTES:
        assert f"{method} {path}" in text
    for path in ("/models/count", "/model/{author}/{slug}", "/providers", "/key", "/credits"):
        assert path in text


async def test_every_listed_route_is_served(openrouter_sim: SimulatorServer) -> None:
    """No route in the help is a 404 of the router (a 401/400/404 *body* is an answer)."""
    examples = {"{author}": "moonshotai", "{slug}": "kimi-k2.5"}
    async with aiohttp.ClientSession() as session:
        for method, path, _ in ROUTES:
            url = openrouter_sim.url + path
            for placeholder, value in examples.items():
                url = url.replace(placeholder, value)
            async with session.request(method, url, json={}) as response:
                assert response.content_type == "application/json", (method, path)
