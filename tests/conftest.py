"""Shared test set-up: no real network, the reference data, and small helpers."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

# The local OpenRouter fixtures: openrouter_sim, openrouter_sim_factory, openrouter_api_key.
pytest_plugins = ["provider_router.testing.pytest_plugin"]

DATA_DIR = Path(__file__).parent / "data"
FIXTURES_DIR = DATA_DIR / "fixtures"
OPENAPI_PATH = DATA_DIR / "openrouter-openapi.yaml"

_real_getaddrinfo = socket.getaddrinfo


def _is_loopback(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def _loopback_only_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _is_loopback(host):
        raise OSError(f"tests may only reach loopback addresses, not {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)


@pytest.fixture(autouse=True)
def _no_real_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse any name resolution that is not loopback: tests never reach the internet."""
    monkeypatch.setattr(socket, "getaddrinfo", _loopback_only_getaddrinfo)
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.delenv("OPENROUTER_BASE_URL", raising=False)


@pytest.fixture(autouse=True)
def _fresh_structlog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI configures structlog; undo it after each test so tests stay independent.

    Loggers cached on first use would keep a finished test's configuration (and
    defeat ``capture_logs``), so caching is turned off under test.
    """
    real_configure = structlog.configure

    def configure_without_cache(**kwargs: Any) -> None:
        kwargs["cache_logger_on_first_use"] = False
        real_configure(**kwargs)

    monkeypatch.setattr(structlog, "configure", configure_without_cache)
    yield
    structlog.reset_defaults()


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES_DIR
