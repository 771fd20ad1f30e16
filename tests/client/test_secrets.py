"""The API key never reaches an exception, a log line, the terminal or a file we write.

A tiny server on loopback plays a hostile OpenRouter: it echoes the key back in
every field of its error bodies and in its headers. Everything the library and
the CLI produce from those answers is then searched for the key.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from _metadata_server import BUNDLED, Canned, serve
from _router_helpers import KIMI, MESSAGES

from provider_router import (
    APIError,
    APIStatusError,
    ProviderPolicy,
    ProviderRouterError,
    Router,
)
from provider_router.cli import main

KEY = "test-secret-key-7f3a9c51"  # not shaped like sk-or-...: only knowing it can scrub it
OR_KEY = "sk-or-v1-0123456789abcdef0123"


def echoing(key: str, status: int) -> Canned:
    """An error answer with the key in every string field, key and header."""
    body = {
        "error": {
            "code": status,
            "message": f"bad key {key}",
            "metadata": {
                "provider_name": f"Provider {key}",
                "raw": json.dumps({"upstream": {"key": key, key: "x"}}),
                "error_type": f"type-{key}",
                "headers": {"X-Echo": key, "Retry-After": "1"},
                "nested": [{"deep": [key]}],
            },
            "error_type": key,
        },
        "user_id": key,
    }
    return Canned(
        status=status,
        body=json.dumps(body).encode(),
        headers={"X-Echo": key, "X-Key-" + key: "1", "Www-Authenticate": f"Bearer {key}"},
    )


def carried(key: str) -> Canned:
    """HTTP 200 whose body carries an error, and a provider name, with the key."""
    body = {
        "id": f"gen-{key}",
        "provider": key,
        "model": KIMI,
        "choices": [
            {
                "index": 0,
                "finish_reason": "error",
                "message": {"role": "assistant", "content": ""},
                "error": {
                    "code": 502,
                    "message": f"upstream said {key}",
                    "metadata": {"provider_name": key, "raw": key},
                },
            }
        ],
    }
    return Canned(body=json.dumps(body).encode())


def everything_in(value: Any, seen: set[int] | None = None) -> str:
    """repr of ``value`` and of everything reachable from its attributes."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return ""
    seen.add(id(value))
    parts = [repr(value), str(value)]
    if isinstance(value, BaseException):
        parts += [everything_in(a, seen) for a in value.args]
        parts.append(everything_in(value.__cause__, seen))
        parts.append(everything_in(value.__context__, seen))
        for group in getattr(value, "exceptions", ()):
            parts.append(everything_in(group, seen))
    for attr in getattr(value, "__dict__", {}).values():
        parts.append(everything_in(attr, seen))
    return "\n".join(parts)


@pytest.mark.parametrize("key", [KEY, OR_KEY])
@pytest.mark.parametrize("status", [400, 401, 402, 429, 502])
async def test_an_echoed_key_is_scrubbed_from_status_errors_and_logs(
    key: str,
    status: int,
    log_events: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    recording_sleep: Any,
) -> None:
    routes = {
        "/models/moonshotai/kimi-k2.5/endpoints": Canned(body=BUNDLED.read_bytes()),
        "/chat/completions": echoing(key, status),
    }
    caplog.set_level(logging.DEBUG, logger="provider_router")
    with serve(routes) as server:
        async with Router(
            KIMI,
            base_url=server.base_url,
            api_key=key,
            policy=ProviderPolicy(exclude_below="int4"),
            sleep=recording_sleep,
        ) as router:
            with pytest.raises(ProviderRouterError) as caught:
                await router.chat(MESSAGES, max_tokens=10)
    exc = caught.value
    errors = [exc, exc.__cause__, *getattr(exc, "exceptions", ())]
    status_errors = [e for e in errors if isinstance(e, APIStatusError)]
    assert status_errors, errors
    for error in status_errors:
        assert error.status == status
        assert error.body is not None
        scrubbed = "sk-or-***" if key.startswith("sk-or-") else "***"
        assert error.body["error"]["metadata"]["nested"] == [{"deep": [scrubbed]}]
        assert error.headers["x-echo"] == scrubbed
    assert key not in everything_in(exc)
    assert log_events
    assert key not in repr(log_events)
    assert key not in caplog.text
    assert key not in repr([vars(r) for r in caplog.records])


async def test_an_echoed_key_is_scrubbed_from_errors_carried_in_a_200(
    log_events: list[dict[str, Any]], recording_sleep: Any
) -> None:
    routes = {
        "/models/moonshotai/kimi-k2.5/endpoints": Canned(body=BUNDLED.read_bytes()),
        "/chat/completions": carried(KEY),
    }
    with serve(routes) as server:
        async with Router(
            KIMI,
            base_url=server.base_url,
            api_key=KEY,
            policy=ProviderPolicy(exclude_below="int4"),
            sleep=recording_sleep,
        ) as router:
            with pytest.raises(ProviderRouterError) as caught:
                await router.chat(MESSAGES, max_tokens=10)
    assert isinstance(caught.value.exceptions[0], APIError)  # type: ignore[attr-defined]
    assert KEY not in everything_in(caught.value)
    assert KEY not in repr(log_events)


@pytest.mark.parametrize("path", ["/key", "/chat/completions"])
def test_the_cli_prints_and_writes_no_echoed_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    # "/key": the preflight reads the echo; "/chat/completions": the run itself does.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"id": "q{i}", "prompt": "hi {i}"}}\n' for i in range(3)))
    out = tmp_path / "out"
    routes = {
        "/models/moonshotai/kimi-k2.5/endpoints": Canned(body=BUNDLED.read_bytes()),
        "/chat/completions": echoing(KEY, 401),
        "/key": echoing(KEY, 401),
        "/credits": echoing(KEY, 401),
    }
    with serve(routes) as server:
        monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
        monkeypatch.setenv("OPENROUTER_BASE_URL", server.base_url)
        args = ["run", str(prompts), "--model", KIMI, "--budget", "1", "--out", str(out)]
        if path != "/key":
            args.append("--no-preflight")
        code = main(["--log-level", "debug", *args])
        hits = server.hits(path)
    captured = capsys.readouterr()
    assert code != 0
    assert hits >= 1  # the hostile answer was really received
    assert KEY not in captured.out
    assert KEY not in captured.err
    assert "***" in captured.out + captured.err  # the echoed text is there, scrubbed
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    if path != "/key":
        assert any(p.name == "summary.json" for p in written)
        assert "***" in (out / "summary.json").read_text()
    for file in written:
        assert KEY.encode() not in file.read_bytes(), file
