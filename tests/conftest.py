"""Shared test set-up: no real network, the reference data, and small helpers."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from provider_router._log import ROOT_LOGGER

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
    # Piped output is as wide as $COLUMNS says: the tests read it at its own width.
    monkeypatch.delenv("COLUMNS", raising=False)
    # A developer's proxy settings never route the tests (which set their own: test_h1_proxy).
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


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
    root = logging.getLogger(ROOT_LOGGER)
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    # The CLI attaches a stderr handler to the package logger: drop it, or a later
    # test would write through it to an already closed capture stream.
    root.handlers[:] = handlers
    root.setLevel(level)


_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class _EventCollector(logging.Handler):
    """Collects the library's events as structlog-style dicts, through stdlib logging."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
        event["event"] = record.getMessage()
        event["log_level"] = record.levelname.lower()
        event["logger"] = record.name
        self.events.append(event)


@pytest.fixture
def log_events() -> Iterator[list[dict[str, Any]]]:
    """Every event the library logs during the test, at every level, as dicts.

    Captured the way an application sees them: a stdlib handler on the package's
    ``provider_router`` logger (the library's loggers ignore ``structlog.configure``,
    so ``structlog.testing.capture_logs`` does not see them).
    """
    root = logging.getLogger(ROOT_LOGGER)
    collector = _EventCollector()
    level = root.level
    root.addHandler(collector)
    root.setLevel(logging.DEBUG)
    try:
        yield collector.events
    finally:
        root.removeHandler(collector)
        root.setLevel(level)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES_DIR
