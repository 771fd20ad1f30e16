"""Live tests: the real OpenRouter, only with ``OPENROUTER_LIVE=1`` and a real key.

They replace the suite's loopback-only guard (this directory's ``_no_real_network``)
and keep ``OPENROUTER_API_KEY``; everywhere else the guard holds. Each test spends at
most a few cents. Run them with::

    OPENROUTER_LIVE=1 OPENROUTER_API_KEY=sk-or-... .venv/bin/pytest -m live tests/live
"""

from __future__ import annotations

import os

import pytest

LIVE = os.environ.get("OPENROUTER_LIVE") == "1" and bool(os.environ.get("OPENROUTER_API_KEY"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="live: set OPENROUTER_LIVE=1 and OPENROUTER_API_KEY")
    for item in items:
        if "live" in item.keywords and not LIVE:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_real_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live tests reach openrouter.ai; only OPENROUTER_BASE_URL is cleared (the real API)."""
    monkeypatch.delenv("OPENROUTER_BASE_URL", raising=False)
