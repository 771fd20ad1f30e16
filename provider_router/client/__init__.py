"""The routed, budgeted client and one request's life.

:class:`Router` (its options and one attempt), billing against the ledger,
retries, the adaptive limiter, provider health, cache affinity and metrics.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from provider_router.client.router import ChatStream, Router

__all__ = ["ChatStream", "Router"]


def __getattr__(name: str) -> _typing.Any:
    # Lazy: importing a result type never loads the Router and its transport.
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module("provider_router.client.router"), name)
