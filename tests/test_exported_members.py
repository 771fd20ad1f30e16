"""The public API is flat, explicit and sorted (as httpx checks its own)."""

from __future__ import annotations

import provider_router


def test_all_is_sorted() -> None:
    assert provider_router.__all__ == sorted(provider_router.__all__)


def test_all_is_complete() -> None:
    public = {name for name in dir(provider_router) if not name.startswith("_")}
    public -= {"annotations"}
    # Sub-packages and modules are reachable as attributes once imported; they are
    # not part of the flat API.
    modules = {name for name in public if type(getattr(provider_router, name)).__name__ == "module"}
    assert public - modules == set(provider_router.__all__) - {"__version__"}


def test_every_name_resolves() -> None:
    for name in provider_router.__all__:
        assert getattr(provider_router, name) is not None
